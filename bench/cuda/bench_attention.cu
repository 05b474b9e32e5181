// Attention kernels on their own: correctness against a double-precision CPU reference on random
// data, then timing. Decode (one query row per sequence, split-K over the context) reports the
// GB/s of KV cache it must read against the measured HBM read bandwidth; prefill (a prompt of
// one sequence, causal) reports TFLOP/s against a matrix-rate ceiling.
//
//   bench_attention [--hd 128] [--heads 32] [--kv-heads 8] [--iters 50] [--peak-tflops 790]
//                   [--fp32-tops X]
//                   [--ctx N] [--rows N]   (decode at that context / row count only, no prefill)
//
// The fused-rope decode (one row, as a decode step launches it) is timed twice: launched again
// and again (its code cached on the multiprocessors), and after a kernel whose code evicts it
// from their instruction caches (as in a decode step, where other kernels ran in between).
//
// Versions: decode v1 = generic kernel (a warp per position), v2 = tiled (cp.async double-
// buffered K/V tiles, all heads of a GQA group per block); prefill v1 = the decode kernel run
// on every row, v2 = flash attention on tensor cores (mma.sync m16n8k16), v3 = the prefill
// kernel with the CPU's arithmetic (float chains; checked bit for bit against v1, which has the
// same arithmetic; its ceiling is the FP32 pipe, one multiply and one add a multiply-add: it
// reports the percent of --fp32-tops, the SMs' 128 lanes a clock at the boost clock).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops.cuh"
#include "core/error.h"
#include "core/f16.h"
#include "matmul_harness.h"

using namespace nt;
using namespace nt::cuda;

namespace {

struct Opts {
    int hd = 128, heads = 32, kv_heads = 8, iters = 50;
    int ctx = 0, rows = 0;  // decode: only this context / row count (0: the whole sweep)
    bool decode_only = false;
    double peak_tflops = 790;  // bf16/fp16 dense matrix rate measured on the H200 (cuBLAS)
    double fp32_tops = 0;      // FP32 operations a second, 0: sm_count * 128 * boost clock
};

template <class T>
T* dev_alloc(size_t n) {
    void* p = nullptr;
    NT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    return static_cast<T*>(p);
}
template <class T>
T* dev_zeros(size_t n) {
    T* p = dev_alloc<T>(n);
    NT_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T)), "cudaMemset");
    return p;
}
template <class T>
T* dev_copy(const std::vector<T>& v) {
    T* p = dev_alloc<T>(v.size());
    NT_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                  "cudaMemcpy");
    return p;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// A KV cache of n_seq sequences x n_ctx positions with random F16 contents, on both sides.
