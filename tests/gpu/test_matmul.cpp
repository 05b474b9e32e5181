// CUDA matmul against a CPU reference built from nt::dequantize_row, for every weight type,
// batch sizes on both sides of the GEMV/GEMM switch and awkward shapes.
//
// The reference multiplies in double with exactly what the GPU multiplies: int8-rounded
// activations (the CPU backend's own quantization, which the GPU reproduces bit for bit) for
// the quantized GEMV; for the quantized GEMM path the same int8-rounded activations stored as
// FP16, and FP16-rounded weights; FP16/BF16-rounded activations for F16/BF16 weights. What is left
// is float accumulation, so the tolerance is tight: 5e-5 of sum |w * x| per output (a wrong
// sub-block scale or a dropped block shows up at 1e-3 or more). The GEMV is also held to the
// rigorous bound of int8 activation rounding against the unrounded activations.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "core/env.h"
#include "core/error.h"
#include "core/f16.h"
#include "quant/quant.h"
#include "quant/types.h"

namespace {

using nt::GgmlType;
namespace ncu = nt::cuda;

bool have_gpu() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

void ck(cudaError_t e) {
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return float(next() >> 40) * (1.f / 16777216.f); }
    float normal() {
        const float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
        return std::sqrt(-2.f * std::log(u1)) * std::cos(6.2831853f * u2);
    }
};

bool is_float_type(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

// Random quant bytes with finite f16 scales of either sign; normal floats for float types.
std::vector<uint8_t> random_weights(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
    Rng rng(seed);
    std::vector<uint8_t> w(size_t(rows) * nt::row_bytes(t, cols));
    if (is_float_type(t)) {
        for (size_t i = 0; i < size_t(rows * cols); ++i) {
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
    for (auto& b : w) b = uint8_t(rng.next());
    std::vector<int> offs;
    switch (t) {
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::Q8_0:
            offs = {0};
            break;
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
            offs = {0, 2};
            break;
        case GgmlType::Q2_K:
            offs = {80, 82};
            break;
        case GgmlType::Q3_K:
            offs = {108};
            break;
        case GgmlType::Q6_K:
            offs = {208};
            break;
        default:
            break;
    }
    const int bb = nt::traits(t).block_bytes;
    for (size_t b = 0; b < w.size() / bb; ++b)
        for (int o : offs) {
            const uint16_t h = nt::f32_to_f16((rng.uniform() * 2.f - 1.f) * 0.01f);
            std::memcpy(&w[b * bb + o], &h, 2);
        }
    return w;
}

// What the GEMV multiplies with: x quantized by the CPU backend (nt::quantize_row to the weight
// type's vec_dot_type, which the GPU reproduces bit for bit) and dequantized back.
//  - half_step (optional): per element, a bound on |x - xr| (half a quantization step, plus the
//    FP16 rounding of Q8_0/Q8_1's scale, which applies to up to 127 steps);
//  - s_fix (optional, one per 32-element block): Q4_1/Q5_1 weights meet Q8_1's stored
//    s = f16(d * sum(q)) rather than f16(d) * sum(q) = the block's sum of xr; the products
//    differ by m * s_fix with m the weight block's min.
struct ActRef {
    std::vector<float> xr, half_step;
    std::vector<double> s_fix;
};
ActRef act_roundtrip(GgmlType t, const std::vector<float>& x, int64_t cols) {
    const GgmlType at = nt::vec_dot_type(t);
    const size_t ab = nt::row_bytes(at, cols);
    const int64_t rows = int64_t(x.size()) / cols;
    ActRef r;
    r.xr.resize(x.size());
    r.half_step.resize(x.size());
    r.s_fix.assign(x.size() / 32, 0.0);
    std::vector<uint8_t> q(ab);
    for (int64_t i = 0; i < rows; ++i) {
        const float* xi = x.data() + size_t(i) * cols;
        nt::quantize_row(at, xi, q.data(), cols);
        nt::dequantize_row(at, q.data(), r.xr.data() + size_t(i) * cols, cols);
        for (int64_t b = 0; b < cols / 32; ++b) {
            const size_t e0 = size_t(i) * cols + size_t(b) * 32;
            float h;
            if (at == GgmlType::Q8_K) {
                float d;
                std::memcpy(&d, q.data() + size_t(b / 8) * sizeof(nt::block_q8_K), 4);
                h = std::fabs(d) / 2;
            } else {
                float amax = 0.f;
                for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(xi[b * 32 + k]));
                const float d = amax / 127;
                const uint8_t* blk = q.data() + size_t(b) * nt::traits(at).block_bytes;
                uint16_t dh, sh;
                std::memcpy(&dh, blk, 2);
                const float d16 = nt::f16_to_f32(dh);
                h = d / 2 + 127 * std::fabs(d - d16);
                if (at == GgmlType::Q8_1) {
                    std::memcpy(&sh, blk + 2, 2);
                    double sum = 0;
                    for (int k = 0; k < 32; ++k) sum += r.xr[e0 + k];
                    r.s_fix[e0 / 32] = double(nt::f16_to_f32(sh)) - sum;
                }
            }
            for (int k = 0; k < 32; ++k) r.half_step[e0 + k] = h;
        }
    }
    return r;
}

// Per 32-element block of a weight row, the min m of Q4_1/Q5_1 (zero for other types).
std::vector<double> block_mins(GgmlType t, const uint8_t* row, int64_t cols) {
    std::vector<double> m(size_t(cols / 32), 0.0);
    if (t != GgmlType::Q4_1 && t != GgmlType::Q5_1) return m;
    const int bb = nt::traits(t).block_bytes;
    for (size_t b = 0; b < m.size(); ++b) {
        uint16_t h;
        std::memcpy(&h, row + b * bb + 2, 2);
        m[b] = nt::f16_to_f32(h);
    }
    return m;
}

std::vector<float> rounded(std::vector<float> v, GgmlType through) {
    for (auto& f : v)
        f = through == GgmlType::BF16 ? nt::bf16_to_f32(nt::f32_to_bf16(f))
                                      : nt::f16_to_f32(nt::f32_to_f16(f));
    return v;
}

// Every quantized weight type, and the parity tests' shapes for one: a Llama-sized row and (for
// 32-element blocks) SmolLM2's 576 columns, not a multiple of the GEMM's 256-element step.
const GgmlType kQuantTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                                GgmlType::Q5_K, GgmlType::Q6_K};
std::vector<std::pair<int64_t, int64_t>> parity_shapes(GgmlType t) {
    std::vector<std::pair<int64_t, int64_t>> shapes = {{67, 4096}};
    if (nt::traits(t).block_elems == 32) shapes.push_back({130, 576});
    return shapes;
}

template <class T>
struct Dev {
    T* p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) {
        EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), cudaSuccess);
    }
    Dev(const std::vector<T>& h) : Dev(h.size()) {
        EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
                  cudaSuccess);
    }
    ~Dev() { cudaFree(p); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return h;
    }
};

