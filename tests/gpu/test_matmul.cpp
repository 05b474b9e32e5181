// CUDA matmul against a CPU reference built from nt::dequantize_row, for every weight type,
// batch sizes on both sides of the GEMV/GEMM switch and awkward shapes.
//
// The reference multiplies in double with exactly what the GPU multiplies: int8-rounded
// activations (reproduced bit for bit on the CPU) for the quantized GEMV, FP16-rounded weights
// and activations for the GEMM path, BF16-rounded activations for BF16 weights. What is left is
// float accumulation, so the tolerance is tight: 5e-5 of sum |w * x| per output (a wrong
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

// The GPU's activation quantization, reproduced: per 32, d = amax/127, q = rint(x * 127/amax).
std::vector<float> q8_roundtrip(const std::vector<float>& x,
                                std::vector<float>* half_step = nullptr) {
    std::vector<float> out(x.size());
    if (half_step) half_step->assign(x.size(), 0.f);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0.f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        for (int i = 0; i < 32; ++i) {
            out[b * 32 + i] = d * float(std::nearbyint(x[b * 32 + i] * id));
            if (half_step) (*half_step)[b * 32 + i] = d / 2;
        }
    }
    return out;
}

std::vector<float> rounded(std::vector<float> v, GgmlType through) {
    for (auto& f : v)
        f = through == GgmlType::BF16 ? nt::bf16_to_f32(nt::f32_to_bf16(f))
                                      : nt::f16_to_f32(nt::f32_to_f16(f));
    return v;
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

    // What the GPU multiplies.
    const bool gemv = n <= ncu::kGemvMaxBatch;
    const bool quantized = !is_float_type(t);
    std::vector<float> half_step;
    std::vector<float> xr =
        gemv ? (quantized ? q8_roundtrip(x, &half_step) : x)
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
        for (int i = 0; i < n; ++i) {
            double s = 0, mag = 0, s_exact = 0, bound = 0;
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
// every quantized type: row and column tails, chunks split unevenly between warps, and (with
// 9001 rows) persistent CTAs that loop over several row tiles.
TEST(MatmulVariants, EveryGemvConfigMatches) {
    SKIP_WITHOUT_GPU();
    using ncu::detail::GemvConfig;
    using ncu::detail::GemvKernel;
    cudaStream_t stream;
    ck(cudaStreamCreate(&stream));
    for (GgmlType t :
         {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
          GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
        const int64_t be = nt::traits(t).block_elems;
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{45, be == 32 ? 32 * 150 : 256 * 19},
                                  std::pair<int64_t, int64_t>{9001, be == 32 ? 32 * 9 : 256 * 2}}) {
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
                const std::vector<float> xr = q8_roundtrip(x);
                std::vector<double> ref(size_t(n) * rows), mag(size_t(n) * rows);
                for (int64_t r = 0; r < rows; ++r)
                    for (int i = 0; i < n; ++i) {
                        double s = 0, m = 0;
                        for (int64_t k = 0; k < cols; ++k) {
                            const double p =
                                double(wf[size_t(r) * cols + k]) * xr[size_t(i) * cols + k];
                            s += p;
                            m += std::fabs(p);
                        }
                        ref[size_t(i) * rows + r] = s;
                        mag[size_t(i) * rows + r] = m;
                    }
                Dev<float> dx(x), dy(size_t(n) * rows);
                Dev<int8_t> xq(size_t(n) * cols);
                Dev<float2> xd(size_t(n) * cols / 32);
                ncu::detail::quantize_q8(dx.p, n, cols, xq.p, xd.p, stream);
                const int nx = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
                int tried = 0;
                for (auto kern : {GemvKernel::Staged, GemvKernel::Direct})
                    for (int rw : {1, 2})
                        for (int ks : {1, 2, 4})
                            for (bool pers : {true, false}) {
                                const GemvConfig c{kern, nx, rw, ks, pers};
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
                                        << (kern == GemvKernel::Direct ? " direct" : " staged")
                                        << (pers ? "-p" : "") << " nx" << nx << " rw" << rw << " k"
                                        << ks << " " << rows << "x" << cols << " n=" << n << " row "
                                        << o % rows << " batch " << o / rows << ": got " << y[o]
                                        << ", want " << ref[o];
                            }
                EXPECT_GE(tried, nx == 8 ? 6 : 12) << nt::type_name(t) << " nx" << nx;
            }
        }
    }
    cudaStreamDestroy(stream);
}

// The activation quantizer is bit-exact with the CPU formula the references rely on.
TEST(MatmulQuantizer, BitExactWithCpuFormula) {
    SKIP_WITHOUT_GPU();
    const int n = 3;
    const int64_t cols = 4096 + 64;
    Rng rng(9);
    std::vector<float> x(size_t(n) * cols);
    for (auto& v : x) v = rng.normal() * 3.f;
    for (int i = 0; i < 32; ++i) x[64 + i] = 0.f;  // an all-zero block
    x[200] = 127.f * 0.5f;                         // exact ties after scaling
    Dev<float> dx(x);
    Dev<int8_t> xq(x.size());
    Dev<float2> xd(x.size() / 32);
    ncu::detail::quantize_q8(dx.p, n, cols, xq.p, xd.p, nullptr);
    ck(cudaDeviceSynchronize());
    const auto q = xq.get();
    const auto d = xd.get();
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0.f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        const float dd = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        int sum = 0;
        for (int i = 0; i < 32; ++i) {
            const int want = int(std::nearbyint(x[b * 32 + i] * id));
            sum += want;
            ASSERT_EQ(int(q[b * 32 + i]), want) << "block " << b << " element " << i;
        }
        ASSERT_EQ(d[b].x, dd) << "block " << b;
        ASSERT_EQ(d[b].y, dd * float(sum)) << "block " << b;
    }
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

// A workspace that holds only a few rows of FP16 weights: the GEMM runs slice by slice.
TEST(MatmulWorkspace, SlicedGemmMatches) {
    SKIP_WITHOUT_GPU();
    const int64_t rows = 700, cols = 512;
    const int n = 16;
    const size_t small =
        (size_t(32) << 20) + size_t(n) * cols * 2 + 256 + size_t(300) * cols * 2;  // 256-row slices
    check_matmul(GgmlType::Q4_K, rows, cols, n, 11, small);
    check_matmul(GgmlType::Q8_0, rows, cols, n, 12, small);
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