struct Cache {
    AttnShape s;
    int n_seq;
    std::vector<uint16_t> hk, hv;
    __half *k = nullptr, *v = nullptr;
    Cache(const AttnShape& shape, int n_seq_) : s(shape), n_seq(n_seq_) {
        const size_t n = size_t(n_seq) * s.n_ctx * s.kv_dim();
        hk.resize(n);
        hv.resize(n);
        // Gigabytes of it: draw from a table of uniform [-1, 1) halves with a cheap generator.
        std::vector<uint16_t> table(65536);
        std::mt19937 rng(42);
        std::uniform_real_distribution<float> d(-1.f, 1.f);
        for (uint16_t& t : table) t = f32_to_f16(d(rng));
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            hk[i] = table[x & 0xffff];
            hv[i] = table[(x >> 16) & 0xffff];
        }
        k = dev_alloc<__half>(n);
        v = dev_alloc<__half>(n);
        NT_CUDA_CHECK(cudaMemcpy(k, hk.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
        NT_CUDA_CHECK(cudaMemcpy(v, hv.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    Cache(const Cache&) = delete;
    Cache& operator=(const Cache&) = delete;
    ~Cache() {
        cudaFree(k);
        cudaFree(v);
    }
    // Causal attention of one row (all heads) at position pos of sequence seq, in double.
    std::vector<double> reference(const float* q, int seq, int pos) const {
        const int hd = s.head_dim, G = s.group();
        std::vector<double> out(size_t(s.n_head) * hd), w(size_t(pos) + 1);
        for (int h = 0; h < s.n_head; h++) {
            const size_t col = size_t(h / G) * hd;
            double mx = -1e300;
            for (int p = 0; p <= pos; p++) {
                const uint16_t* kr = &hk[(size_t(seq) * s.n_ctx + p) * s.kv_dim() + col];
                double d = 0;
                for (int j = 0; j < hd; j++) d += double(q[h * hd + j]) * f16_to_f32(kr[j]);
                w[size_t(p)] = d / std::sqrt(double(hd));
                mx = std::max(mx, w[size_t(p)]);
            }
            double sum = 0;
            for (int p = 0; p <= pos; p++) sum += (w[size_t(p)] = std::exp(w[size_t(p)] - mx));
            for (int j = 0; j < hd; j++) {
                double a = 0;
                for (int p = 0; p <= pos; p++)
                    a += w[size_t(p)] *
                         f16_to_f32(hv[(size_t(seq) * s.n_ctx + p) * s.kv_dim() + col + j]);
                out[size_t(h * hd + j)] = a / sum;
            }
        }
        return out;
    }
};

double max_error(const std::vector<float>& got, size_t row, int q_dim,
                 const std::vector<double>& want) {
    double e = 0;
    for (int j = 0; j < q_dim; j++) {
        const double d = std::fabs(double(got[row * q_dim + j]) - want[size_t(j)]);
        e = std::isnan(d) ? INFINITY : std::max(e, d);
    }
    return e;
}

double measure_hbm(int sm_count) {
    const size_t bytes = size_t(1) << 30;
    void* buf = nullptr;
    uint32_t* sink = dev_alloc<uint32_t>(size_t(sm_count) * 4);
    NT_CUDA_CHECK(cudaMalloc(&buf, bytes), "cudaMalloc");
    NT_CUDA_CHECK(cudaMemset(buf, 1, bytes), "cudaMemset");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double best = 0;
    for (int r = 0; r < 6; r++) {
        cudaEventRecord(e0);
        read_bandwidth_kernel(buf, bytes, sink, sm_count * 4, nullptr);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0) best = std::max(best, double(bytes) / (ms * 1e-3) / 1e9);
    }
    cudaFree(buf);
    cudaFree(sink);
    return best;
}

template <class F>
double time_us(int iters, F&& launch) {
    launch(0);  // warm-up
    NT_CUDA_CHECK(cudaDeviceSynchronize(), "warm-up");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < iters; i++) launch(i);
    cudaEventRecord(e1);
    NT_CUDA_CHECK(cudaEventSynchronize(e1), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return double(ms) * 1e3 / iters;
}

// About 200 KB of straight-line code (12288 rounds of an xor and an add with immediates of
// their own, which the compiler cannot fold; its SASS on sm_90 is one 196 KB pass), run by one
// warp on every multiprocessor: afterwards no instruction of the kernel timed next is in a
// multiprocessor's instruction caches, as in a decode step, where six other kernels of 11-59 KB
// of code each ran there since the attention did. Its code is still in L2, as a decode step's
// is (the weights stream with the evict-first policy).
// Without kUnroll it is its own control: the same rounds in a loop of a few instructions, so that
// the kernel timed after it has its code cached but follows a kernel just the same (no overlap with
// the launch before, as a back-to-back run of the attention has).
constexpr int kFlushRounds = 12288;
template <bool kUnroll>
__global__ void icache_flush_kernel(uint32_t* sink, uint32_t seed) {
    uint32_t u = seed + threadIdx.x;
#pragma unroll(kUnroll ? kFlushRounds : 1)
    for (int i = 0; i < kFlushRounds; ++i) u = (u ^ (0x9e3779b9u * uint32_t(i + 1))) + uint32_t(i);
    if (u == 0x12345678u) *sink = u;  // the chain is live; practically never stored
}

// Decode: `rows` sequences, each one query row at position ctx - 1. Sequences rotate across
// iterations so that the KV read comes from HBM, not L2.
void bench_decode(const Opts& o, const CudaDeviceInfo& dev, double hbm) {
    std::printf(
        "\n== decode: %d heads / %d KV heads, head_dim %d (KV bytes that must be read; ceiling "
        "%.0f GB/s)\n",
        o.heads, o.kv_heads, o.hd, hbm);
    std::printf("%6s %5s %6s | %-9s %9s %9s %7s | %9s %9s | %s\n", "ctx", "rows", "splits",
                "version", "us", "GB/s", "of HBM", "graph us", "1 slice", "max err");
    cudaStream_t stream;
    NT_CUDA_CHECK(cudaStreamCreate(&stream), "stream");
    const int n_ctx = 8192;
    for (int rows : {1, 4, 32}) {
        if (o.rows && rows != o.rows) continue;
        AttnShape s{o.heads, o.kv_heads, o.hd, n_ctx};
        const size_t seq_bytes = size_t(n_ctx) * s.kv_dim() * 2 * sizeof(__half);
        // Enough sequences that one rotation is 4x the L2, at least `rows` of them per slot.
        const int slots = int(std::max<size_t>(1, (4 * dev.l2_bytes) / (seq_bytes * rows) + 1));
        const int n_seq = std::min(rows * slots, 256);
        const int n_slots = n_seq / rows;
        Cache cache(s, n_seq);
        const std::vector<float> q = random_floats(size_t(rows) * s.q_dim(), 7, -3.f, 3.f);
        float* dq = dev_copy(q);
        float* dout = dev_alloc<float>(q.size());
        std::vector<int32_t> rows_v(static_cast<size_t>(rows)), seq_all(static_cast<size_t>(n_seq));
        for (int r = 0; r < rows; r++) rows_v[size_t(r)] = r;
        for (int i = 0; i < n_seq; i++) seq_all[size_t(i)] = i;
        int32_t* drows = dev_copy(rows_v);
        int32_t* dseq = dev_copy(seq_all);
        for (int ctx : {8, 64, 128, 512, 1024, 2048, 4096, 8192}) {
            if (o.ctx && ctx != o.ctx) continue;
            int32_t* dpos = dev_copy(std::vector<int32_t>(size_t(rows), ctx - 1));
            const int splits = attn_decode_splits(s, rows, dev.sm_count);
            float* scratch = dev_alloc<float>(attn_decode_scratch_floats(s, rows, splits));
            int* done = dev_zeros<int>(size_t(rows) * s.n_head_kv);
            const double bytes = double(rows) * ctx * s.kv_dim() * 2 * sizeof(__half);
            for (int version : {1, 2, 3}) {
                if (version >= 2 && !attn_has_fast_decode(s)) continue;
                auto launch_with = [&](int i, int n_splits, bool pdl) {
                    attn_decode(s, dq, cache.k, cache.v, dpos, dseq + (i % n_slots) * rows, drows,
                                rows, n_splits, scratch, done, dout, stream, version, nullptr, pdl);
                };
                auto launch = [&](int i) { launch_with(i, splits, false); };
                launch(0);
                std::vector<float> out(q.size());
                NT_CUDA_CHECK(cudaMemcpy(out.data(), dout, out.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost),
                              "cudaMemcpy");
                double err = 0;
                for (int r : {0, rows - 1})
                    err = std::max(
                        err, max_error(out, size_t(r), s.q_dim(),
                                       cache.reference(&q[size_t(r) * s.q_dim()], r, ctx - 1)));
                const double us = time_us(o.iters, launch);
                const double gbs = bytes / (us * 1e-6) / 1e9;
                // As in a decode step: inside a CUDA graph, the tiled kernel a programmatic
                // dependent launch; then with the whole context in one slice (one block per
                // KV head), which short contexts use anyway: the other blocks exit at once.
                const bool pdl = version >= 2;
                const double g_us =
                    bench::time_graph_us(stream, 20, std::max(1, o.iters / 20),
                                         [&](int i) { launch_with(i, splits, pdl); });
                const double g1_us =
                    ctx <= 512 ? bench::time_graph_us(stream, 20, std::max(1, o.iters / 20),
                                                      [&](int i) { launch_with(i, 1, pdl); })
                               : 0.0;
                std::printf("%6d %5d %6d | v%d %-6s %9.1f %9.0f %6.0f%% | %9.1f %9.1f | %.1e%s\n",
                            ctx, rows, splits, version,
                            version == 1   ? "generic"
                            : version == 2 ? "tiled"
                                           : "wide",
                            us, gbs, 100 * gbs / hbm, g_us, g1_us, err,
                            err > 2e-5 ? "  <-- WRONG" : "");
            }
            cudaFree(dpos);
            cudaFree(scratch);
            cudaFree(done);
        }
        if (rows == 1 && attn_decode_fuses_rope(s, rows)) {
            // A decode step's own launch: the kernel also turns q and k and stores the newest
            // position (the cache cells it writes are the reference's no longer: timing only,
            // after the checks; the test suite checks this path against the CPU).
            float* kn = dev_copy(random_floats(size_t(s.kv_dim()), 11, -1.f, 1.f));
            float* vn = dev_copy(random_floats(size_t(s.kv_dim()), 12, -1.f, 1.f));
            std::vector<float> freq(size_t(s.head_dim / 2));
            for (size_t j = 0; j < freq.size(); j++)
                freq[j] = std::pow(500000.f, -2.f * float(j) / float(s.head_dim));
            float* dfreq = dev_copy(freq);
            const RopeIn rope{kn, vn, dfreq};
            // One launch a graph node (with `before` ahead of it, timed alone and taken off) at
            // ctx positions.
            const int reps = std::max(1, o.iters / 20);
            auto rope_us = [&](int ctx, int version, auto&& before) {
                int32_t* dpos = dev_copy(std::vector<int32_t>(1, ctx - 1));
                const int splits = attn_decode_splits(s, rows, dev.sm_count);
                float* scratch = dev_alloc<float>(attn_decode_scratch_floats(s, rows, splits));
                int* done = dev_zeros<int>(size_t(s.n_head_kv));
                const double us = bench::time_graph_us(stream, 20, reps, [&](int i) {
                    before();
                    attn_decode(s, dq, cache.k, cache.v, dpos, dseq + (i % n_slots), drows, 1,
                                splits, scratch, done, dout, stream, version, nullptr, true, &rope);
                });
                cudaFree(dpos);
                cudaFree(scratch);
                cudaFree(done);
                return us;
            };
            for (int version : {2, 3}) {
                std::printf("rope fused (one row, %s form), graph us:",
                            version == 2 ? "full" : "wide");
                for (int ctx : {8, 64, 128, 256, 512, 1024, 4096})
                    if (!o.ctx || ctx == o.ctx)
                        std::printf("  %d: %.1f", ctx, rope_us(ctx, version, [] {}));
                std::printf("\n");
            }
            // The wide form as a decode step runs it: after other kernels' code has filled the
            // multiprocessors' instruction caches. Each attention follows a flush kernel; its
            // time is the pair's less the flush's alone. After the control (the same work in a
            // loop of a few instructions) the attention's code stays cached: cold less control
            // is what its code costs it.
            uint32_t* sink = dev_zeros<uint32_t>(1);
            for (bool cold : {true, false}) {
                auto* kernel = cold ? icache_flush_kernel<true> : icache_flush_kernel<false>;
                auto flush = [&] {
                    kernel<<<dev.sm_count, 32, 0, stream>>>(sink, 1);
                    NT_CUDA_CHECK(cudaGetLastError(), "icache_flush_kernel");
                };
                const double flush_us =
                    bench::time_graph_us(stream, 20, reps, [&](int) { flush(); });
                std::printf(
                    "rope fused (one row, wide form), after a kernel, instruction caches "
                    "%s, graph us:",
                    cold ? "cold" : "warm (control)");
                for (int ctx : {8, 64, 128, 512})
                    if (!o.ctx || ctx == o.ctx)
                        std::printf("  %d: %.1f", ctx, rope_us(ctx, 3, flush) - flush_us);
                std::printf("  (the kernel before alone %.1f)\n", flush_us);
            }
            cudaFree(sink);
            cudaFree(kn);
            cudaFree(vn);
            cudaFree(dfreq);
        }
        cudaFree(dq);
        cudaFree(dout);
        cudaFree(drows);
        cudaFree(dseq);
    }
    cudaStreamDestroy(stream);
}

// Prefill: a prompt of n tokens of one sequence (positions 0..n-1), causal.
void bench_prefill(const Opts& o, const CudaDeviceInfo& dev) {
    double fp32_tops = o.fp32_tops;
    if (fp32_tops <= 0) {
        int khz = 0;
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev.device),
                      "cudaDeviceGetAttribute");
        fp32_tops = double(dev.sm_count) * 128.0 * khz * 1e3 / 1e12;
    }
    std::printf(
        "\n== prefill: %d heads / %d KV heads, head_dim %d (causal FLOPs; ceilings %.0f TFLOP/s, "
        "exact: FP32 %.1f Tops/s)\n",
        o.heads, o.kv_heads, o.hd, o.peak_tflops, fp32_tops);
    std::printf("%6s | %-11s %9s %9s %7s | %s\n", "tokens", "version", "us", "TFLOP/s", "of peak",
                "max err");
    for (int n : {512, 2048}) {
        AttnShape s{o.heads, o.kv_heads, o.hd, n};
        Cache cache(s, 1);
        const std::vector<float> q = random_floats(size_t(n) * s.q_dim(), 9, -3.f, 3.f);
        float* dq = dev_copy(q);
        float* dout = dev_alloc<float>(q.size());
        std::vector<int32_t> pos(static_cast<size_t>(n)), seq(static_cast<size_t>(n), 0),
            rows(static_cast<size_t>(n));
        for (int i = 0; i < n; i++) pos[size_t(i)] = rows[size_t(i)] = i;
        std::vector<AttnTile> tiles;
        for (int r = 0; r < n; r += kPrefillTileRows)
            tiles.push_back(AttnTile{r, std::min(kPrefillTileRows, n - r), 0, r});
        int32_t* dpos = dev_copy(pos);
        int32_t* dseq = dev_copy(seq);
        int32_t* drows = dev_copy(rows);
        AttnTile* dtiles = dev_copy(tiles);
        const int splits = attn_decode_splits(s, n, dev.sm_count);
        float* scratch = dev_alloc<float>(attn_decode_scratch_floats(s, n, splits));
        int* done = dev_zeros<int>(size_t(n) * s.n_head_kv);
        const double flops =
            4.0 * s.n_head * s.head_dim * (double(n) * (n + 1) / 2);  // QK^T and PV
        std::vector<float> decode_out;  // v1's: v3 must match it bit for bit
        for (int version : {1, 2, 3}) {
            if (version >= 2 && !attn_has_prefill(s, version == 3)) continue;
            auto launch = [&](int) {
                if (version == 1)
                    attn_decode(s, dq, cache.k, cache.v, dpos, dseq, drows, n, splits, scratch,
                                done, dout, nullptr);
                else
                    attn_prefill(s, dq, cache.k, cache.v, dtiles, int(tiles.size()), dout, nullptr,
                                 version == 3);
            };
            NT_CUDA_CHECK(cudaMemset(dout, 0xFF, q.size() * sizeof(float)), "cudaMemset");
            launch(0);
            std::vector<float> out(q.size());
            NT_CUDA_CHECK(
                cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
                "cudaMemcpy");
            double err = 0;
            for (int r : {0, 1, 63, 64, n / 2 + 5, n - 1})
                err = std::max(err, max_error(out, size_t(r), s.q_dim(),
                                              cache.reference(&q[size_t(r) * s.q_dim()], 0, r)));
            bool wrong = err > (version == 2 ? 4e-3 : 2e-5);
            if (version == 1) decode_out = out;
            if (version == 3)
                wrong |=
                    std::memcmp(out.data(), decode_out.data(), out.size() * sizeof(float)) != 0;
            const double us = time_us(o.iters, launch);
            const double tf = flops / (us * 1e-6) / 1e12;
            const double of_peak = version == 3 ? tf / fp32_tops : tf / o.peak_tflops;
            static const char* const names[] = {"", "decode", "flash-tc", "exact"};
            std::printf("%6d | v%d %-8s %9.1f %9.1f %6.1f%% | %.1e%s%s\n", n, version,
                        names[version], us, tf, 100 * of_peak, err,
                        version == 3 && !wrong ? " bits ok" : "", wrong ? "  <-- WRONG" : "");
        }
        cudaFree(dq);
        cudaFree(dout);
        cudaFree(dpos);
        cudaFree(dseq);
        cudaFree(drows);
        cudaFree(dtiles);
        cudaFree(scratch);
        cudaFree(done);
    }
}

}  // namespace