struct Workspace {
    ncu::MatmulWorkspace ws;
    void* buf = nullptr;
    Workspace(size_t bytes, cudaStream_t s) {
        EXPECT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
        ncu::matmul_init(ws, buf, bytes, s);
    }
    ~Workspace() {
        ncu::matmul_free(ws);
        cudaFree(buf);
    }
};

// Runs matmul and compares every output with the reference. Returns the worst error in units
// of sum |w * x|.
double check_matmul(GgmlType t, int64_t rows, int64_t cols, int n, uint64_t seed,
                    size_t ws_bytes = 0) {
    const std::vector<uint8_t> w = random_weights(t, rows, cols, seed);
    Rng rng(seed + 1000);
    std::vector<float> x(size_t(n) * cols);
    for (auto& v : x) v = rng.normal();

    cudaStream_t stream;
    EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    Dev<uint8_t> dw(w);
    Dev<float> dx(x), dy(size_t(n) * rows);
    EXPECT_EQ(cudaMemset(dy.p, 0xFF, dy.n * sizeof(float)), cudaSuccess);  // NaN until written
    {
        Workspace ws(ws_bytes ? ws_bytes : ncu::matmul_workspace_bytes(cols, rows, n), stream);
        ncu::matmul({t, cols, rows, dw.p, w.size()}, dx.p, n, dy.p, ws.ws, stream);
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    cudaStreamDestroy(stream);
    const std::vector<float> y = dy.get();

    // What the GPU multiplies: the int8 activations on the GEMV and the integer GEMM, FP16 ones
    // (and FP16 weights) on the cuBLAS GEMM.
    const bool gemv = ncu::matmul_takes_gemv(t, n) ||
                      (ncu::prompt_exact() && ncu::detail::mmq_supported(t));
    const bool quantized = !is_float_type(t);
    ActRef act;
    if (quantized) act = act_roundtrip(t, x, cols);
    const std::vector<float>& half_step = act.half_step;
    std::vector<float> xr =
        quantized ? (gemv ? act.xr : rounded(act.xr, GgmlType::F16))
        : gemv    ? x
                  : (t == GgmlType::F32
                         ? x
                         : rounded(x, t == GgmlType::BF16 ? GgmlType::BF16 : GgmlType::F16));
    const bool w_f16 = !gemv && quantized;

    double worst = 0;
    std::vector<float> wr(cols);
    const size_t rb = nt::row_bytes(t, cols);
    for (int64_t r = 0; r < rows; ++r) {
        nt::dequantize_row(t, w.data() + size_t(r) * rb, wr.data(), cols);
        if (w_f16) wr = rounded(wr, GgmlType::F16);
        const std::vector<double> mins = gemv && quantized
                                             ? block_mins(t, w.data() + size_t(r) * rb, cols)
                                             : std::vector<double>();
        for (int i = 0; i < n; ++i) {
            double s = 0, mag = 0, s_exact = 0, bound = 0;
            for (size_t b = 0; b < mins.size(); ++b)
                s += mins[b] * act.s_fix[size_t(i) * (cols / 32) + b];
            for (int64_t c = 0; c < cols; ++c) {
                const double wc = wr[c], xc = xr[size_t(i) * cols + c];
                s += wc * xc;
                mag += std::fabs(wc * xc);
                if (gemv && quantized) {
                    s_exact += wc * x[size_t(i) * cols + c];
                    bound += std::fabs(wc) * half_step[size_t(i) * cols + c];
                }
            }
            const double got = y[size_t(i) * rows + r];
            const double err = std::fabs(got - s) / std::max(mag, 1e-30);
            EXPECT_LE(err, 5e-5) << nt::type_name(t) << " " << rows << "x" << cols << " n=" << n
                                 << " row " << r << " batch " << i << ": got " << got << ", want "
                                 << s << " (sum|wx| " << mag << ")";
            if (gemv && quantized) {
                EXPECT_LE(std::fabs(got - s_exact), bound * 1.0001 + 5e-5 * mag)
                    << nt::type_name(t) << " row " << r << " batch " << i
                    << ": outside the int8 rounding bound";
            }
            worst = std::max(worst, err);
            if (::testing::Test::HasFailure()) return worst;  // one report per case is enough
        }
    }
    return worst;
}

struct Case {
    GgmlType type;
    int n;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    return std::string(nt::type_name(info.param.type)) + "_n" + std::to_string(info.param.n);
}

class MatmulTypes : public ::testing::TestWithParam<Case> {};

// Shapes: one block per row with a row count that fills no tile evenly; a few blocks (576
// columns for 32-element blocks: not a multiple of 256); a Llama-sized row.
TEST_P(MatmulTypes, MatchesReference) {
    SKIP_WITHOUT_GPU();
    const auto [t, n] = GetParam();
    const int64_t be = nt::traits(t).block_elems;
    std::vector<std::pair<int64_t, int64_t>> shapes;  // rows, cols
    if (be == 1)
        shapes = {{37, 7}, {37, 576}, {130, 1000}, {67, 4096}};
    else if (be == 32)
        shapes = {{37, 32}, {130, 576}, {67, 4096}};
    else
        shapes = {{37, 256}, {130, 768}, {67, 4096}};
    uint64_t seed = uint64_t(t) * 1000 + uint64_t(n);
    for (auto [rows, cols] : shapes) {
        if (n > 64 && rows * cols > 130 * 1000) rows = 19;  // keep the CPU reference quick
        check_matmul(t, rows, cols, n, seed++);
        if (HasFailure()) return;
    }
}

std::vector<Case> all_cases() {
    std::vector<Case> c;
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                       GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K,
                       GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
        for (int n : {1, 2, 3, 8, 9, 64, 600}) c.push_back({t, n});
    return c;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTypes, ::testing::ValuesIn(all_cases()), case_name);

// Every compiled GEMV variant (kernel, rows per warp, column split, persistent grid or not) on
// every quantized type: row and column tails, chunks split unevenly between warps, (with 9001
// rows) persistent CTAs that loop over several row tiles, the pipe kernel in both forms, and
// the tensor-core kernel at every column split (rows of 2-byte aligned blocks whose alignment
// alternates: Q6_K 19 blocks, Q8_0 9).
TEST(MatmulVariants, EveryGemvConfigMatches) {
    SKIP_WITHOUT_GPU();
    using ncu::detail::GemvConfig;
    using ncu::detail::GemvKernel;
    cudaStream_t stream;
    ck(cudaStreamCreate(&stream));
    for (GgmlType t : kQuantTypes) {
        const int64_t be = nt::traits(t).block_elems;
        // The third shape is 8B's 4096 columns, whose rows the pipe kernel's TMA form takes
        // (Q4_K, Q6_K, Q8_0), with rows enough for two a warp (and the pair below 1100 of each):
        // four rows a stage where the rows allow (2200, on GPUs with the shared memory for it),
        // two where they do not (2202); the last 70B's 8192, which it takes for Q4_K.
        std::vector<std::pair<int64_t, int64_t>> shapes = {{45, be == 32 ? 32 * 150 : 256 * 19},
                                                           {9001, be == 32 ? 32 * 9 : 256 * 2},
                                                           {2200, 4096}};
        if (t == GgmlType::Q4_K || t == GgmlType::Q6_K) shapes.push_back({2202, 4096});
        if (t == GgmlType::Q4_K) shapes.push_back({2200, 8192});
        for (auto [rows, cols] : shapes) {
            const std::vector<uint8_t> w =
                random_weights(t, rows, cols, 77 + uint64_t(t) + uint64_t(rows));
            std::vector<float> wf(size_t(rows) * cols);
            for (int64_t r = 0; r < rows; ++r)
                nt::dequantize_row(t, w.data() + size_t(r) * nt::row_bytes(t, cols),
                                   wf.data() + size_t(r) * cols, cols);
            Dev<uint8_t> dw(w);
            Rng rng(5);
            for (int n : {1, 2, 3, 5, 8}) {
                std::vector<float> x(size_t(n) * cols);
                for (auto& v : x) v = rng.normal();
                const ActRef act = act_roundtrip(t, x, cols);
                const std::vector<float>& xr = act.xr;
                std::vector<double> ref(size_t(n) * rows), mag(size_t(n) * rows);
                for (int64_t r = 0; r < rows; ++r) {
                    const std::vector<double> mins =
                        block_mins(t, w.data() + size_t(r) * nt::row_bytes(t, cols), cols);
                    for (int i = 0; i < n; ++i) {
                        double s = 0, m = 0;
                        for (size_t b = 0; b < mins.size(); ++b)
                            s += mins[b] * act.s_fix[size_t(i) * (cols / 32) + b];
                        for (int64_t k = 0; k < cols; ++k) {
                            const double p =
                                double(wf[size_t(r) * cols + k]) * xr[size_t(i) * cols + k];
                            s += p;
                            m += std::fabs(p);
                        }
                        ref[size_t(i) * rows + r] = s;
                        mag[size_t(i) * rows + r] = m;
                    }
                }
                Dev<float> dx(x), dy(size_t(n) * rows);
                Dev<int8_t> xq(size_t(n) * cols);
                Dev<float2> xd(size_t(n) * cols / 32);
                ncu::detail::quantize_q8(dx.p, n, cols, ncu::detail::act_quant(t), xq.p, xd.p,
                                         stream);
                const int nx = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
                int tried = 0;
                std::vector<float> pipe_out[2];  // the pipe kernel's two forms (TMA ring or not)
                for (auto kern : {GemvKernel::Staged, GemvKernel::Direct, GemvKernel::Stream,
                                  GemvKernel::Pipe, GemvKernel::Mma})
                    for (int rw : {1, 2})
                        for (int ks : {1, 2, 4, 8})
                            for (bool pers : {true, false}) {
                                GemvConfig c{kern, nx, rw, ks, pers};
                                // The pipe kernel's TMA form, where it can run, and its
                                // register ring (the persistence flag is the staged kernel's).
                                c.tma = pers;
                                if (!ncu::detail::gemv_config_available(t, c)) continue;
                                ++tried;
                                ck(cudaMemsetAsync(dy.p, 0xFF, dy.n * sizeof(float), stream));
                                ncu::detail::gemv_q8(t, dw.p, rows, cols, xq.p, xd.p, n, dy.p, c,
                                                     stream);
                                ck(cudaStreamSynchronize(stream));
                                const std::vector<float> y = dy.get();
                                for (size_t o = 0; o < y.size(); ++o)
                                    ASSERT_LE(std::fabs(y[o] - ref[o]), 5e-5 * mag[o])
                                        << nt::type_name(t)
                                        << (kern == GemvKernel::Direct   ? " direct"
                                            : kern == GemvKernel::Stream ? " stream"
                                            : kern == GemvKernel::Pipe   ? " pipe"
                                            : kern == GemvKernel::Mma    ? " mma"
                                                                         : " staged")
                                        << (pers ? "-p" : "") << " nx" << nx << " rw" << rw << " k"
                                        << ks << " " << rows << "x" << cols << " n=" << n << " row "
                                        << o % rows << " batch " << o / rows << ": got " << y[o]
                                        << ", want " << ref[o];
                                if (kern == GemvKernel::Pipe) pipe_out[pers] = y;
                            }
                EXPECT_GE(tried, nx == 8 ? 6 : 12) << nt::type_name(t) << " nx" << nx;
                // Both forms sum every row in the same order: the same bits.
                if (!pipe_out[0].empty() && !pipe_out[1].empty()) {
                    for (size_t o = 0; o < pipe_out[0].size(); ++o) {
                        ASSERT_EQ(pipe_out[0][o], pipe_out[1][o])
                            << nt::type_name(t) << " pipe, TMA ring against registers, " << rows
                            << "x" << cols << " n=" << n << " output " << o;
                    }
                }

                // SwiGLU pair: the first half of the rows as gate, the second half as up.
                if (ncu::detail::gemv_pair_available(t)) {
                    const int64_t half = rows / 2;
                    const uint8_t* up = dw.p + size_t(half) * nt::row_bytes(t, cols);
                    ck(cudaMemsetAsync(dy.p, 0xFF, dy.n * sizeof(float), stream));
                    ncu::detail::gemv_pair(t, dw.p, up, half, cols, xq.p, xd.p, n, dy.p, false,
                                           stream);
                    ck(cudaStreamSynchronize(stream));
                    const std::vector<float> y = dy.get();
                    for (int i = 0; i < n; ++i)
                        for (int64_t r = 0; r < half; ++r) {
                            const double g = ref[size_t(i) * rows + r];
                            const double u = ref[size_t(i) * rows + half + r];
                            const double sg = g / (1 + std::exp(-g));
                            const double tol =
                                1e-4 * (mag[size_t(i) * rows + r] * std::fabs(u) +
                                        std::fabs(sg) * mag[size_t(i) * rows + half + r]) +
                                1e-6;
                            ASSERT_LE(std::fabs(y[size_t(i) * half + r] - sg * u), tol)
                                << nt::type_name(t) << " pair " << rows << "x" << cols << " n=" << n
                                << " row " << r << " batch " << i;
                        }
                }
            }
        }
    }
    cudaStreamDestroy(stream);
}

// The activation quantizer is bit-exact with the CPU backend's (nt::quantize_row to Q8_0, Q8_1
// and Q8_K), in both of its output forms (int8 + scales, and FP16 for the GEMM path), including
// ties after scaling, all-zero blocks and, for Q8_K, the sign of the scale when two elements share
// the largest magnitude.
TEST(MatmulQuantizer, BitExactWithCpu) {
    SKIP_WITHOUT_GPU();
    const int n = 3;
    const int64_t cols = 4096 + 256;
    Rng rng(9);
    std::vector<float> x(size_t(n) * cols);
    for (auto& v : x) v = rng.normal() * 3.f;
    for (int i = 0; i < 256; ++i) x[256 + i] = 0.f;  // an all-zero block (Q8_K and Q8_0)
    // Elements 512..767: max magnitude 127 twice (+ first), so d = 1 (Q8_0) / -1 (Q8_K), and
    // values that land on .5 after scaling: roundf goes away from zero, Q8_K's rint to even.
    x[512] = 127.f;
    x[520] = -127.f;
    x[513] = 62.5f;
    x[514] = -62.5f;
    x[515] = 0.5f;
    x[516] = 1.5f;
    Dev<float> dx(x);
    Dev<int8_t> xq(x.size());
    Dev<float2> xd(x.size() / 32);
    for (GgmlType wt : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K}) {
        const GgmlType at = nt::vec_dot_type(wt);
        ncu::detail::quantize_q8(dx.p, n, cols, ncu::detail::act_quant(wt), xq.p, xd.p, nullptr);
        ck(cudaDeviceSynchronize());
        const auto q = xq.get();
        const auto d = xd.get();
        const size_t ab = nt::row_bytes(at, cols);
        std::vector<uint8_t> cpu(ab);
        for (int i = 0; i < n; ++i) {
            nt::quantize_row(at, x.data() + size_t(i) * cols, cpu.data(), cols);
            for (int64_t b = 0; b < cols / 32; ++b) {
                const size_t g = size_t(i) * (cols / 32) + size_t(b);  // global 32-block
                const int8_t* want_q;
                float want_d, want_s;
                int sum = 0;
                if (at == GgmlType::Q8_K) {
                    nt::block_q8_K k;
                    std::memcpy(&k, cpu.data() + size_t(b / 8) * sizeof(k), sizeof(k));
                    want_q = reinterpret_cast<const int8_t*>(cpu.data() +
                                                             size_t(b / 8) * sizeof(k) + 4) +
                             (b % 8) * 32;
                    for (int e = 0; e < 32; ++e) sum += want_q[e];
                    ASSERT_EQ(sum, k.bsums[2 * (b % 8)] + k.bsums[2 * (b % 8) + 1]);
                    want_d = k.d;
                    want_s = k.d * float(sum);
                } else {
                    const uint8_t* blk = cpu.data() + size_t(b) * nt::traits(at).block_bytes;
                    uint16_t dh, sh;
                    std::memcpy(&dh, blk, 2);
                    want_q = reinterpret_cast<const int8_t*>(blk + (at == GgmlType::Q8_1 ? 4 : 2));
                    for (int e = 0; e < 32; ++e) sum += want_q[e];
                    want_d = nt::f16_to_f32(dh);
                    std::memcpy(&sh, blk + 2, 2);
                    want_s = at == GgmlType::Q8_1 ? nt::f16_to_f32(sh) : want_d * float(sum);
                }
                for (int e = 0; e < 32; ++e)
                    ASSERT_EQ(int(q[g * 32 + e]), int(want_q[e]))
                        << nt::type_name(at) << " row " << i << " block " << b << " element " << e;
                ASSERT_EQ(d[g].x, want_d) << nt::type_name(at) << " row " << i << " block " << b;
                ASSERT_EQ(d[g].y, want_s) << nt::type_name(at) << " row " << i << " block " << b;
            }
        }
        // The GEMM path's form of the same rounding: q * d as FP16, equal to the CPU's
        // quantize-then-dequantize rounded to FP16.
        Dev<uint16_t> xh(x.size());
        ncu::detail::quantize_to_f16(dx.p, n, cols, ncu::detail::act_quant(wt),
                                     reinterpret_cast<__half*>(xh.p), nullptr);
        ck(cudaDeviceSynchronize());
        const auto h = xh.get();
        const std::vector<float> want = rounded(act_roundtrip(wt, x, cols).xr, GgmlType::F16);
        for (size_t e = 0; e < x.size(); ++e)
            ASSERT_EQ(nt::f16_to_f32(h[e]), want[e]) << nt::type_name(at) << " element " << e;
    }
}

