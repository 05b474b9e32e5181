// Shared pieces of the matmul harnesses (bench_gemv.cu, bench_gemm.cu): random GGML weights,
// the CPU reference, device buffers, graph-based timing and the Llama shapes.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "core/error.h"
#include "core/f16.h"
#include "quant/quant.h"
#include "quant/types.h"

namespace bench {

using nt::GgmlType;

struct Rng {  // splitmix64: fast enough to fill gigabytes
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return float(next() >> 40) * (1.f / 16777216.f); }  // [0, 1)
    float normal() {                                                      // Box-Muller
        const float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
        return std::sqrt(-2.f * std::log(u1)) * std::cos(6.2831853f * u2);
    }
};

// Offsets of the f16 scale fields (d, dmin, m) inside each block: random bytes there could be
// NaN or huge, so they get finite values.
inline std::vector<int> scale_offsets(GgmlType t) {
    std::vector<int> v;
    for (int o : {nt::block_scales(t).d, nt::block_scales(t).min})
        if (o >= 0) v.push_back(o);
    return v;
}

// rows x cols weights of type t: random quant bytes, finite scales of either sign, or random
// normal floats for F32/F16/BF16.
inline std::vector<uint8_t> random_weights(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
    const size_t bytes = size_t(rows) * nt::row_bytes(t, cols);
    std::vector<uint8_t> w(bytes);
    Rng rng(seed);
    if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
        const size_t count = size_t(rows) * size_t(cols);
        for (size_t i = 0; i < count; ++i) {
            const float v = rng.normal() * 0.05f;
            if (t == GgmlType::F32)
                std::memcpy(&w[4 * i], &v, 4);
            else {
                const uint16_t h = t == GgmlType::F16 ? nt::f32_to_f16(v) : nt::f32_to_bf16(v);
                std::memcpy(&w[2 * i], &h, 2);
            }
        }
        return w;
    }
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        const uint64_t r = rng.next();
        std::memcpy(&w[i], &r, 8);
    }
    for (size_t i = bytes & ~size_t(7); i < bytes; ++i) w[i] = uint8_t(rng.next());
    const auto& tr = nt::traits(t);
    const size_t nblocks = bytes / tr.block_bytes;
    for (size_t b = 0; b < nblocks; ++b)
        for (int off : scale_offsets(t)) {
            const float v = (rng.uniform() * 2.f - 1.f) * 0.01f;
            const uint16_t h = nt::f32_to_f16(v);
            std::memcpy(&w[b * tr.block_bytes + off], &h, 2);
        }
    return w;
}

inline std::vector<float> random_activations(int n, int64_t cols, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> x(size_t(n) * cols);
    for (auto& v : x) v = rng.normal();
    return x;
}

// Rounds every element through FP16 or BF16 (what the GEMM path feeds the tensor cores).
inline std::vector<float> round_f16(std::vector<float> v) {
    for (auto& f : v) f = nt::f16_to_f32(nt::f32_to_f16(f));
    return v;
}
inline std::vector<float> round_bf16(std::vector<float> v) {
    for (auto& f : v) f = nt::bf16_to_f32(nt::f32_to_bf16(f));
    return v;
}

// x as the GEMM path feeds quantized weights to the tensor cores: each row quantized to the
// weight's vec_dot_type (the CPU's 8-bit grid), then q * d rounded to FP16.
inline std::vector<float> round_q8_f16(GgmlType t, std::vector<float> x, int n, int64_t cols) {
    const GgmlType at = nt::vec_dot_type(t);
    std::vector<uint8_t> act(nt::row_bytes(at, cols));
    for (int i = 0; i < n; ++i) {
        float* xi = x.data() + size_t(i) * cols;
        nt::quantize_row(at, xi, act.data(), cols);
        nt::dequantize_row(at, act.data(), xi, cols);
    }
    return round_f16(std::move(x));
}