int main(int argc, char** argv) {
    Opts o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&] {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--hd")
            o.hd = std::atoi(next());
        else if (a == "--heads")
            o.heads = std::atoi(next());
        else if (a == "--kv-heads")
            o.kv_heads = std::atoi(next());
        else if (a == "--iters")
            o.iters = std::atoi(next());
        else if (a == "--peak-tflops")
            o.peak_tflops = std::atof(next());
        else if (a == "--fp32-tops")
            o.fp32_tops = std::atof(next());
        else if (a == "--ctx")
            o.ctx = std::atoi(next()), o.decode_only = true;
        else if (a == "--rows")
            o.rows = std::atoi(next()), o.decode_only = true;
        else {
            std::fprintf(stderr,
                         "usage: bench_attention [--hd N] [--heads N] [--kv-heads N] [--iters N] "
                         "[--peak-tflops X] [--fp32-tops X] [--ctx N] [--rows N]\n");
            return 2;
        }
    }
    try {
        const CudaDeviceInfo dev = cuda_device_info(0);
        attn_init();
        std::printf("bench_attention on %s\n", describe(dev).c_str());
        const double hbm = measure_hbm(dev.sm_count);
        std::printf("HBM streaming read: %.0f GB/s (1 GiB, best of 5)\n", hbm);
        bench_decode(o, dev, hbm);
        if (!o.decode_only) bench_prefill(o, dev);
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