// Parity with the CPU backend: matmul() equals nt::vec_dot of the same weight row with the CPU's
// quantized activations, bit for bit, for every quantized type at n <= 8 (the GEMV) and, for the
// types with the integer GEMM, at prompt sizes too (9: one partial token tile; 70: a full one
// and a partial one; 600), on a Llama-sized row and (32-element blocks) SmolLM2's 576 columns,
// not a multiple of the GEMM's 256-element step: both form each block's term in double and round
// the row's double sum once (Quant<T>::dot).
TEST(MatmulParity, GemvEqualsCpuVecDot) {
    SKIP_WITHOUT_GPU();
    cudaStream_t stream;
    ck(cudaStreamCreate(&stream));
    for (GgmlType t : kQuantTypes) {
      for (auto [rows, cols] : parity_shapes(t)) {
        const std::vector<uint8_t> w = random_weights(t, rows, cols, 500 + uint64_t(t) + cols);
        const size_t rb = nt::row_bytes(t, cols);
        const GgmlType at = nt::vec_dot_type(t);
        const size_t ab = nt::row_bytes(at, cols);
        Dev<uint8_t> dw(w);
        for (int n : {1, 3, 8, 9, 70, 600}) {
            if (n > ncu::kGemvMaxBatch && !(ncu::prompt_exact() && ncu::detail::mmq_supported(t)))
                continue;
            Rng rng(600 + uint64_t(n));
            std::vector<float> x(size_t(n) * cols);
            for (auto& v : x) v = rng.normal();
            std::vector<uint8_t> act(size_t(n) * ab);
            for (int i = 0; i < n; ++i)
                nt::quantize_row(at, x.data() + size_t(i) * cols, act.data() + size_t(i) * ab,
                                 cols);
            const ActRef ar = act_roundtrip(t, x, cols);
            Dev<float> dx(x), dy(size_t(n) * rows);
            {
                Workspace ws(ncu::matmul_workspace_bytes(cols, rows, n), stream);
                ncu::matmul({t, cols, rows, dw.p, w.size()}, dx.p, n, dy.p, ws.ws, stream);
                ck(cudaStreamSynchronize(stream));
            }
            const auto y = dy.get();
            std::vector<float> wr(cols);
            for (int64_t r = 0; r < rows; ++r) {
                nt::dequantize_row(t, w.data() + size_t(r) * rb, wr.data(), cols);
                for (int i = 0; i < n; ++i) {
                    const float want = nt::vec_dot(t, cols, w.data() + size_t(r) * rb,
                                                   act.data() + size_t(i) * ab);
                    double mag = 0;
                    for (int64_t c = 0; c < cols; ++c)
                        mag += std::fabs(double(wr[c]) * ar.xr[size_t(i) * cols + c]);
                    const float got = y[size_t(i) * rows + r];
                    ASSERT_EQ(0, std::memcmp(&got, &want, sizeof(float)))
                        << nt::type_name(t) << " " << rows << "x" << cols << " n=" << n
                        << " row " << r << " batch " << i << ": GPU " << got
                        << ", CPU vec_dot " << want << " (sum|wx| " << mag << ")";
                }
            }
        }
      }
    }
    cudaStreamDestroy(stream);
}