// Reference y[i][r] (double) and sum |w * x| for the listed rows.
struct Reference {
    std::vector<int64_t> rows;   // which rows
    std::vector<double> y, mag;  // [i][k] for i < n, k < rows.size()
};
inline Reference reference(GgmlType t, const std::vector<uint8_t>& w, int64_t cols,
                           const std::vector<float>& x, int n, const std::vector<int64_t>& rows,
                           bool weights_through_f16) {
    Reference ref;
    ref.rows = rows;
    ref.y.assign(size_t(n) * rows.size(), 0.0);
    ref.mag.assign(size_t(n) * rows.size(), 0.0);
    const size_t rb = nt::row_bytes(t, cols);
    std::vector<float> wr(cols);
    for (size_t k = 0; k < rows.size(); ++k) {
        nt::dequantize_row(t, w.data() + size_t(rows[k]) * rb, wr.data(), cols);
        if (weights_through_f16)
            for (auto& f : wr) f = nt::f16_to_f32(nt::f32_to_f16(f));
        for (int i = 0; i < n; ++i) {
            double s = 0, m = 0;
            const float* xi = x.data() + size_t(i) * cols;
            for (int64_t c = 0; c < cols; ++c) {
                const double p = double(wr[c]) * double(xi[c]);
                s += p;
                m += std::fabs(p);
            }
            ref.y[size_t(i) * rows.size() + k] = s;
            ref.mag[size_t(i) * rows.size() + k] = m;
        }
    }
    return ref;
}

// The quantized GEMV's reference: the CPU backend's own product, nt::vec_dot on activations
// quantized by nt::quantize_row to the weight's vec_dot_type (the GPU quantizes the same way,
// so only float summation order differs). mag: sum |w * x| of the unrounded activations.
inline Reference cpu_gemv_reference(GgmlType t, const std::vector<uint8_t>& w, int64_t cols,
                                    const std::vector<float>& x, int n,
                                    const std::vector<int64_t>& rows) {
    Reference ref = reference(t, w, cols, x, n, rows, false);
    const GgmlType at = nt::vec_dot_type(t);
    const size_t ab = nt::row_bytes(at, cols), rb = nt::row_bytes(t, cols);
    std::vector<uint8_t> act(size_t(n) * ab);
    for (int i = 0; i < n; ++i)
        nt::quantize_row(at, x.data() + size_t(i) * cols, act.data() + size_t(i) * ab, cols);
    for (size_t k = 0; k < rows.size(); ++k)
        for (int i = 0; i < n; ++i)
            ref.y[size_t(i) * rows.size() + k] =
                nt::vec_dot(t, cols, w.data() + size_t(rows[k]) * rb, act.data() + size_t(i) * ab);
    return ref;
}

// Up to `count` rows spread over 0..rows-1, always with the first and the last.
inline std::vector<int64_t> sample_rows(int64_t rows, int count) {
    std::vector<int64_t> r;
    if (rows <= count) {
        for (int64_t i = 0; i < rows; ++i) r.push_back(i);
        return r;
    }
    for (int i = 0; i < count; ++i)
        r.push_back(int64_t(double(i) * double(rows - 1) / double(count - 1)));
    return r;
}

// Largest |y - ref| / sum|w*x| over the sampled rows (y is the full [n][rows] output).
inline double max_rel_error(const Reference& ref, const std::vector<float>& y, int n,
                            int64_t rows) {
    double worst = 0;
    for (int i = 0; i < n; ++i)
        for (size_t k = 0; k < ref.rows.size(); ++k) {
            const double e = std::fabs(double(y[size_t(i) * rows + ref.rows[k]]) -
                                       ref.y[i * ref.rows.size() + k]);
            const double m = ref.mag[i * ref.rows.size() + k];
            worst = std::max(worst, m > 0 ? e / m : e);
        }
    return worst;
}

template <class T>
struct DeviceBuffer {
    T* p = nullptr;
    size_t count = 0;
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t n) : count(n) {
        NT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), count(o.count) { o.p = nullptr; }
    ~DeviceBuffer() {
        if (p) cudaFree(p);
    }
    void upload(const T* h, size_t n) {
        NT_CUDA_CHECK(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice), "upload");
    }
    std::vector<T> download(size_t n) const {
        std::vector<T> h(n);
        NT_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
        return h;
    }
};