// The integer GEMM's kernels give the same bits for every quantized type, partial row and token
// tiles and SmolLM2's 576 columns included: the default (on compute capability 9.0 the wgmma
// kernels for every type but Q2_K and Q3_K) and the mma.sync kernel every device has. The
// default is held to the CPU's vec_dot above.
TEST(MatmulParity, MmqKernelsAgree) {
    SKIP_WITHOUT_GPU();
    cudaStream_t stream;
    ck(cudaStreamCreate(&stream));
    for (GgmlType t : kQuantTypes) {
        for (auto [rows, cols] : parity_shapes(t)) {
            const std::vector<uint8_t> w = random_weights(t, rows, cols, 900 + uint64_t(t) + cols);
            Dev<uint8_t> dw(w);
            for (int n : {9, 40, 600}) {
                Rng rng(700 + uint64_t(n));
                std::vector<float> x(size_t(n) * cols);
                for (auto& v : x) v = rng.normal();
                Dev<float> dx(x), yb(size_t(n) * rows), ys(size_t(n) * rows);
                Dev<int8_t> xq(size_t(n) * cols);
                Dev<float2> xd(size_t(n) * cols / 32);
                ncu::detail::quantize_q8(dx.p, n, cols, ncu::detail::act_quant(t), xq.p, xd.p,
                                         stream);
                ncu::detail::gemm_mmq(t, dw.p, rows, cols, xq.p, xd.p, n, yb.p, stream,
                                      ncu::detail::MmqKernel::Best);
                ncu::detail::gemm_mmq(t, dw.p, rows, cols, xq.p, xd.p, n, ys.p, stream,
                                      ncu::detail::MmqKernel::Sync);
                ck(cudaStreamSynchronize(stream));
                const auto a = yb.get(), b = ys.get();
                for (size_t e = 0; e < a.size(); ++e)
                    ASSERT_EQ(0, std::memcmp(&a[e], &b[e], sizeof(float)))
                        << nt::type_name(t) << " " << rows << "x" << cols << " n=" << n
                        << " output " << e << ": default " << a[e] << ", mma.sync " << b[e];
            }
        }
    }
    cudaStreamDestroy(stream);
}

// Activations quantized once serve the next matmul on the same x (x_unchanged), and only when
// x, batch, columns and activation type all match. The test overwrites x between the two calls
// (breaking the promise on purpose): a reused quantization still gives the result on the old x,
// a fresh one the result on the new x.
TEST(MatmulReuse, QuantizedActivationsReusedOnlyWhenTheyMatch) {
    SKIP_WITHOUT_GPU();
    cudaStream_t s;
    ck(cudaStreamCreate(&s));
    const int64_t cols = 1024, rows = 200;
    const int n = 2;
    const std::vector<uint8_t> wk = random_weights(GgmlType::Q4_K, rows, cols, 31);
    const std::vector<uint8_t> w6 = random_weights(GgmlType::Q6_K, rows, cols, 32);
    const std::vector<uint8_t> w0 = random_weights(GgmlType::Q4_0, rows, cols, 33);
    Rng rng(34);
    std::vector<float> x1(size_t(n) * cols), x2(size_t(n) * cols), x3(size_t(n) * cols);
    for (auto* x : {&x1, &x2, &x3})
        for (auto& v : *x) v = rng.normal();
    Dev<uint8_t> dk(wk), d6(w6), d0(w0);
    Dev<float> dx1(x1), dx2(x2), ya(size_t(n) * rows), yb(size_t(n) * rows);
    Workspace ws(ncu::matmul_workspace_bytes(cols, rows, n), s);
    const nt::WeightView vk{GgmlType::Q4_K, cols, rows, dk.p, wk.size()};
    const nt::WeightView v6{GgmlType::Q6_K, cols, rows, d6.p, w6.size()};
    const nt::WeightView v0{GgmlType::Q4_0, cols, rows, d0.p, w0.size()};
    const auto upload = [&](float* d, const std::vector<float>& h) {
        ck(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    };
    const auto alone = [&](const nt::WeightView& w, float* x, const std::vector<float>& content) {
        upload(x, content);
        ncu::matmul(w, x, n, yb.p, ws.ws, s);
        ck(cudaStreamSynchronize(s));
        return yb.get();
    };
    const auto check = [&](const nt::WeightView& a, float* xa, const std::vector<float>& ca,
                           const nt::WeightView& b, float* xb, const std::vector<float>& cb,
                           bool reused, const char* what) {
        const auto want = alone(b, xb, reused ? cb : x3);
        upload(xa, ca);
        upload(xb, cb);
        ncu::matmul(a, xa, n, ya.p, ws.ws, s);
        upload(xb, x3);
        ncu::matmul(b, xb, n, yb.p, ws.ws, s, /*x_unchanged=*/true);
        ck(cudaStreamSynchronize(s));
        const auto got = yb.get();
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << what;
        upload(xa, ca);
        upload(xb, cb);
    };
    check(vk, dx1.p, x1, v6, dx1.p, x1, true, "same x, Q8_K twice: reused");
    check(v0, dx1.p, x1, v0, dx1.p, x1, true, "same x, Q8_0 twice: reused");
    check(vk, dx1.p, x1, vk, dx2.p, x2, false, "other x: quantized again");
    check(vk, dx1.p, x1, v0, dx1.p, x1, false, "same x, Q8_K then Q8_0: quantized again");
    check(v0, dx1.p, x1, vk, dx1.p, x1, false, "same x, Q8_0 then Q8_K: quantized again");
    // Without x_unchanged a matching call still quantizes; after forget, too.
    upload(dx1.p, x1);
    ncu::matmul(vk, dx1.p, n, ya.p, ws.ws, s);
    upload(dx1.p, x3);
    ncu::matmul(vk, dx1.p, n, yb.p, ws.ws, s);
    ck(cudaStreamSynchronize(s));
    const auto fresh = yb.get();
    upload(dx1.p, x1);
    ncu::matmul(vk, dx1.p, n, ya.p, ws.ws, s);
    upload(dx1.p, x3);
    ncu::matmul_forget_activations(ws.ws);
    ncu::matmul(vk, dx1.p, n, yb.p, ws.ws, s, true);
    ck(cudaStreamSynchronize(s));
    const auto forgot = yb.get();
    EXPECT_EQ(0, std::memcmp(fresh.data(), forgot.data(), fresh.size() * sizeof(float)));
    const auto want3 = alone(vk, dx2.p, x3);
    EXPECT_EQ(0, std::memcmp(fresh.data(), want3.data(), fresh.size() * sizeof(float)));
    cudaStreamDestroy(s);
}

// The decode path replays from a CUDA graph: same bits as the eager call.
TEST(MatmulGraph, CapturedGemvReplaysIdentically) {
    SKIP_WITHOUT_GPU();
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16}) {
        for (int n : {1, 8}) {
            const int64_t rows = 300, cols = 2048;
            const std::vector<uint8_t> w = random_weights(t, rows, cols, 3);
            Rng rng(4);
            std::vector<float> x(size_t(n) * cols);
            for (auto& v : x) v = rng.normal();
            Dev<uint8_t> dw(w);
            Dev<float> dx(x), dy(size_t(n) * rows);
            cudaStream_t s;
            ck(cudaStreamCreate(&s));
            Workspace ws(ncu::matmul_workspace_bytes(cols, rows, n), s);
            const nt::WeightView wv{t, cols, rows, dw.p, w.size()};
            ncu::matmul(wv, dx.p, n, dy.p, ws.ws, s);
            ck(cudaStreamSynchronize(s));
            const auto eager = dy.get();
            ck(cudaMemset(dy.p, 0, dy.n * sizeof(float)));
            cudaGraph_t g;
            cudaGraphExec_t ge;
            ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            ncu::matmul(wv, dx.p, n, dy.p, ws.ws, s);
            ck(cudaStreamEndCapture(s, &g));
            ck(cudaGraphInstantiate(&ge, g, 0));
            ck(cudaGraphLaunch(ge, s));
            ck(cudaStreamSynchronize(s));
            const auto replay = dy.get();
            EXPECT_EQ(0, std::memcmp(eager.data(), replay.data(), eager.size() * sizeof(float)))
                << nt::type_name(t) << " n=" << n;
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
            cudaStreamDestroy(s);
        }
    }
}