// Average microseconds per call of `launch(i)` (i cycles over calls), measured by replaying a
// CUDA graph of `per_graph` calls `reps` times after one warm-up replay. Graphs remove the
// host launch cost, as in the engine's decode loop.
template <class F>
double time_graph_us(cudaStream_t stream, int per_graph, int reps, F&& launch) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    NT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                  "begin capture");
    for (int i = 0; i < per_graph; ++i) launch(i);
    NT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), "end capture");
    NT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
    NT_CUDA_CHECK(cudaGraphLaunch(exec, stream), "graph launch");
    cudaEvent_t a, b;
    NT_CUDA_CHECK(cudaEventCreate(&a), "event");
    NT_CUDA_CHECK(cudaEventCreate(&b), "event");
    NT_CUDA_CHECK(cudaEventRecord(a, stream), "event record");
    for (int r = 0; r < reps; ++r) NT_CUDA_CHECK(cudaGraphLaunch(exec, stream), "graph launch");
    NT_CUDA_CHECK(cudaEventRecord(b, stream), "event record");
    NT_CUDA_CHECK(cudaEventSynchronize(b), "event sync");
    float ms = 0;
    NT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b), "elapsed");
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return double(ms) * 1000.0 / (double(per_graph) * reps);
}

// Plain stream timing (for work that cannot be captured or is long enough not to care).
template <class F>
double time_stream_us(cudaStream_t stream, int iters, F&& launch) {
    launch(0);
    cudaEvent_t a, b;
    NT_CUDA_CHECK(cudaEventCreate(&a), "event");
    NT_CUDA_CHECK(cudaEventCreate(&b), "event");
    NT_CUDA_CHECK(cudaEventRecord(a, stream), "event record");
    for (int i = 0; i < iters; ++i) launch(i);
    NT_CUDA_CHECK(cudaEventRecord(b, stream), "event record");
    NT_CUDA_CHECK(cudaEventSynchronize(b), "event sync");
    float ms = 0;
    NT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b), "elapsed");
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return double(ms) * 1000.0 / iters;
}

struct Shape {
    const char* name;
    int64_t rows, cols;
};
inline std::vector<Shape> shapes_named(const std::string& which) {
    std::vector<Shape> s;
    auto add8b = [&] {
        s.push_back({"8b.attn_q", 4096, 4096});
        s.push_back({"8b.attn_k", 1024, 4096});
        s.push_back({"8b.ffn_up", 14336, 4096});
        s.push_back({"8b.ffn_down", 4096, 14336});
        s.push_back({"8b.output", 128256, 4096});
    };
    auto add70b = [&] {
        s.push_back({"70b.attn_q", 8192, 8192});
        s.push_back({"70b.attn_k", 1024, 8192});
        s.push_back({"70b.ffn_up", 28672, 8192});
        s.push_back({"70b.ffn_down", 8192, 28672});
    };
    auto addsmall = [&] {
        s.push_back({"small.1536x576", 1536, 576});
        s.push_back({"small.576x1536", 576, 1536});
    };
    if (which == "8b" || which == "all") add8b();
    if (which == "70b" || which == "all") add70b();
    if (which == "small" || which == "all") addsmall();
    if (s.empty()) {  // ROWSxCOLS
        long long r = 0, c = 0;
        if (std::sscanf(which.c_str(), "%lldx%lld", &r, &c) != 2 || r <= 0 || c <= 0)
            nt::fail("unknown shape '%s': use 8b, 70b, small, all or ROWSxCOLS.", which.c_str());
        s.push_back({"custom", r, c});
    }
    return s;
}

inline std::vector<std::string> split(const std::string& s, char sep = ',') {
    std::vector<std::string> out;
    size_t p = 0;
    while (p <= s.size()) {
        const size_t q = s.find(sep, p);
        out.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
        if (q == std::string::npos) break;
        p = q + 1;
    }
    return out;
}

inline GgmlType type_from_name(const std::string& name) {
    for (uint32_t id = 0; id < 40; ++id) {
        const nt::TypeTraits* tr = nt::type_traits(id);
        if (tr && name == tr->name) return GgmlType(id);
    }
    nt::fail("unknown type '%s' (use ggml names: q4_K, q8_0, f16, ...).", name.c_str());
}

inline void print_device(double hbm_gbs) {
    cudaDeviceProp p;
    NT_CUDA_CHECK(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    std::printf("# device: %s, %d SMs, L2 %d MB, sm_%d%d; HBM ceiling used for %%: %.0f GB/s\n",
                p.name, p.multiProcessorCount, p.l2CacheSize >> 20, p.major, p.minor, hbm_gbs);
}

}  // namespace bench