// The feed-forward's first weights requested into L2 by the GEMV before them
// (CudaBackend::warm_weights sets MatmulWorkspace::warm): the requests go out with the next
// matmul's launch where it is the TMA form launched as a programmatic dependent (8B's o
// projection, Q4_K 4096 x 4096), with that matmul only, before its wait or after it, and they
// are hints: no bit moves.
TEST(MatmulL2Warm, RequestsGoWithOneLaunchAndMoveNoBit) {
    SKIP_WITHOUT_GPU();
    const GgmlType t = GgmlType::Q4_K;
    const int64_t rows = 4096, cols = 4096;
    const std::vector<uint8_t> w = random_weights(t, rows, cols, 11);
    Rng rng(12);
    std::vector<float> x(cols);
    for (auto& v : x) v = rng.normal();
    Dev<uint8_t> dw(w), next(w);  // next: the weights requested (a copy: any resident bytes)
    Dev<float> dx(x), dy(rows);
    cudaStream_t s;
    ck(cudaStreamCreate(&s));
    Workspace ws(ncu::matmul_workspace_bytes(cols, rows, 1), s);
    const nt::WeightView wv{t, cols, rows, dw.p, w.size()};
    const int64_t half = int64_t(w.size()) / 2 / 16 * 16;
    auto run = [&](bool warm, bool after = false) {
        if (warm) ws.ws.warm = {{next.p, next.p + half}, std::min<int64_t>(half, 1 << 20), after};
        ncu::matmul(wv, dx.p, 1, dy.p, ws.ws, s);
        ck(cudaStreamSynchronize(s));
        EXPECT_EQ(ws.ws.warm.bytes, 0) << "the matmul takes the requests, launched or not";
        return dy.get();
    };
    // The launch takes them where its first stages go out before its wait.
    const bool early = ws.ws.pdl && nt::env_switch("NT_PDL_PREFETCH") &&
                       ncu::detail::gemv_stack_tma(t, rows, cols, 1);
    const std::vector<float> plain = run(false);
    EXPECT_EQ(ws.ws.warm_launches, 0);
    const std::vector<float> warmed = run(true);
    EXPECT_EQ(0, std::memcmp(plain.data(), warmed.data(), plain.size() * sizeof(float)));
    EXPECT_EQ(ws.ws.warm_launches, early ? 1 : 0);
    run(false);  // the next matmul carries none
    EXPECT_EQ(ws.ws.warm_launches, early ? 1 : 0);
    // Sent after the launch's wait instead of before it (L2Warm::after): the same.
    const std::vector<float> after = run(true, true);
    EXPECT_EQ(0, std::memcmp(plain.data(), after.data(), plain.size() * sizeof(float)));
    EXPECT_EQ(ws.ws.warm_launches, early ? 2 : 0);
    // Without programmatic launch nothing goes out before the wait: none carried, same bits.
    ws.ws.pdl = false;
    const std::vector<float> waited = run(true);
    EXPECT_EQ(0, std::memcmp(plain.data(), waited.data(), plain.size() * sizeof(float)));
    EXPECT_EQ(ws.ws.warm_launches, early ? 2 : 0);
    cudaStreamDestroy(s);
}

// Rows too long for the pipe kernel's TMA form whole (70B's 28672 columns; Q4_K's and Q6_K's
// 14336; Q6_K's 8192; Q8_0's 14336) go in column slices whose sums the CTA of each row range
// adds in order: against the CPU reference, the same bits on every launch, with and without
// programmatic dependent launch, and matmul() running exactly that. Row counts cover four rows
// a warp, two and one (too few rows for two: 300 x 28672, and an odd count).
TEST(MatmulSplit, LongRowsInColumnSlices) {
    SKIP_WITHOUT_GPU();
    using ncu::detail::GemvConfig;
    using ncu::detail::GemvKernel;
    int dev = 0, major = 0;
    ck(cudaGetDevice(&dev));
    ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaStream_t s;
    ck(cudaStreamCreate(&s));
    struct Case {
        GgmlType t;
        int64_t rows, cols;
        int slices;
    };
    // Q4_K's 14336 columns: slices of one unit, four rows a stage (off with NT_TMA_SPLIT_FOUR=0).
    // Where four rows a stage cannot run (302 rows), the register ring takes them whole.
    const int q4_one = nt::env_switch("NT_TMA_SPLIT_FOUR") ? 7 : 0;
    const Case cases[] = {
        {GgmlType::Q4_K, 2200, 14336, q4_one}, {GgmlType::Q4_K, 302, 14336, q4_one},
        {GgmlType::Q4_K, 1000, 28672, 7},      {GgmlType::Q4_K, 300, 28672, 7},
        {GgmlType::Q6_K, 2200, 14336, 7},      {GgmlType::Q6_K, 1000, 28672, 7},
        {GgmlType::Q6_K, 2200, 8192, 2},       {GgmlType::Q6_K, 301, 8192, 2},
        {GgmlType::Q8_0, 2200, 14336, 7},      {GgmlType::Q8_0, 300, 28672, 7}};
    for (const Case& k : cases) {
        const GgmlType t = k.t;
        const int64_t rows = k.rows, cols = k.cols;
        SCOPED_TRACE(std::string(nt::type_name(t)) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols));
        const int slices = ncu::detail::gemv_split_slices(t, cols, 1);
        if (major < 9) {
            EXPECT_EQ(slices, 0);  // the TMA form needs compute capability 9.0
            continue;
        }
        ASSERT_EQ(slices, k.slices);
        if (slices == 0) continue;
        EXPECT_EQ(ncu::detail::gemv_split_slices(t, cols, 2), 0);  // one activation row only
        const std::vector<uint8_t> w = random_weights(t, rows, cols, 900 + uint64_t(rows));
        const size_t rb = nt::row_bytes(t, cols);
        Rng rng(901);
        std::vector<float> x(static_cast<size_t>(cols));
        for (auto& v : x) v = rng.normal();
        const ActRef act = act_roundtrip(t, x, cols);
        std::vector<double> ref(static_cast<size_t>(rows)), mag(static_cast<size_t>(rows));
        std::vector<float> wf(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
            nt::dequantize_row(t, w.data() + size_t(r) * rb, wf.data(), cols);
            const std::vector<double> mins = block_mins(t, w.data() + size_t(r) * rb, cols);
            double sum = 0, m = 0;
            for (size_t b = 0; b < mins.size(); ++b) sum += mins[b] * act.s_fix[b];
            for (int64_t c = 0; c < cols; ++c) {
                const double p = double(wf[size_t(c)]) * act.xr[size_t(c)];
                sum += p;
                m += std::fabs(p);
            }
            ref[size_t(r)] = sum;
            mag[size_t(r)] = m;
        }
        Dev<uint8_t> dw(w);
        Dev<float> dx(x), dy(static_cast<size_t>(rows));
        Workspace ws(ncu::matmul_workspace_bytes(cols, rows, 1), s);
        Dev<int8_t> xq(static_cast<size_t>(cols));
        Dev<float2> xd(static_cast<size_t>(cols) / 32);
        ncu::detail::quantize_q8(dx.p, 1, cols, ncu::detail::act_quant(t), xq.p, xd.p, s);
        GemvConfig c{GemvKernel::Pipe, 1, 1, 1, true};
        c.split = true;
        std::vector<float> first;
        for (int run = 0; run < 3; ++run) {
            c.pdl = run == 1;
            ck(cudaMemsetAsync(dy.p, 0xFF, dy.n * sizeof(float), s));
            ncu::detail::gemv_q8(t, dw.p, rows, cols, xq.p, xd.p, 1, dy.p, c, s);
            ck(cudaStreamSynchronize(s));
            const std::vector<float> y = dy.get();
            if (run == 0) {
                for (int64_t r = 0; r < rows; ++r)
                    ASSERT_LE(std::fabs(y[size_t(r)] - ref[size_t(r)]), 5e-5 * mag[size_t(r)])
                        << "row " << r << ": got " << y[size_t(r)] << ", want " << ref[size_t(r)];
                first = y;
            } else {
                ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
                    << "launch " << run << " differs from the first";
            }
        }
        // Where the kernel takes the float activations and quantizes them itself (Q4_K and Q6_K
        // in one-unit slices): the bits of quantize_q8 and gemv_q8, for these activations and
        // for ones whose blocks have ties of largest magnitude of both signs (the first one's
        // decides the scale's), in one lane and across lanes, or are all zero.
        const bool from_float = ncu::detail::gemv_from_float_takes(t, dw.p, rows, cols);
        // (not Q8_0, nor slices of two units: 28672 and Q6_K's 8192 columns; Q4_K's one-unit
        // slices only four rows a stage)
        EXPECT_EQ(from_float,
                  t != GgmlType::Q8_0 && cols == 14336 && (t == GgmlType::Q6_K || rows % 4 == 0));
        if (from_float) {
            std::vector<float> ties = x;
            for (int64_t b = 0; b * 256 < cols; ++b) {
                float* v = ties.data() + b * 256;
                const int kind = int(b % 4);
                if (kind == 3) {
                    std::fill(v, v + 256, 0.f);
                    continue;
                }
                for (int i = 0; i < 256; ++i) v[i] *= 0.25f;
                const int at[3][3] = {{200, 17, 130}, {5, 250, 64}, {63, 66, 40}};
                for (int k = 0; k < 3; ++k) v[at[kind][k]] = (k + kind) % 2 ? -3.f : 3.f;
            }
            for (const std::vector<float>* xs : {&x, &ties}) {
                Dev<float> dxs(*xs);
                ncu::detail::quantize_q8(dxs.p, 1, cols, ncu::detail::act_quant(t), xq.p, xd.p, s);
                c.pdl = false;
                ncu::detail::gemv_q8(t, dw.p, rows, cols, xq.p, xd.p, 1, dy.p, c, s);
                ck(cudaStreamSynchronize(s));
                const std::vector<float> want = dy.get();
                for (bool pdl : {false, true}) {
                    ck(cudaMemsetAsync(dy.p, 0xFF, dy.n * sizeof(float), s));
                    ncu::detail::gemv_from_float(t, dw.p, rows, cols, dxs.p, dy.p, pdl, s);
                    ck(cudaStreamSynchronize(s));
                    const std::vector<float> y = dy.get();
                    ASSERT_EQ(0, std::memcmp(want.data(), y.data(), y.size() * sizeof(float)))
                        << "float activations quantized in the kernel"
                        << (xs == &ties ? " (ties)" : "") << (pdl ? " with PDL" : "");
                }
            }
        }
        // matmul() runs it where its GEMV is the pipe kernel (Q6_K: from 2048 rows).
        if (ncu::detail::gemv_default(t, rows, cols, 1, ws.ws.sm_count).kernel != GemvKernel::Pipe)
            continue;
        ck(cudaMemsetAsync(dy.p, 0xFF, dy.n * sizeof(float), s));
        ncu::matmul({t, cols, rows, dw.p, w.size()}, dx.p, 1, dy.p, ws.ws, s);
        ck(cudaStreamSynchronize(s));
        const std::vector<float> y = dy.get();
        EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
            << "matmul() does not run the column split";
    }
    cudaStreamDestroy(s);
}

// A workspace that holds only a few rows of FP16 weights: the GEMM runs slice by slice.
TEST(MatmulWorkspace, SlicedGemmMatches) {
    SKIP_WITHOUT_GPU();
    const int64_t rows = 700, cols = 512;
    const int n = 16;
    const size_t small = (size_t(32) << 20) + size_t(n) * cols * 2 + 256 + size_t(300) * cols * 2 +
                         ncu::matmul_tail_bytes();  // 256-row slices
    // Types without the integer GEMM (which needs no FP16 copy), so the slices are exercised.
    check_matmul(GgmlType::Q5_K, rows, cols, n, 11, small);
    check_matmul(GgmlType::Q4_0, rows, cols, n, 12, small);
}

TEST(MatmulWorkspace, TooSmallIsAClearError) {
    SKIP_WITHOUT_GPU();
    cudaStream_t s;
    ck(cudaStreamCreate(&s));
    const int64_t rows = 256, cols = 1024;
    Dev<uint8_t> dw(size_t(rows) * nt::row_bytes(GgmlType::Q4_K, cols));
    Dev<float> dx(size_t(64) * cols), dy(size_t(64) * rows);
    {
        Workspace ws(1024, s);  // not even the int8 activations of one row
        try {
            ncu::matmul({GgmlType::Q4_K, cols, rows, dw.p, dw.n}, dx.p, 4, dy.p, ws.ws, s);
            FAIL() << "expected nt::Error";
        } catch (const nt::Error& e) {
            EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
        }
        try {
            ncu::matmul({GgmlType::Q4_K, cols, rows, dw.p, dw.n}, dx.p, 64, dy.p, ws.ws, s);
            FAIL() << "expected nt::Error";
        } catch (const nt::Error& e) {
            EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
        }
    }
    cudaStreamDestroy(s);
}

TEST(MatmulArgs, RejectsWhatItCannotDo) {
    SKIP_WITHOUT_GPU();
    cudaStream_t s;
    ck(cudaStreamCreate(&s));
    Workspace ws(ncu::matmul_workspace_bytes(512, 64, 8), s);
    Dev<uint8_t> dw(size_t(64) * 512 * 4 + 16);
    Dev<float> dx(8 * 512), dy(8 * 64);
    EXPECT_FALSE(ncu::matmul_supports(GgmlType::Q8_K));
    EXPECT_THROW(ncu::matmul({GgmlType::Q8_K, 512, 64, dw.p, 0}, dx.p, 1, dy.p, ws.ws, s),
                 nt::Error);
    EXPECT_THROW(ncu::matmul({GgmlType::Q4_K, 500, 64, dw.p, 0}, dx.p, 1, dy.p, ws.ws, s),
                 nt::Error);  // 500 % 256
    EXPECT_THROW(ncu::matmul({GgmlType::Q4_K, 512, 64, dw.p + 2, 0}, dx.p, 1, dy.p, ws.ws, s),
                 nt::Error);  // misaligned
    EXPECT_THROW(ncu::matmul({GgmlType::Q4_K, 512, 64, dw.p, 0}, dx.p, 0, dy.p, ws.ws, s),
                 nt::Error);
    cudaStreamDestroy(s);
}

}  // namespace
