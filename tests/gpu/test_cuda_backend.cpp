// CudaBackend against the CPU backend (the reference), op by op on random data, then whole
// layers through the real forward pass; long contexts against a double-precision host
// reference (the CPU backend would take minutes there). Every test skips without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "../common/attention_reference.h"
#include "../common/fixtures.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/ops.cuh"
#include "core/error.h"
#include "core/f16.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/llama.h"
#include "quant/quant.h"
#include "quant/types.h"

namespace nt {
namespace {

#define NT_REQUIRE_GPU()                                                           \
    do {                                                                           \
        if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA GPU"; \
    } while (0)

// Every element within atol + rtol * |want|; reports the first offender and the worst error.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol,
                  float rtol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double err = std::fabs(double(got[i]) - double(want[i]));
        if (!(err <= atol + rtol * std::fabs(want[i]))) {  // NaN counts as bad
            if (bad++ == 0) first = i;
        }
        if (err > worst || std::isnan(err)) worst = err;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " values off; first at "
                       << first << " got " << got[first] << " want " << want[first]
                       << "; worst error " << worst;
}

void expect_equal(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); i++)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            ADD_FAILURE() << what << ": first difference at " << i << ": got " << got[i] << " want "
                          << want[i];
            return;
        }
}

// Relative L2 error ||got - want|| / ||want||.
double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double d = double(got[i]) - double(want[i]);
        num += d * d;
        den += double(want[i]) * double(want[i]);
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

// Both backends initialised with the same shape; activations are set and read through helpers
// that know the CPU's are host memory and the GPU's are device memory.
struct Pair {
    CpuBackend cpu;
    CudaBackend gpu;
    ModelShape shape;
    Pair(const ModelShape& s, int max_batch, int n_seq, int n_ctx) : shape(s) {
        cpu.init(s, max_batch, n_seq, n_ctx);
        gpu.init(s, max_batch, n_seq, n_ctx);
    }
    // Pointers are the field of Activations to use, e.g. &Activations::q.
    void set(float* Activations::*field, const std::vector<float>& v) {
        std::memcpy(cpu.acts().*field, v.data(), v.size() * sizeof(float));
        gpu.upload(gpu.acts().*field, v.data(), v.size() * sizeof(float));
    }
    std::vector<float> get_cpu(float* Activations::*field, size_t n) {
        std::vector<float> r(n);
        cpu.download(cpu.acts().*field, r.data(), n);
        return r;
    }
    std::vector<float> get_gpu(float* Activations::*field, size_t n) {
        std::vector<float> r(n);
        gpu.download(gpu.acts().*field, r.data(), n);
        return r;
    }
    void begin(const Batch& b) {
        cpu.begin_step(b);
        gpu.begin_step(b);
    }
};

// ---- weights -------------------------------------------------------------------------------

// A weight tensor in host memory (CPU backend reads it in place) and its GPU upload.
struct HostWeight {
    std::vector<uint8_t> bytes;
    WeightView view;  // data -> bytes
};

float small_scale(std::mt19937& rng, float hi) {
    return std::uniform_real_distribution<float>(hi / 8, hi)(rng);
}

// Random blocks of type t: every bit pattern of the quants, scales set to finite values.
HostWeight random_weight(GgmlType t, int64_t rows, int64_t cols, uint32_t seed, float amp = 1.f) {
    HostWeight w;
    w.view.type = t;
    w.view.rows = rows;
    w.view.cols = cols;
    w.view.nbytes = row_bytes(t, cols) * size_t(rows);
    w.bytes.resize(w.view.nbytes);
    std::mt19937 rng(seed);
    const TypeTraits& tr = traits(t);
    const size_t nblocks = w.view.nbytes / size_t(tr.block_bytes);
    auto put16 = [&](size_t block, size_t off, float v) {
        const uint16_t h = f32_to_f16(v);
        std::memcpy(w.bytes.data() + block * size_t(tr.block_bytes) + off, &h, 2);
    };
    if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
        const std::vector<float> f = random_floats(size_t(rows * cols), seed, -amp, amp);
        for (size_t i = 0; i < f.size(); i++) {
            if (t == GgmlType::F32) std::memcpy(w.bytes.data() + 4 * i, &f[i], 4);
            const uint16_t h = t == GgmlType::F16 ? f32_to_f16(f[i]) : f32_to_bf16(f[i]);
            if (t != GgmlType::F32) std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        }
        w.view.data = w.bytes.data();
        return w;
    }
    for (uint8_t& b : w.bytes) b = uint8_t(rng());
    for (size_t b = 0; b < nblocks; b++) {
        const float sign = (rng() & 1) ? 1.f : -1.f;
        switch (t) {
            case GgmlType::Q4_0:
                put16(b, offsetof(block_q4_0, d), sign * small_scale(rng, amp / 8));
                break;
            case GgmlType::Q5_0:
                put16(b, offsetof(block_q5_0, d), sign * small_scale(rng, amp / 16));
                break;
            case GgmlType::Q8_0:
                put16(b, offsetof(block_q8_0, d), sign * small_scale(rng, amp / 128));
                break;
            case GgmlType::Q4_1:
                put16(b, offsetof(block_q4_1, d), small_scale(rng, amp / 8));
                put16(b, offsetof(block_q4_1, m), -small_scale(rng, amp));
                break;
            case GgmlType::Q5_1:
                put16(b, offsetof(block_q5_1, d), small_scale(rng, amp / 16));
                put16(b, offsetof(block_q5_1, m), -small_scale(rng, amp));
                break;
            case GgmlType::Q2_K:
                put16(b, offsetof(block_q2_K, d), small_scale(rng, amp / 32));
                put16(b, offsetof(block_q2_K, dmin), small_scale(rng, amp / 32));
                break;
            case GgmlType::Q3_K:
                put16(b, offsetof(block_q3_K, d), sign * small_scale(rng, amp / 128));
                break;
            case GgmlType::Q4_K:
                put16(b, offsetof(block_q4_K, d), small_scale(rng, amp / 512));
                put16(b, offsetof(block_q4_K, dmin), small_scale(rng, amp / 128));
                break;
            case GgmlType::Q5_K:
                put16(b, offsetof(block_q5_K, d), small_scale(rng, amp / 1024));
                put16(b, offsetof(block_q5_K, dmin), small_scale(rng, amp / 128));
                break;
            case GgmlType::Q6_K:
                put16(b, offsetof(block_q6_K, d), sign * small_scale(rng, amp / 2048));
                break;
            default:
                ADD_FAILURE() << "no generator for " << type_name(t);
        }
    }
    w.view.data = w.bytes.data();
    return w;
}

// A matmul weight quantized from random floats with llama.cpp's rounding (Q8_0 and friends).
HostWeight quantized_weight(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
    HostWeight w;
    w.view.type = t;
    w.view.rows = rows;
    w.view.cols = cols;
    w.view.nbytes = row_bytes(t, cols) * size_t(rows);
    w.bytes.resize(w.view.nbytes);
    const float a = std::sqrt(3.f / float(cols));  // unit-variance outputs for unit-variance inputs
    const std::vector<float> f = random_floats(size_t(rows * cols), seed, -a, a);
    for (int64_t r = 0; r < rows; r++)
        quantize_row(t, f.data() + r * cols, w.bytes.data() + size_t(r) * row_bytes(t, cols), cols);
    w.view.data = w.bytes.data();
    return w;
}

WeightView on_gpu(CudaBackend& gpu, const HostWeight& w) {
    WeightView v = w.view;
    v.data = gpu.upload_weight(w.bytes.data(), w.bytes.size());
    return v;
}

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K};

// The feed-forward weights requested into L2 during the attention (CudaBackend::warm_weights),
// by default: an eighth of each matrix (8B's Q4_K gate and up about 4 MiB, 70B's about 16 MiB),
// Q6_K's 16 MiB, never more than a third of L2 or than either matrix, in whole 16-byte units,
// none for unaligned weights; NT_L2_WARM's setting over the default, under the same caps.
TEST(CudaBackendHost, L2WarmBytesByTypeAndMatrixSize) {
    constexpr int64_t MiB = int64_t(1) << 20, l2 = 50 * MiB;
    alignas(16) static const uint8_t base[32] = {};
    auto view = [&](GgmlType t, int64_t rows, int64_t cols, int offset = 0) {
        return WeightView{t, cols, rows, base + offset, row_bytes(t, cols) * size_t(rows)};
    };
    const WeightView g8 = view(GgmlType::Q4_K, 14336, 4096),
                     g70 = view(GgmlType::Q4_K, 28672, 8192);
    EXPECT_EQ(cuda::l2_warm_bytes(g8, g8, -1, l2), 33030144 / 8 / 16 * 16);  // 4.13 MB
    EXPECT_EQ(cuda::l2_warm_bytes(g70, g70, -1, l2), 132120576 / 8);         // 16.5 MB
    EXPECT_EQ(cuda::l2_warm_bytes(g70, g70, -1, 30 * MiB), 10 * MiB);        // a third of L2
    const WeightView q6 = view(GgmlType::Q6_K, 14336, 4096);
    EXPECT_EQ(cuda::l2_warm_bytes(q6, q6, -1, l2), 16 * MiB);
    const WeightView small = view(GgmlType::Q4_K, 64, 256);  // 9216 bytes: the whole matrix caps it
    EXPECT_EQ(cuda::l2_warm_bytes(small, g8, 1 * MiB, l2), 9216);
    EXPECT_EQ(cuda::l2_warm_bytes(g8, g8, 1000, l2), 992);
    EXPECT_EQ(cuda::l2_warm_bytes(g8, g8, 0, l2), 0);
    EXPECT_EQ(cuda::l2_warm_bytes(view(GgmlType::Q4_K, 14336, 4096, 8), g8, -1, l2), 0);
}

// ---- elementwise ops -----------------------------------------------------------------------

TEST(CudaBackend, EmbedEveryTypeBitExact) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(64, 8, 2);  // n_embd 512: whole K-quant blocks
    Pair p(s, 64, 1, 64);
    Batch b;
    std::mt19937 rng(7);
    for (int i = 0; i < 37; i++) b.add(int32_t(rng() % uint32_t(s.n_vocab)), i, 0, false);
    b.tokens[3] = s.n_vocab - 1;
    b.tokens[4] = 0;
    for (GgmlType t : kAllTypes) {
        const HostWeight w = random_weight(t, s.n_vocab, s.n_embd, 100 + uint32_t(t));
        p.begin(b);
        p.cpu.embed(w.view, p.cpu.acts().x);
        p.gpu.embed(on_gpu(p.gpu, w), p.gpu.acts().x);
        const size_t n = size_t(b.size()) * size_t(s.n_embd);
        expect_equal(p.get_gpu(&Activations::x, n), p.get_cpu(&Activations::x, n),
                     std::string("embed ") + type_name(t));
    }
}

TEST(CudaBackend, RmsNorm) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(64, 8, 2);
    Pair p(s, 64, 1, 64);
    for (int dim : {s.n_embd, 250}) {  // float4 path and scalar path
        for (GgmlType wt : {GgmlType::F32, GgmlType::F16}) {
            for (int n : {1, 5, 64}) {
                const std::vector<float> x =
                    random_floats(size_t(n) * size_t(dim), 11 + uint32_t(n), -3.f, 3.f);
                const HostWeight w = random_weight(wt, 1, dim, 12, 2.f);
                p.set(&Activations::x, x);
                p.cpu.rmsnorm(p.cpu.acts().x, w.view, n, dim, p.cpu.acts().xn);
                p.gpu.rmsnorm(p.gpu.acts().x, on_gpu(p.gpu, w), n, dim, p.gpu.acts().xn);
                const size_t m = size_t(n) * size_t(dim);
                // Bit for bit: the sum of squares in double on both sides (norm_scale).
                expect_equal(p.get_gpu(&Activations::xn, m), p.get_cpu(&Activations::xn, m),
                             "rmsnorm dim " + std::to_string(dim) + " n " + std::to_string(n));
                // In place, as the forward pass's final norm could be.
                p.gpu.rmsnorm(p.gpu.acts().x, on_gpu(p.gpu, w), n, dim, p.gpu.acts().x);
                expect_equal(p.get_gpu(&Activations::x, m), p.get_cpu(&Activations::xn, m),
                             "rmsnorm in place");
            }
        }
    }
}

struct RopeCase {
    int head_dim, n_head, n_head_kv, n_rot;
    float freq_scale;
    bool factors;
};

TEST(CudaBackend, Rope) {
    NT_REQUIRE_GPU();
    const RopeCase cases[] = {
        {64, 4, 1, 64, 1.f, false},  // one KV head
        {128, 8, 2, 128, 1.f, false},
        {128, 4, 1, 128, 0.25f, true},
        {64, 6, 3, 32, 1.f, false},  // partial rotation: dims 32..63 pass through
    };
    for (const RopeCase& c : cases) {
        ModelShape s = make_shape(c.head_dim, c.n_head, c.n_head_kv);
        s.rope.n_rot = c.n_rot;
        s.rope.freq_base = c.factors ? 500000.f : 10000.f;
        s.rope.freq_scale = c.freq_scale;
        if (c.factors) s.rope.freq_factors = random_floats(size_t(c.n_rot / 2), 5, 1.f, 8.f);
        const int n_ctx = 8192;
        Pair p(s, 600, 2, n_ctx);
        // Decode-sized steps (captured as graphs) and prompt-sized ones.
        for (int n : {1, 3, 8, 50, 600}) {
            Batch b;
            std::mt19937 rng(3 + uint32_t(n));
            for (int i = 0; i < n; i++)
                b.add(1, int32_t(rng() % uint32_t(n_ctx)), int32_t(i % 2), false);
            b.pos[0] = 0;
            if (n > 1) b.pos[1] = n_ctx - 1;
            const size_t nq = size_t(b.size()) * size_t(s.n_head) * size_t(s.head_dim);
            const size_t nk = size_t(b.size()) * size_t(s.n_head_kv) * size_t(s.head_dim);
            p.set(&Activations::q, random_floats(nq, 21 + uint32_t(n)));
            p.set(&Activations::k, random_floats(nk, 22 + uint32_t(n)));
            p.begin(b);
            p.cpu.rope(p.cpu.acts().q, p.cpu.acts().k);
            p.gpu.rope(p.gpu.acts().q, p.gpu.acts().k);
            const std::string what = "rope hd " + std::to_string(c.head_dim) + " n_rot " +
                                     std::to_string(c.n_rot) + " n " + std::to_string(n);
            // Bit for bit: the same float angle, sin and cos in double rounded to float, and
            // every product and sum rounded on its own on both sides.
            expect_equal(p.get_gpu(&Activations::q, nq), p.get_cpu(&Activations::q, nq), what + " q");
            expect_equal(p.get_gpu(&Activations::k, nk), p.get_cpu(&Activations::k, nk), what + " k");
        }
    }
}

// A device buffer for the kernel-level tests below.
template <class T>
struct DevBuf {
    T* p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t count) : n(count) {
        EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    }
    explicit DevBuf(const std::vector<T>& v) : DevBuf(v.size()) { put(v); }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    void put(const std::vector<T>& v) {
        EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                  cudaSuccess);
    }
    std::vector<T> get() const {
        std::vector<T> v(n);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return v;
    }
};

// The rope's inverse frequencies for a kernel-level test: base 500000 over n_rot dims, divided
// by Llama-3.1-like factors 1..5 where the case has them.
std::vector<float> inverse_frequencies(const RopeCase& c) {
    std::vector<float> inv(size_t(c.n_rot / 2));
    for (size_t i = 0; i < inv.size(); i++)
        inv[i] = std::pow(500000.f, -2.0f * float(i) / float(c.n_rot)) /
                 (c.factors ? float(1 + i % 5) : 1.f);
    return inv;
}

// The thread-per-pair rope kernel gives the bits of the block-per-row one it replaced (same
// angle, same double-precision sincos, same roundings), over long positions, partial rotation
// and q/k that are not 8-byte aligned (the scalar path).
TEST(CudaKernels, RopeVersionsBitIdentical) {
    NT_REQUIRE_GPU();
    const RopeCase cases[] = {
        {128, 32, 8, 128, 1.f, false},  // Llama-3-8B
        {64, 4, 1, 64, 1.f, false},    {128, 4, 1, 128, 1.f, true},
        {64, 6, 3, 32, 1.f, false},    {96, 3, 1, 64, 1.f, false},
    };
    for (const RopeCase& c : cases) {
        DevBuf<float> dinv(inverse_frequencies(c));
        for (int n : {1, 2, 7, 8, 100, 600}) {
            for (int offset : {0, 1}) {
                std::mt19937 rng(uint32_t(n * 7 + offset));
                std::vector<int32_t> pos(static_cast<size_t>(n));
                for (int32_t& v : pos) v = int32_t(rng() % (1u << 20));
                if (n > 1) {  // (a single row at position 0 would not turn)
                    pos[0] = 0;
                    pos[size_t(n - 1)] = (1 << 20) - 1;
                }
                const size_t nq = size_t(n) * size_t(c.n_head) * size_t(c.head_dim) + 1;
                const size_t nk = size_t(n) * size_t(c.n_head_kv) * size_t(c.head_dim) + 1;
                const std::vector<float> q = random_floats(nq, 50 + uint32_t(n), -4.f, 4.f);
                const std::vector<float> k = random_floats(nk, 60 + uint32_t(n), -4.f, 4.f);
                DevBuf<int32_t> dpos(pos);
                DevBuf<float> q1(q), k1(k), q2(q), k2(k);
                cuda::rope(q1.p + offset, k1.p + offset, dpos.p, n, c.n_head, c.n_head_kv,
                           c.head_dim, c.n_rot, dinv.p, nullptr, 1);
                cuda::rope(q2.p + offset, k2.p + offset, dpos.p, n, c.n_head, c.n_head_kv,
                           c.head_dim, c.n_rot, dinv.p, nullptr, 2);
                const std::string what = "hd " + std::to_string(c.head_dim) + " n_rot " +
                                         std::to_string(c.n_rot) + " n " + std::to_string(n) +
                                         " offset " + std::to_string(offset);
                const std::vector<float> got_q = q2.get(), got_k = k2.get();
                expect_equal(got_q, q1.get(), what + " q");
                expect_equal(got_k, k1.get(), what + " k");
                EXPECT_TRUE(got_q != q) << what << ": q did not turn";
                EXPECT_TRUE(got_k != k) << what << ": k did not turn";
            }
        }
    }
}

// The decode kernel with the rope inside (one row) against rope_kv_store then the same kernel
// without it: the same output and caches, bit for bit, wherever the newest position falls: in
// the first or second tile of its slice (both load before the programmatic wait, the newest row
// written after it) or a later one (loaded in the loop), with one to three slices; in both
// tiled forms.
TEST(CudaKernels, DecodeAttentionRopeInsideAtEveryTile) {
    NT_REQUIRE_GPU();
    cuda::attn_init();
    for (const RopeCase& c :
         {RopeCase{128, 8, 2, 128, 1.f, false}, RopeCase{64, 16, 8, 64, 1.f, true}}) {
        const cuda::AttnShape s{c.n_head, c.n_head_kv, c.head_dim, 512};
        const size_t qd = size_t(s.q_dim()), kd = size_t(s.kv_dim()), cells = size_t(s.n_ctx) * kd;
        std::vector<uint16_t> kc0(cells), vc0(cells);
        const std::vector<float> kr = random_floats(cells, 91), vr = random_floats(cells, 92);
        for (size_t i = 0; i < cells; i++) {
            kc0[i] = f32_to_f16(kr[i]);
            vc0[i] = f32_to_f16(vr[i]);
        }
        const std::vector<float> q = random_floats(qd, 93, -3.f, 3.f), k = random_floats(kd, 94),
                                 v = random_floats(kd, 95);
        DevBuf<float> dinv(inverse_frequencies(c)), dv(v);
        DevBuf<int32_t> dseq(std::vector<int32_t>{0}), drows(std::vector<int32_t>{0});
        for (int splits : {1, 2, 3}) {
            for (int ctx : {1, 30, 32, 33, 64, 65, 100, 128, 129, 200, 300, 512}) {
                const std::string what = "hd " + std::to_string(c.head_dim) + " kv heads " +
                                         std::to_string(c.n_head_kv) + " splits " +
                                         std::to_string(splits) + " ctx " + std::to_string(ctx);
                DevBuf<int32_t> dpos(std::vector<int32_t>{ctx - 1});
                DevBuf<float> scratch(
                    std::max<size_t>(1, cuda::attn_decode_scratch_floats(s, 1, splits)));
                DevBuf<int> done(std::vector<int>(size_t(s.n_head_kv), 0));
                auto run = [&](int version, bool inside, std::vector<uint16_t>& kc,
                               std::vector<uint16_t>& vc) {
                    DevBuf<float> dq(q), dk(k), out(qd);
                    DevBuf<uint16_t> dkc(kc0), dvc(vc0);
                    __half* kh = reinterpret_cast<__half*>(dkc.p);
                    __half* vh = reinterpret_cast<__half*>(dvc.p);
                    const cuda::RopeIn rope{dk.p, dv.p, dinv.p};
                    if (!inside)
                        cuda::rope_kv_store(dq.p, dk.p, dv.p, dpos.p, dseq.p, 1, s.n_head,
                                            s.n_head_kv, s.head_dim, dinv.p, s.n_ctx, kh, vh,
                                            nullptr);
                    cuda::attn_decode(s, dq.p, kh, vh, dpos.p, dseq.p, drows.p, 1, splits,
                                      scratch.p, done.p, out.p, nullptr, version, nullptr, false,
                                      inside ? &rope : nullptr);
                    kc = dkc.get();
                    vc = dvc.get();
                    return out.get();
                };
                // Both tiled forms: the full one (version 2) and the wide one (3): close to
                // the full one.
                std::vector<float> full;
                for (int version : {2, 3}) {
                    const std::string vwhat = what + " version " + std::to_string(version);
                    std::vector<uint16_t> kc1, vc1, kc2, vc2;
                    const std::vector<float> want = run(version, false, kc1, vc1);
                    expect_equal(run(version, true, kc2, vc2), want, vwhat + ": output");
                    EXPECT_TRUE(kc2 == kc1) << vwhat << ": k cache";
                    EXPECT_TRUE(vc2 == vc1) << vwhat << ": v cache";
                    EXPECT_TRUE(done.get() == std::vector<int>(size_t(s.n_head_kv), 0))
                        << vwhat << ": slice counters left at zero";
                    if (version == 2)
                        full = want;
                    else
                        expect_close(want, full, 1e-6f, 1e-5f, vwhat + ": against the full form");
                }
            }
        }
    }
}

// Host reference for add_rmsnorm: x += y, then the CPU backend's norm (double sum of squares).
void add_rmsnorm_reference(std::vector<float>& x, const std::vector<float>* y,
                           const std::vector<float>& w, int n, int dim, float eps,
                           std::vector<float>& out) {
    out.assign(size_t(n) * size_t(dim), 0.f);
    for (int i = 0; i < n; i++) {
        float* xr = &x[size_t(i) * size_t(dim)];
        if (y)
            for (int j = 0; j < dim; j++) xr[j] += (*y)[size_t(i) * size_t(dim) + size_t(j)];
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += double(xr[j]) * double(xr[j]);
        const float scale = 1.0f / std::sqrt(float(ss / dim) + eps);
        for (int j = 0; j < dim; j++)
            out[size_t(i) * size_t(dim) + size_t(j)] = xr[j] * scale * w[size_t(j)];
    }
}

// The fused kernel's int8 activations are quantize_q8's on its own float output, bit for bit,
// in every mode; its x and out agree with the host. dim 576 is not fusable: the launcher runs
// add + rmsnorm and quantizes nothing.
TEST(CudaKernels, AddRmsNormQuantizesAsQuantizeQ8) {
    NT_REQUIRE_GPU();
    using cuda::detail::ActQuant;
    const float eps = 1e-5f;
    for (int dim : {4096, 2048, 256, 8192, 576}) {
        for (int n : {1, 3, 8}) {
            for (GgmlType wt : {GgmlType::F32, GgmlType::F16}) {
                for (ActQuant mode : {ActQuant::Q8_0, ActQuant::Q8_1, ActQuant::Q8_K}) {
                    const size_t m = size_t(n) * size_t(dim);
                    std::vector<float> x = random_floats(m, uint32_t(dim + n), -3.f, 3.f);
                    std::vector<float> y = random_floats(m, uint32_t(dim + n + 1), -3.f, 3.f);
                    // An all-zero 256-element block after the add (zero scale, zero quants).
                    if (dim >= 512)
                        for (int j = 256; j < 512; j++) x[size_t(j)] = y[size_t(j)] = 0.f;
                    const HostWeight w = random_weight(wt, 1, dim, uint32_t(dim), 2.f);
                    std::vector<float> wf(static_cast<size_t>(dim));
                    dequantize_row(wt, w.bytes.data(), wf.data(), dim);
                    DevBuf<float> dx(x), dy(y), dout(m);
                    DevBuf<uint8_t> dw(w.bytes);
                    WeightView wv = w.view;
                    wv.data = dw.p;
                    DevBuf<int8_t> xq(m), xq2(m);
                    DevBuf<float2> xd(m / 32), xd2(m / 32);
                    EXPECT_EQ(cudaMemset(xq.p, 0x55, m), cudaSuccess);
                    cuda::ActivationSlot slot;
                    slot.xq = xq.p;
                    slot.xd = xd.p;
                    slot.mode = mode;
                    const bool quantized =
                        cuda::add_rmsnorm(dx.p, dy.p, wv, n, dim, eps, dout.p, &slot, nullptr);
                    const std::string what = "dim " + std::to_string(dim) + " n " +
                                             std::to_string(n) + " " + type_name(wt) + " mode " +
                                             std::to_string(int(mode));
                    EXPECT_EQ(quantized, dim % 256 == 0) << what;
                    std::vector<float> want_out;
                    add_rmsnorm_reference(x, &y, wf, n, dim, eps, want_out);
                    expect_equal(dx.get(), x, what + " x");
                    expect_equal(dout.get(), want_out, what + " out");
                    if (!quantized) {
                        const std::vector<int8_t> untouched = xq.get();
                        EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(),
                                                [](int8_t v) { return v == 0x55; }))
                            << what << ": wrote quantized activations";
                        continue;
                    }
                    cuda::detail::quantize_q8(dout.p, n, dim, mode, xq2.p, xd2.p, nullptr);
                    EXPECT_TRUE(xq.get() == xq2.get()) << what << " xq";
                    const std::vector<float2> d1 = xd.get(), d2 = xd2.get();
                    EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float2)), 0)
                        << what << " xd";
                }
            }
        }
    }
}

// CudaBackend::add_rmsnorm against the CPU backend's (add, then rmsnorm), as the forward pass
// calls it (out == y) and on its own (no y), fused and not, with and without quantization.
TEST(CudaBackend, AddRmsNorm) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(128, 32, 8);  // n_embd 4096
    Pair p(s, 100, 1, 128);                 // rows at positions 0..99
    for (int dim : {4096, 2048, 576}) {
        const HostWeight w = random_weight(GgmlType::F32, 1, dim, 12, 2.f);
        const WeightView gw = on_gpu(p.gpu, w);
        for (int n : {1, 3, 8, 100}) {
            for (bool with_y : {true, false}) {
                for (GgmlType next : {GgmlType::F16, GgmlType::Q4_K, GgmlType::Q8_0}) {
                    const size_t m = size_t(n) * size_t(dim);
                    Batch b;
                    for (int i = 0; i < n; i++) b.add(1, i, 0, true);
                    p.set(&Activations::x, random_floats(m, 71 + uint32_t(n), -3.f, 3.f));
                    p.set(&Activations::xn, random_floats(m, 72 + uint32_t(n), -3.f, 3.f));
                    p.begin(b);  // decode-sized steps run as graphs
                    for (Backend* be :
                         {static_cast<Backend*>(&p.cpu), static_cast<Backend*>(&p.gpu)}) {
                        Activations& a = be->acts();
                        be->add_rmsnorm(a.x, with_y ? a.xn : nullptr, be == &p.cpu ? w.view : gw, n,
                                        dim, with_y ? a.xn : a.up, next);
                    }
                    const std::string what = "dim " + std::to_string(dim) + " n " +
                                             std::to_string(n) + (with_y ? " x+y " : " x ") +
                                             type_name(next);
                    float* Activations::*out = with_y ? &Activations::xn : &Activations::up;
                    expect_equal(p.get_gpu(&Activations::x, m), p.get_cpu(&Activations::x, m),
                                 what + " x");
                    expect_equal(p.get_gpu(out, m), p.get_cpu(out, m), what + " out");
                }
            }
        }
    }
}

// The matmul after add_rmsnorm uses the activations the norm quantized: overwriting the norm's
// output before the matmul (breaking the x_unchanged promise on purpose) must not change its
// result, which equals the matmul of the norm's output quantized by the matmul itself. A matmul
// whose weights want another activation type quantizes afresh. Then the same with graphs:
// replays equal eager runs.
TEST(CudaBackend, AddRmsNormFeedsTheNextMatmul) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(128, 32, 8);  // n_embd 4096
    const int dim = s.n_embd, rows = 256;
    Pair p(s, 16, 1, 64);
    p.gpu.set_graphs(false);
    const HostWeight norm = random_weight(GgmlType::F32, 1, dim, 41, 2.f);
    const WeightView gnorm = on_gpu(p.gpu, norm);
    auto matrix = [&](GgmlType t, uint32_t seed) {
        return can_quantize(t) ? quantized_weight(t, rows, dim, seed)
                               : random_weight(t, rows, dim, seed);
    };
    for (GgmlType t :
         {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        const HostWeight W = matrix(t, 42 + uint32_t(t));
        const WeightView gw = on_gpu(p.gpu, W);
        // The other activation family: Q8_K for Q8_0/Q8_1 weights and the reverse.
        const GgmlType other =
            t == GgmlType::Q4_K || t == GgmlType::Q6_K ? GgmlType::Q8_0 : GgmlType::Q4_K;
        for (int n : {1, 3, 8}) {
            const std::string what = std::string(type_name(t)) + " n " + std::to_string(n);
            Batch b;
            for (int i = 0; i < n; i++) b.add(1, i, 0, true);
            const size_t m = size_t(n) * size_t(dim), ny = size_t(n) * size_t(rows);
            const std::vector<float> garbage = random_floats(m, 45, -9.f, 9.f);
            Activations& a = p.gpu.acts();
            auto run = [&](GgmlType next, bool fused) {
                p.set(&Activations::x, random_floats(m, 43 + uint32_t(n), -3.f, 3.f));
                p.set(&Activations::xn, random_floats(m, 44 + uint32_t(n), -3.f, 3.f));
                p.gpu.begin_step(b);
                p.gpu.add_rmsnorm(a.x, a.xn, gnorm, n, dim, a.xn, next);
                const std::vector<float> normed = p.get_gpu(&Activations::xn, m);
                p.gpu.upload(a.xn, garbage.data(), m * sizeof(float));  // not an op: no record
                if (!fused) {  // a fresh step: the matmul quantizes what xn holds
                    p.gpu.upload(a.xn, normed.data(), m * sizeof(float));
                    p.gpu.begin_step(b);
                }
                p.gpu.matmul(gw, a.xn, n, a.q);
                return p.get_gpu(&Activations::q, ny);
            };
            expect_equal(run(t, true), run(t, false), what + ": fused quantization");
            // Quantized for the other family: the matmul must quantize the garbage itself.
            const std::vector<float> mismatched = run(other, true);
            p.gpu.begin_step(b);
            p.gpu.matmul(gw, a.xn, n, a.q);  // xn still holds the garbage
            expect_equal(mismatched, p.get_gpu(&Activations::q, ny),
                         what + ": other activation type quantized afresh");
        }
    }

    // Graphs: a decode step of add_rmsnorm + two matmuls sharing its quantization (Q4_K and
    // Q6_K both read Q8_K), recorded once and replayed with new data, equals eager runs.
    CudaBackend graph_gpu;
    graph_gpu.init(s, 16, 1, 64);
    const HostWeight wk = matrix(GgmlType::Q4_K, 46), w6 = matrix(GgmlType::Q6_K, 47);
    const WeightView gk[2] = {on_gpu(graph_gpu, wk), on_gpu(p.gpu, wk)};
    const WeightView g6[2] = {on_gpu(graph_gpu, w6), on_gpu(p.gpu, w6)};
    const WeightView gn[2] = {on_gpu(graph_gpu, norm), gnorm};
    Batch b;
    b.add(1, 0, 0, true);
    b.add(1, 0, 0, true);
    const int n = 2;
    const size_t m = size_t(n) * size_t(dim), ny = size_t(n) * size_t(rows);
    for (int step = 0; step < 3; step++) {
        const std::vector<float> x = random_floats(m, 80 + uint32_t(step), -3.f, 3.f);
        const std::vector<float> y = random_floats(m, 90 + uint32_t(step), -3.f, 3.f);
        std::vector<float> out[2][2];
        CudaBackend* gpus[2] = {&graph_gpu, &p.gpu};
        for (int g = 0; g < 2; g++) {
            CudaBackend& be = *gpus[g];
            Activations& a = be.acts();
            be.upload(a.x, x.data(), m * sizeof(float));
            be.upload(a.xn, y.data(), m * sizeof(float));
            be.begin_step(b);
            be.add_rmsnorm(a.x, a.xn, gn[g], n, dim, a.xn, GgmlType::Q4_K);
            be.matmul(gk[g], a.xn, n, a.q);
            be.matmul(g6[g], a.xn, n, a.k);
            for (int o = 0; o < 2; o++) {
                out[g][o].resize(ny);
                be.download(o == 0 ? a.q : a.k, out[g][o].data(), ny);
            }
        }
        expect_equal(out[0][0], out[1][0], "graph vs eager Q4_K, step " + std::to_string(step));
        expect_equal(out[0][1], out[1][1], "graph vs eager Q6_K, step " + std::to_string(step));
    }
    EXPECT_EQ(graph_gpu.graph_stats().captures, 1);
    EXPECT_EQ(graph_gpu.graph_stats().replays, 2);
    EXPECT_EQ(graph_gpu.graph_stats().fallbacks, 0);
}

TEST(CudaBackend, SwigluAddGather) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(64, 4, 1);
    Pair p(s, 64, 4, 64);
    for (int64_t n :
         {int64_t(1), int64_t(1001), int64_t(64) * s.n_ff}) {  // odd: scalar path; else float4
        p.set(&Activations::gate, random_floats(size_t(n), 31, -8.f, 8.f));
        p.set(&Activations::up, random_floats(size_t(n), 32, -2.f, 2.f));
        p.cpu.swiglu(p.cpu.acts().gate, p.cpu.acts().up, n, p.cpu.acts().gate);
        p.gpu.swiglu(p.gpu.acts().gate, p.gpu.acts().up, n, p.gpu.acts().gate);
        // Bit for bit: exp in double rounded to float on both sides (detail::silu_mul).
        expect_equal(p.get_gpu(&Activations::gate, size_t(n)),
                     p.get_cpu(&Activations::gate, size_t(n)), "swiglu n " + std::to_string(n));

        const int64_t na =
            std::min<int64_t>(n, int64_t(64) * s.n_embd);  // x is [max_batch][n_embd]
        p.set(&Activations::x, random_floats(size_t(na), 33));
        p.set(&Activations::xn, random_floats(size_t(na), 34));
        p.cpu.add(p.cpu.acts().x, p.cpu.acts().xn, na);
        p.gpu.add(p.gpu.acts().x, p.gpu.acts().xn, na);
        expect_equal(p.get_gpu(&Activations::x, size_t(na)), p.get_cpu(&Activations::x, size_t(na)),
                     "add n " + std::to_string(na));
    }
    // Logit rows: a scattered selection, into another buffer and compacted in place.
    Batch b;
    const int flags[] = {1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1};
    for (int i = 0; i < 11; i++) b.add(0, i, 0, flags[i] != 0);
    const int dim = s.n_embd;
    const size_t rows = size_t(b.size()) * size_t(dim), out = size_t(b.n_logits()) * size_t(dim);
    p.set(&Activations::x, random_floats(rows, 35));
    p.begin(b);
    p.cpu.gather_logit_rows(p.cpu.acts().x, dim, p.cpu.acts().xn);
    p.gpu.gather_logit_rows(p.gpu.acts().x, dim, p.gpu.acts().xn);
    expect_equal(p.get_gpu(&Activations::xn, out), p.get_cpu(&Activations::xn, out), "gather");
    p.cpu.gather_logit_rows(p.cpu.acts().x, dim, p.cpu.acts().x);
    p.gpu.gather_logit_rows(p.gpu.acts().x, dim, p.gpu.acts().x);
    expect_equal(p.get_gpu(&Activations::x, out), p.get_cpu(&Activations::xn, out),
                 "gather in place");
}

// ffn_gate_up: the fused pair kernel (one row; Q4_K, Q6_K, Q8_0) and the unfused fallback
// (other types, more rows) against the CPU's matmul + matmul + swiglu, eager and as a graph.
// Then the down projection: with one row the pair also quantizes its output for it (Q8_K, Q8_0
// or Q8_1 by the down weight's type), which must be bit for bit what the matmul's own
// quantization of the same floats gives.
TEST(CudaBackend, FfnGateUp) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(128, 32, 8);  // n_embd 4096, n_ff 14336
    Pair p(s, 8, 1, 64);
    const int dim = s.n_embd, ff = 1024;  // ff rows of the gate/up projections
    const GgmlType downs[] = {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_1};
    std::vector<HostWeight> wd;
    std::vector<WeightView> gd;
    for (GgmlType t : downs) {
        wd.push_back(random_weight(t, 256, ff, 77 + uint32_t(t)));
        gd.push_back(on_gpu(p.gpu, wd.back()));
    }
    int round = 0;
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0}) {
        const HostWeight wg = random_weight(t, ff, dim, 81 + uint32_t(t));
        const HostWeight wu = random_weight(t, ff, dim, 91 + uint32_t(t));
        const WeightView gg = on_gpu(p.gpu, wg), gu = on_gpu(p.gpu, wu);
        for (int n : {1, 3}) {
            for (bool graphs : {false, true}) {
                p.gpu.set_graphs(graphs);
                Batch b;
                for (int i = 0; i < n; i++) b.add(0, i, 0, true);
                const size_t m = size_t(n) * size_t(dim);
                p.set(&Activations::xn, random_floats(m, 101 + uint32_t(n), -2.f, 2.f));
                for (int rep = 0; rep < (graphs ? 3 : 1); rep++) {  // capture, then replays
                    const size_t d = size_t(round++) % gd.size();
                    p.begin(b);
                    p.cpu.ffn_gate_up(wg.view, wu.view, p.cpu.acts().xn, n, p.cpu.acts().gate,
                                      p.cpu.acts().up, downs[d]);
                    p.gpu.ffn_gate_up(gg, gu, p.gpu.acts().xn, n, p.gpu.acts().gate,
                                      p.gpu.acts().up, downs[d]);
                    p.gpu.matmul(gd[d], p.gpu.acts().gate, n, p.gpu.acts().x);
                    p.gpu.end_step();
                    const std::string what = std::string(type_name(t)) + " n " + std::to_string(n) +
                                             (graphs ? " graph " : " eager ") +
                                             std::to_string(rep) + " then " + type_name(downs[d]);
                    expect_close(p.get_gpu(&Activations::gate, size_t(n) * ff),
                                 p.get_cpu(&Activations::gate, size_t(n) * ff), 2e-4f, 2e-4f, what);
                    // The down projection again, quantizing gate itself (a new step forgets
                    // any quantization): the same bits.
                    const std::vector<float> fused = p.get_gpu(&Activations::x, size_t(n) * 256);
                    p.gpu.begin_step(b);
                    p.gpu.matmul(gd[d], p.gpu.acts().gate, n, p.gpu.acts().x);
                    p.gpu.end_step();
                    expect_equal(fused, p.get_gpu(&Activations::x, size_t(n) * 256),
                                 what + " down projection");
                }
            }
        }
    }
    p.gpu.set_graphs(true);
}

// qkv: one activation quantization for all three where the types allow, three matmuls
// otherwise; the matrices of one type with the pipe kernel as one stacked launch (and Q6_K's k
// and v with q where the stack takes the TMA form, sm_90), else k and v on side streams beside
// q. Against the CPU, and bit for bit against three matmuls on the GPU (each row summed in the
// same order) where each matrix's own GEMV is the one stacked, eager and as a graph (capture,
// replays); Q6_K's k and v, whose own GEMV (staged) sums in another order, bit for bit against
// the eager qkv.
TEST(CudaBackend, QkvStackedOrForked) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(128, 32, 8);  // n_embd 4096: q 4096 rows, k and v 1024
    Pair p(s, 8, 1, 64);
    const int dim = s.n_embd, nq = s.n_head * s.head_dim, nkv = s.n_head_kv * s.head_dim;
    struct Types {
        GgmlType q, k, v;
    };
    // Q4_K_M's two mixes (one row: all three stacked; q and k stacked, v after them; more
    // rows: forked); Q8_0 everywhere (forked); Q6_K everywhere (one row: stacked in the TMA
    // form on sm_90, else forked); activation quantizations that differ.
    for (Types t : {Types{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K},
                    Types{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K},
                    Types{GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0},
                    Types{GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q6_K},
                    Types{GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q4_1}}) {
        const HostWeight wq = random_weight(t.q, nq, dim, 111),
                         wk = random_weight(t.k, nkv, dim, 112),
                         wv = random_weight(t.v, nkv, dim, 113);
        const WeightView gq = on_gpu(p.gpu, wq), gk = on_gpu(p.gpu, wk), gv = on_gpu(p.gpu, wv);
        for (int n : {1, 3, 8}) {
            Batch b;
            for (int i = 0; i < n; i++) b.add(0, i, 0, true);
            p.set(&Activations::xn, random_floats(size_t(n) * dim, 121 + uint32_t(n), -2.f, 2.f));
            // Reference: three matmuls on each backend, eagerly.
            p.gpu.set_graphs(false);
            p.begin(b);
            Activations& c = p.cpu.acts();
            Activations& g = p.gpu.acts();
            p.cpu.matmul(wq.view, c.xn, n, c.q);
            p.cpu.matmul(wk.view, c.xn, n, c.k);
            p.cpu.matmul(wv.view, c.xn, n, c.v);
            p.gpu.matmul(gq, g.xn, n, g.q);
            p.gpu.matmul(gk, g.xn, n, g.k);
            p.gpu.matmul(gv, g.xn, n, g.v);
            p.gpu.end_step();
            const size_t mq = size_t(n) * nq, mk = size_t(n) * nkv;
            const auto seq_q = p.get_gpu(&Activations::q, mq);
            auto seq_k = p.get_gpu(&Activations::k, mk), seq_v = p.get_gpu(&Activations::v, mk);
            // Q6_K's k and v may join a TMA-form stack: their reference is the first qkv.
            const bool k_v_join = t.k == GgmlType::Q6_K && t.q == GgmlType::Q6_K && n == 1;
            const auto cpu_q = p.get_cpu(&Activations::q, mq),
                       cpu_k = p.get_cpu(&Activations::k, mk),
                       cpu_v = p.get_cpu(&Activations::v, mk);
            for (bool graphs : {false, true}) {
                p.gpu.set_graphs(graphs);
                for (int rep = 0; rep < (graphs ? 3 : 1); rep++) {
                    p.set(&Activations::q, std::vector<float>(mq, NAN));
                    p.set(&Activations::k, std::vector<float>(mk, NAN));
                    p.set(&Activations::v, std::vector<float>(mk, NAN));
                    p.begin(b);
                    p.gpu.qkv(gq, gk, gv, g.xn, n, g.q, g.k, g.v);
                    p.gpu.end_step();
                    const std::string what = std::string(type_name(t.q)) + "/" + type_name(t.v) +
                                             " n " + std::to_string(n) +
                                             (graphs ? " graph " : " eager ") + std::to_string(rep);
                    if (k_v_join && !graphs) {
                        seq_k = p.get_gpu(&Activations::k, mk);
                        seq_v = p.get_gpu(&Activations::v, mk);
                    }
                    expect_equal(p.get_gpu(&Activations::q, mq), seq_q, what + " q");
                    expect_equal(p.get_gpu(&Activations::k, mk), seq_k, what + " k");
                    expect_equal(p.get_gpu(&Activations::v, mk), seq_v, what + " v");
                    expect_close(p.get_gpu(&Activations::q, mq), cpu_q, 2e-4f, 2e-4f,
                                 what + " q cpu");
                    expect_close(p.get_gpu(&Activations::v, mk), cpu_v, 2e-4f, 2e-4f,
                                 what + " v cpu");
                    expect_close(p.get_gpu(&Activations::k, mk), cpu_k, 2e-4f, 2e-4f,
                                 what + " k cpu");
                }
            }
        }
    }
    p.gpu.set_graphs(true);
}

// ---- attention against the CPU backend -----------------------------------------------------

struct AttnCase {
    int head_dim, n_head, n_head_kv;
};
std::string name(const AttnCase& c) {
    return "hd " + std::to_string(c.head_dim) + " heads " + std::to_string(c.n_head) + "/" +
           std::to_string(c.n_head_kv);
}

// Runs one attention step on both backends with random q/k/v and compares. Rows of long runs go
// through the F16 tensor-core prefill kernel (F16 Q and P), the rest through the F32 decode path.
// atol kBitExact: the decode kernels, which reproduce the CPU backend's arithmetic bit for bit.
constexpr float kBitExact = 0.f;
void attention_step(Pair& p, const Batch& b, uint32_t seed, float atol, const std::string& what) {
    const ModelShape& s = p.shape;
    const size_t nq = size_t(b.size()) * size_t(s.n_head) * size_t(s.head_dim);
    const size_t nk = size_t(b.size()) * size_t(s.n_head_kv) * size_t(s.head_dim);
    p.set(&Activations::q, random_floats(nq, seed, -3.f, 3.f));  // peaked softmax
    p.set(&Activations::k, random_floats(nk, seed + 1));
    p.set(&Activations::v, random_floats(nk, seed + 2));
    p.begin(b);
    p.cpu.attention(0, p.cpu.acts().q, p.cpu.acts().k, p.cpu.acts().v, p.cpu.acts().att);
    p.gpu.attention(0, p.gpu.acts().q, p.gpu.acts().k, p.gpu.acts().v, p.gpu.acts().att);
    p.gpu.end_step();
    if (atol == kBitExact)
        expect_equal(p.get_gpu(&Activations::att, nq), p.get_cpu(&Activations::att, nq), what);
    else
        expect_close(p.get_gpu(&Activations::att, nq), p.get_cpu(&Activations::att, nq), atol,
                     0.f, what);
}

// Against a double-precision host reference (not the CPU backend's arithmetic).
constexpr float kDecodeTol = 2e-5f;
constexpr float kPrefillTol = 4e-3f;  // F16 Q and P on tensor cores, |v| <= 1
// Prompt rows: with the CPU's arithmetic (cuda::prompt_exact(), NT_EXACT_PROMPT=1) the prefill
// kernel that computes it, bit for bit the CPU's; otherwise the F16 prefill kernel's tolerance.
float prompt_tol() {
    return nt::cuda::prompt_exact() ? kBitExact : kPrefillTol;
}

TEST(CudaBackend, AttentionAgainstCpu) {
    NT_REQUIRE_GPU();
    // Decode kernels by group size: the tiled kernel compiled for the group (4, 3, 1, 6, 8)
    // and its runtime-group loop (16), the generic kernel (head_dim 96).
    const AttnCase cases[] = {{64, 4, 1},   {128, 4, 1}, {64, 9, 3},   {128, 8, 8},
                              {128, 24, 4}, {64, 8, 1},  {128, 16, 1}, {96, 4, 2}};
    for (const AttnCase& c : cases) {
        SCOPED_TRACE(name(c));
        ModelShape s = make_shape(c.head_dim, c.n_head, c.n_head_kv);
        const int n_ctx = 1024, max_batch = 600;
        Pair p(s, max_batch, 4, n_ctx);
        // A 600-token prompt of sequence 0: ten tiles (the last one partial).
        Batch b;
        for (int i = 0; i < 600; i++) b.add(1, i, 0, false);
        attention_step(p, b, 1, prompt_tol(), "prompt 600");
        // A mixed step: a 100-token prompt of sequence 1, a decode row of sequence 0, a 5-token
        // run of sequence 2 (too short for a tile: decode rows).
        b.clear();
        for (int i = 0; i < 100; i++) b.add(1, i, 1, false);
        b.add(1, 600, 0, true);
        for (int i = 0; i < 5; i++) b.add(1, i, 2, false);
        attention_step(p, b, 2, prompt_tol(), "mixed");
        // Decode steps of 1..8 rows over the three sequences (graph-sized steps), and a 9-row step.
        int len[3] = {601, 100, 5};
        for (int rows = 1; rows <= 9; rows++) {
            b.clear();
            for (int r = 0; r < rows; r++) {
                const int sq = r % 3;
                b.add(1, len[sq]++, sq, true);
            }
            attention_step(p, b, 10 + uint32_t(rows), kBitExact,
                           "decode rows " + std::to_string(rows));
        }
        // Batch sizes across the tile boundaries, each a fresh sequence 3 from position 0.
        for (int n : {1, 2, 16, 17, 63, 64, 65, 128, 129, 300}) {
            b.clear();
            for (int i = 0; i < n; i++) b.add(1, i, 3, false);
            attention_step(p, b, 100 + uint32_t(n),
                           n > CudaBackend::kGraphMaxBatch ? prompt_tol() : kBitExact,
                           "prompt " + std::to_string(n));
        }
        // A prompt that goes on where the last one stopped (300): its tiles start inside a
        // chunk of the context.
        b.clear();
        for (int i = 0; i < 77; i++) b.add(1, 300 + i, 3, false);
        attention_step(p, b, 500, prompt_tol(), "prompt 77 at 300");
    }
}

// ---- long contexts against a host reference --------------------------------------------------


// Runs one GPU attention step on random q/k/v; checks `check_rows` (all when empty).
void gpu_attention_step(CudaBackend& gpu, const ModelShape& s, KvMirror& kv, const Batch& b,
                        uint32_t seed, float atol, std::vector<int> check_rows,
                        const std::string& what) {
    const int qd = s.n_head * s.head_dim, kd = s.n_head_kv * s.head_dim;
    const std::vector<float> q = random_floats(size_t(b.size()) * qd, seed, -3.f, 3.f);
    const std::vector<float> k = random_floats(size_t(b.size()) * kd, seed + 1);
    const std::vector<float> v = random_floats(size_t(b.size()) * kd, seed + 2);
    for (int i = 0; i < b.size(); i++)
        kv.store(b.seq[size_t(i)], b.pos[size_t(i)], &k[size_t(i) * kd], &v[size_t(i) * kd]);
    gpu.upload(gpu.acts().q, q.data(), q.size() * sizeof(float));
    gpu.upload(gpu.acts().k, k.data(), k.size() * sizeof(float));
    gpu.upload(gpu.acts().v, v.data(), v.size() * sizeof(float));
    gpu.begin_step(b);
    gpu.attention(0, gpu.acts().q, gpu.acts().k, gpu.acts().v, gpu.acts().att);
    std::vector<float> out(q.size());
    gpu.download(gpu.acts().att, out.data(), out.size());
    if (check_rows.empty())
        for (int i = 0; i < b.size(); i++) check_rows.push_back(i);
    for (int i : check_rows) {
        const std::vector<float> want =
            reference_row(s, kv, &q[size_t(i) * qd], b.seq[size_t(i)], b.pos[size_t(i)]);
        const std::vector<float> got(out.begin() + ptrdiff_t(i) * qd,
                                     out.begin() + ptrdiff_t(i + 1) * qd);
        expect_close(
            got, want, atol, 0.f,
            what + " row " + std::to_string(i) + " pos " + std::to_string(b.pos[size_t(i)]));
    }
}

// rope_attention (one kernel turns q and k and fills the cache, where every pair turns; at one
// decode row the attention kernel itself does) against the CPU's rope then attention: a prompt
// (prefill kernel) and decode steps that read what the earlier steps stored, over more than one
// context slice (the decode kernel's own merge); partial rotation takes the unfused path. Then the
// output projection: at decode the attention kernel quantizes the output for it (Q8_K, Q8_0 and
// Q8_1 by the weight's type), which must be bit for bit what the matmul's own quantization of the
// same floats gives.
TEST(CudaBackend, RopeAttention) {
    NT_REQUIRE_GPU();
    for (const RopeCase& c :
         {RopeCase{128, 8, 2, 128, 1.f, false}, RopeCase{64, 4, 1, 64, 1.f, true},
          RopeCase{64, 6, 3, 32, 1.f, false}}) {
        ModelShape s = make_shape(c.head_dim, c.n_head, c.n_head_kv);
        s.rope.n_rot = c.n_rot;
        if (c.factors) s.rope.freq_factors = random_floats(size_t(c.n_rot / 2), 5, 1.f, 8.f);
        Pair p(s, 128, 2, 256);
        const int qd = s.n_head * s.head_dim;  // == n_embd: wo is qd x qd
        std::vector<GgmlType> next = {GgmlType::Q8_0, GgmlType::Q4_1};
        // Q6_K: a decode row's attention then has its multiprocessors to itself (alone).
        if (qd % 256 == 0) next.insert(next.end(), {GgmlType::Q4_K, GgmlType::Q6_K});
        std::vector<HostWeight> wo;
        std::vector<WeightView> gwo;
        for (GgmlType t : next) {
            wo.push_back(random_weight(t, qd, qd, 71 + uint32_t(t)));
            gwo.push_back(on_gpu(p.gpu, wo.back()));
        }
        int pos = 0;
        for (int step = 0; step < 7; step++) {
            const int n = step == 0 ? 100 : 1;  // decode then reads 101.. positions: two slices
            const size_t o = size_t(step) % next.size();
            Batch b;
            for (int i = 0; i < n; i++) b.add(1, pos++, 1, true);
            const size_t nq = size_t(n) * size_t(s.n_head) * size_t(s.head_dim);
            const size_t nk = size_t(n) * size_t(s.n_head_kv) * size_t(s.head_dim);
            const std::vector<float> q = random_floats(nq, 41 + uint32_t(step), -3.f, 3.f),
                                     k = random_floats(nk, 51 + uint32_t(step)),
                                     v = random_floats(nk, 61 + uint32_t(step));
            p.set(&Activations::q, q);
            p.set(&Activations::k, k);
            p.set(&Activations::v, v);
            p.begin(b);
            Activations& ca = p.cpu.acts();
            Activations& ga = p.gpu.acts();
            p.cpu.rope_attention(0, ca.q, ca.k, ca.v, ca.att, next[o]);
            const std::string what = "hd " + std::to_string(c.head_dim) + " n_rot " +
                                     std::to_string(c.n_rot) + " step " + std::to_string(step) +
                                     " then " + type_name(next[o]);
            // First with the rope in its own kernel (q and k then turned in place, as on the
            // CPU); at one decode row again with the attention kernel doing it (leaving q and k
            // as they were), which must give the same bits and store the same cache cell (the
            // later steps read it).
            p.gpu.set_rope_fusion(false);
            p.gpu.rope_attention(0, ga.q, ga.k, ga.v, ga.att, next[o]);
            p.gpu.end_step();
            // Bit for bit: the same float angle, sin and cos in double rounded to float, and
            // every product and sum rounded on its own on both sides.
            expect_equal(p.get_gpu(&Activations::q, nq), p.get_cpu(&Activations::q, nq), what + " q");
            expect_equal(p.get_gpu(&Activations::k, nk), p.get_cpu(&Activations::k, nk), what + " k");
            const std::vector<float> unfused = p.get_gpu(&Activations::att, nq);
            p.gpu.set_rope_fusion(true);
            p.gpu.upload(ga.q, q.data(), q.size() * sizeof(float));
            p.gpu.upload(ga.k, k.data(), k.size() * sizeof(float));
            p.gpu.upload(ga.v, v.data(), v.size() * sizeof(float));
            p.gpu.begin_step(b);
            p.gpu.rope_attention(0, ga.q, ga.k, ga.v, ga.att, next[o]);
            p.gpu.matmul(gwo[o], ga.att, n, ga.xn);
            p.gpu.end_step();
            expect_equal(p.get_gpu(&Activations::att, nq), unfused, what + " rope in attention");
            if (n == 1 && c.n_rot == c.head_dim)  // the fused path ran: q and k left alone
                expect_equal(p.get_gpu(&Activations::q, nq), q, what + " q untouched");
            if (step == 0 && !nt::cuda::prompt_exact())
                expect_close(p.get_gpu(&Activations::att, nq), p.get_cpu(&Activations::att, nq),
                             kPrefillTol, 0.f, what + " attention");
            else  // decode, or a prompt with the CPU's arithmetic
                expect_equal(p.get_gpu(&Activations::att, nq), p.get_cpu(&Activations::att, nq),
                             what + " attention");
            // The projection again, on the attention output's floats quantized by the matmul
            // itself (a new step forgets any quantization): the same bits.
            const std::vector<float> fused = p.get_gpu(&Activations::xn, nq);
            p.gpu.begin_step(b);
            p.gpu.matmul(gwo[o], ga.att, n, ga.xn);
            p.gpu.end_step();
            expect_equal(fused, p.get_gpu(&Activations::xn, nq), what + " output projection");
        }
    }
}

TEST(CudaBackend, AttentionLongContext) {
    NT_REQUIRE_GPU();
    for (const AttnCase& c : {AttnCase{128, 4, 1}, AttnCase{64, 4, 1}, AttnCase{128, 32, 8}}) {
        SCOPED_TRACE(name(c));
        ModelShape s = make_shape(c.head_dim, c.n_head, c.n_head_kv);
        const int n_ctx = 8192, max_batch = 512, n_seq = 3;
        CudaBackend gpu;
        gpu.init(s, max_batch, n_seq, n_ctx);
        KvMirror kv(s.n_head_kv * s.head_dim, n_seq, n_ctx);
        // Prompts through the prefill kernel in chunks of 512: sequence 0 to 8191 positions,
        // 1 to 4096, 2 to 700; a few rows of every chunk checked.
        const int fill[n_seq] = {n_ctx - 1, 4096, 700};
        uint32_t seed = 1000;
        for (int sq = 0; sq < n_seq; sq++) {
            for (int p0 = 0; p0 < fill[sq]; p0 += max_batch) {
                Batch b;
                const int n = std::min(max_batch, fill[sq] - p0);
                for (int i = 0; i < n; i++) b.add(1, p0 + i, sq, false);
                gpu_attention_step(gpu, s, kv, b, seed += 3, kPrefillTol, {0, n / 2, n - 1},
                                   "prefill");
            }
        }
        // Decode: one row at the last position of the context, then all three sequences at once,
        // with graphs (the same step shape replayed with new positions).
        Batch b;
        b.add(1, n_ctx - 1, 0, true);
        gpu_attention_step(gpu, s, kv, b, seed += 3, kDecodeTol, {}, "decode 8191");
        int len[n_seq] = {n_ctx - 1, 4096, 700};
        for (int step = 0; step < 4; step++) {
            b.clear();
            for (int sq = 1; sq < n_seq; sq++) b.add(1, len[sq]++, sq, true);
            b.add(1, 511 + step, 0, true);  // rewrites positions inside sequence 0's context
            gpu_attention_step(gpu, s, kv, b, seed += 3, kDecodeTol, {},
                               "decode step " + std::to_string(step));
        }
    }
}

// The wide decode form (version 3: 256 threads) against the host reference,
// directly on the kernel: groups it is compiled for (1, 3, 4, 8) and its runtime-group loop (5,
// 16), head_dim 64 and 128, contexts across its tile and slice boundaries, one to 64 slices
// (the kernel's own merge), with the slice counters left at zero for the next launch.
TEST(CudaKernels, DecodeAttentionWideFormAgainstHost) {
    NT_REQUIRE_GPU();
    cuda::attn_init();
    const AttnCase cases[] = {{128, 32, 8}, {64, 9, 3},   {128, 64, 8},
                              {64, 4, 4},   {128, 10, 2}, {128, 16, 1}};
    for (const AttnCase& c : cases) {
        SCOPED_TRACE(name(c));
        const ModelShape ms = make_shape(c.head_dim, c.n_head, c.n_head_kv);
        const cuda::AttnShape s{c.n_head, c.n_head_kv, c.head_dim, 8192};
        const size_t kd = size_t(s.kv_dim()), cells = size_t(s.n_ctx) * kd;
        KvMirror kv(int(kd), 1, s.n_ctx);
        std::vector<uint16_t> kh(cells), vh(cells);
        const std::vector<float> kr = random_floats(cells, 71), vr = random_floats(cells, 72);
        for (size_t i = 0; i < cells; i++) {
            kh[i] = f32_to_f16(kr[i]);
            vh[i] = f32_to_f16(vr[i]);
            kv.k[i] = f16_to_f32(kh[i]);
            kv.v[i] = f16_to_f32(vh[i]);
        }
        DevBuf<uint16_t> dkc(kh), dvc(vh);
        const std::vector<float> q = random_floats(size_t(s.q_dim()), 73, -3.f, 3.f);
        DevBuf<float> dq(q), out(size_t(s.q_dim()));
        DevBuf<int32_t> dseq(std::vector<int32_t>{0}), drows(std::vector<int32_t>{0});
        for (int ctx : {1, 31, 32, 33, 64, 100, 1000, 4097, 8192}) {
            DevBuf<int32_t> dpos(std::vector<int32_t>{ctx - 1});
            const std::vector<float> want = reference_row(ms, kv, q.data(), 0, ctx - 1);
            for (int splits : {1, 7, 64}) {
                const std::string what =
                    "ctx " + std::to_string(ctx) + " splits " + std::to_string(splits);
                DevBuf<float> scratch(
                    std::max<size_t>(1, cuda::attn_decode_scratch_floats(s, 1, splits)));
                DevBuf<int> done(std::vector<int>(size_t(s.n_head_kv), 0));
                cuda::attn_decode(s, dq.p, reinterpret_cast<__half*>(dkc.p),
                                  reinterpret_cast<__half*>(dvc.p), dpos.p, dseq.p, drows.p, 1,
                                  splits, scratch.p, done.p, out.p, nullptr, 3);
                expect_close(out.get(), want, kDecodeTol, 0.f, what);
                EXPECT_TRUE(done.get() == std::vector<int>(size_t(s.n_head_kv), 0))
                    << what << ": slice counters left at zero";
            }
        }
    }
}

// ---- whole layers --------------------------------------------------------------------------

struct TestModel {
    LlamaHParams hp;
    std::vector<HostWeight> host;  // keeps the bytes alive
    ModelWeights cpu_w;
};

TestModel make_model(int head_dim, int n_head, int n_head_kv, int n_layer, GgmlType mat_type) {
    TestModel m;
    m.hp.arch = "llama";
    m.hp.shape = make_shape(head_dim, n_head, n_head_kv, n_layer);
    m.hp.shape.n_vocab = 320;
    m.hp.shape.n_ff = 3 * m.hp.shape.n_embd;
    const ModelShape& s = m.hp.shape;
    m.host.reserve(size_t(3 + 9 * n_layer));
    uint32_t seed = 500;
    auto add = [&](HostWeight w) {
        m.host.push_back(std::move(w));
        return m.host.back().view;
    };
    auto norm = [&](int dim) { return add(random_weight(GgmlType::F32, 1, dim, seed++, 1.f)); };
    auto mat = [&](int64_t rows, int64_t cols) {
        return add(can_quantize(mat_type) ? quantized_weight(mat_type, rows, cols, seed++)
                                          : random_weight(mat_type, rows, cols, seed++));
    };
    m.cpu_w.tok_embd = add(random_weight(GgmlType::Q4_K, s.n_vocab, s.n_embd, seed++));
    m.cpu_w.output_norm = norm(s.n_embd);
    m.cpu_w.output = mat(s.n_vocab, s.n_embd);
    const int64_t qd = int64_t(s.n_head) * s.head_dim, kd = int64_t(s.n_head_kv) * s.head_dim;
    for (int l = 0; l < n_layer; l++) {
        LayerWeights L;
        L.attn_norm = norm(s.n_embd);
        L.wq = mat(qd, s.n_embd);
        L.wk = mat(kd, s.n_embd);
        L.wv = mat(kd, s.n_embd);
        L.wo = mat(s.n_embd, qd);
        L.ffn_norm = norm(s.n_embd);
        L.w1 = mat(s.n_ff, s.n_embd);
        L.w3 = mat(s.n_ff, s.n_embd);
        L.w2 = mat(s.n_embd, s.n_ff);
        m.cpu_w.layers.push_back(L);
    }
    return m;
}

ModelWeights upload_model(CudaBackend& gpu, const ModelWeights& w) {
    ModelWeights g = w;
    for_each_weight(g, [&](WeightView& v) { v.data = gpu.upload_weight(v.data, v.nbytes); });
    return g;
}

std::vector<float> forward_logits(Backend& be, const TestModel& m, const ModelWeights& w,
                                  const Batch& b) {
    ResidentWeights src(w);
    llama_forward(m.hp, w, src, be, b);
    std::vector<float> logits(size_t(b.n_logits()) * size_t(m.hp.shape.n_vocab));
    be.download(be.acts().logits, logits.data(), logits.size());
    return logits;
}

struct LayerCase {
    AttnCase attn;
    GgmlType mat_type;
    // Relative L2 error of the logits. F16 weights: the CPU multiplies F32 activations, the GPU
    // F32 (decode) or F16 (prompt) ones, so they agree to ~1e-3. Q8_0 weights: the CPU rounds
    // activations to 8 bits (~0.6% noise per product) where the GPU's prompt path uses F16.
    double tol;
};

TEST(CudaBackend, LayersAgainstCpuAndGraphsAgainstEager) {
    NT_REQUIRE_GPU();
    for (const LayerCase& lc : {LayerCase{{64, 4, 1}, GgmlType::F16, 1e-2},
                                LayerCase{{128, 4, 2}, GgmlType::Q8_0, 5e-2}}) {
        const AttnCase& c = lc.attn;
        SCOPED_TRACE(name(c) + " " + type_name(lc.mat_type));
        const TestModel m = make_model(c.head_dim, c.n_head, c.n_head_kv, 2, lc.mat_type);
        const int max_batch = 128, n_seq = 2, n_ctx = 256;
        CpuBackend cpu;
        cpu.init(m.hp.shape, max_batch, n_seq, n_ctx);
        CudaBackend graph_gpu, eager_gpu;
        eager_gpu.set_graphs(false);
        graph_gpu.init(m.hp.shape, max_batch, n_seq, n_ctx);
        eager_gpu.init(m.hp.shape, max_batch, n_seq, n_ctx);
        const ModelWeights gw = upload_model(graph_gpu, m.cpu_w);
        const ModelWeights ew = upload_model(eager_gpu, m.cpu_w);

        // Prompts: 40 tokens of sequence 0 and 20 of sequence 1 in one step (prefill tiles).
        Batch b;
        std::mt19937 rng(9);
        auto tok = [&] { return int32_t(rng() % uint32_t(m.hp.shape.n_vocab)); };
        for (int i = 0; i < 40; i++) b.add(tok(), i, 0, i == 39);
        for (int i = 0; i < 20; i++) b.add(tok(), i, 1, i == 19);
        const std::vector<float> want0 = forward_logits(cpu, m, m.cpu_w, b);
        EXPECT_LT(rel_l2(forward_logits(graph_gpu, m, gw, b), want0), lc.tol) << "prompt";
        EXPECT_LT(rel_l2(forward_logits(eager_gpu, m, ew, b), want0), lc.tol) << "prompt";

        // Decode: both sequences for 6 steps, then sequence 0 alone for 3 (two graph keys).
        int pos[2] = {40, 20};
        for (int step = 0; step < 9; step++) {
            b.clear();
            const int rows = step < 6 ? 2 : 1;
            for (int sq = 0; sq < rows; sq++) b.add(tok(), pos[sq]++, sq, true);
            const std::vector<float> want = forward_logits(cpu, m, m.cpu_w, b);
            const std::vector<float> g = forward_logits(graph_gpu, m, gw, b);
            const std::vector<float> e = forward_logits(eager_gpu, m, ew, b);
            EXPECT_LT(rel_l2(g, want), lc.tol) << "decode step " << step;
            // Same kernels, same launch shapes: a replay that read stale positions or tokens
            // would be far off (equal to the bit unless a kernel accumulates with atomics).
            expect_close(g, e, 1e-5f, 1e-5f, "graph replay vs eager, step " + std::to_string(step));
        }
        // (With NT_CUDA_GRAPHS=0, as under compute-sanitizer, neither backend records graphs.)
        const CudaBackend::GraphStats& st = graph_gpu.graph_stats();
        if (graph_gpu.graphs()) {
            EXPECT_EQ(st.captures, 2);  // keys (2 rows, 2 logits) and (1, 1)
            EXPECT_EQ(st.replays, 7);
            EXPECT_EQ(st.fallbacks, 0);
        }
        EXPECT_EQ(eager_gpu.graph_stats().captures, 0);
    }
}

// A prompt longer than a step (the engine's chunks of max_batch rows): the chunks before the
// last want no logits, and skip the output projection (a matmul of no rows was refused, so every
// prompt longer than -b failed on the GPU). Then the last chunk's logits are the CPU's.
TEST(CudaBackend, PromptChunksWithoutLogits) {
    NT_REQUIRE_GPU();
    const TestModel m = make_model(64, 4, 1, 2, GgmlType::Q8_0);
    CpuBackend cpu;
    CudaBackend gpu;
    cpu.init(m.hp.shape, 32, 1, 128);
    gpu.init(m.hp.shape, 32, 1, 128);
    const ModelWeights gw = upload_model(gpu, m.cpu_w);
    std::mt19937 rng(5);
    Batch b;
    std::vector<float> want, got;
    for (int chunk = 0; chunk < 3; chunk++) {
        b.clear();
        for (int i = 0; i < 32; i++)
            b.add(int32_t(rng() % uint32_t(m.hp.shape.n_vocab)), 32 * chunk + i, 0,
                  chunk == 2 && i == 31);
        want = forward_logits(cpu, m, m.cpu_w, b);
        got = forward_logits(gpu, m, gw, b);
    }
    ASSERT_EQ(got.size(), size_t(m.hp.shape.n_vocab));
    EXPECT_LT(rel_l2(got, want), 5e-2);
}

// A backend set to the CPU's arithmetic on prompts (the CLI's --exact) gives the CPU backend's
// logits bit for bit on a prompt step of 60 rows (the integer GEMM: wgmma for Q8_0 and Q4_K on
// compute capability 9.0, mma.sync for Q6_K's short rows; the exact prefill attention) and on the
// decode steps after it; the same backend set back to FP16 prompts does not (FP16 rounding).
TEST(CudaBackend, ExactPromptGivesTheCpuBits) {
    NT_REQUIRE_GPU();
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        SCOPED_TRACE(type_name(t));
        const TestModel m = make_model(128, 4, 2, 2, t);
        const int max_batch = 128, n_seq = 2, n_ctx = 256;
        CpuBackend cpu;
        cpu.init(m.hp.shape, max_batch, n_seq, n_ctx);
        CudaBackend gpu;
        gpu.set_exact_prompt(true);
        gpu.init(m.hp.shape, max_batch, n_seq, n_ctx);
        ASSERT_TRUE(gpu.exact());
        const ModelWeights gw = upload_model(gpu, m.cpu_w);
        Batch b;
        std::mt19937 rng(11);
        auto tok = [&] { return int32_t(rng() % uint32_t(m.hp.shape.n_vocab)); };
        for (int i = 0; i < 40; i++) b.add(tok(), i, 0, i >= 30);
        for (int i = 0; i < 20; i++) b.add(tok(), i, 1, i == 19);
        expect_equal(forward_logits(gpu, m, gw, b), forward_logits(cpu, m, m.cpu_w, b), "prompt");
        int pos[2] = {40, 20};
        for (int step = 0; step < 3; step++) {
            b.clear();
            for (int sq = 0; sq < 2; sq++) b.add(tok(), pos[sq]++, sq, true);
            expect_equal(forward_logits(gpu, m, gw, b), forward_logits(cpu, m, m.cpu_w, b),
                         "decode step " + std::to_string(step));
        }
        // The FP16 prompt path on the same backend: a new sequence's prompt, close but not equal.
        gpu.set_exact_prompt(false);
        cpu.kv_truncate(0, 0);
        gpu.kv_truncate(0, 0);
        b.clear();
        for (int i = 0; i < 40; i++) b.add(tok(), i, 0, true);
        const std::vector<float> want = forward_logits(cpu, m, m.cpu_w, b);
        const std::vector<float> got = forward_logits(gpu, m, gw, b);
        EXPECT_LT(rel_l2(got, want), 5e-2);
        EXPECT_NE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
}

// Two backends on one small model: `fed` chooses tokens on the device, `host` runs the round
// trip the fed one is checked against.
struct FedAndHost {
    TestModel m = make_model(64, 4, 1, 2, GgmlType::Q8_0);
    CudaBackend fed, host;
    ModelWeights fw, hw;
    std::unique_ptr<ResidentWeights> fsrc, hsrc;
    FedAndHost() {
        fed.init(m.hp.shape, 8, 1, 64);
        host.init(m.hp.shape, 8, 1, 64);
        fw = upload_model(fed, m.cpu_w);
        hw = upload_model(host, m.cpu_w);
        fsrc = std::make_unique<ResidentWeights>(fw);
        hsrc = std::make_unique<ResidentWeights>(hw);
    }
};

// Greedy decoding with the token chosen and fed on the device (Batch::choose, kFedToken, each
// step enqueued before the host has its token) picks what the round trip picks: the best of the
// downloaded logits, fed back from the host. Both backends replay graphs; the fed one's
// choices queue two deep, as generate() keeps them, then kMaxChosen deep. Fed steps upload no
// tables (the choice advances the position on the device): a step with the host's own token
// afterwards must still see its own position.
TEST(CudaBackend, ChosenTokensFeedTheNextStep) {
    NT_REQUIRE_GPU();
    FedAndHost p;
    ASSERT_TRUE(p.fed.feeds_tokens());
    EXPECT_THROW(p.fed.take_token(), Error);  // nothing chosen yet
    Batch b;
    b.add(kFedToken, 0, 0, true);
    EXPECT_THROW(p.fed.begin_step(b), Error);  // names a choice that was never made
    b.clear();
    b.add(17, 0, 0, false);
    b.choose = true;
    EXPECT_THROW(p.fed.begin_step(b), Error);  // a choice with no logits to choose from

    const int n = 12, K = CudaBackend::kMaxChosen;
    const size_t V = size_t(p.m.hp.shape.n_vocab);
    std::vector<int32_t> want, got;
    std::vector<float> row(V);
    int32_t t = 17;
    for (int i = 0; i < n + K; i++) {  // the round trip: logits to the host, argmax, fed back
        b.clear();
        b.add(t, i, 0, true);
        llama_forward(p.m.hp, p.hw, *p.hsrc, p.host, b);
        p.host.download(p.host.acts().logits, row.data(), V);
        t = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        want.push_back(t);
    }
    for (int i = 0; i < n; i++) {
        b.clear();
        b.add(i == 0 ? 17 : kFedToken, i, 0, true);
        b.choose = true;
        llama_forward(p.m.hp, p.fw, *p.fsrc, p.fed, b);
        if (i > 0) got.push_back(p.fed.take_token());
    }
    got.push_back(p.fed.take_token());
    for (int i = n; i < n + K; i++) {  // the ring fills
        b.clear();
        b.add(kFedToken, i, 0, true);
        b.choose = true;
        llama_forward(p.m.hp, p.fw, *p.fsrc, p.fed, b);
    }
    b.clear();
    b.add(kFedToken, n + K, 0, true);
    b.choose = true;
    EXPECT_THROW(p.fed.begin_step(b), Error);  // the ring is full
    for (int i = 0; i < K; i++) got.push_back(p.fed.take_token());
    EXPECT_EQ(got, want);
    if (p.fed.graphs()) {
        EXPECT_GE(p.fed.graph_stats().replays, n + K - 2);
    }

    // The host's own token at the position after the last fed one, then again one position
    // back (a table that differs from the device's only in its position).
    for (int at : {n + K, n + K - 1}) {
        b.clear();
        b.add(want[size_t(at - 1)], at, 0, true);
        std::vector<float> a(V), c(V);
        llama_forward(p.m.hp, p.hw, *p.hsrc, p.host, b);
        p.host.download(p.host.acts().logits, a.data(), V);
        llama_forward(p.m.hp, p.fw, *p.fsrc, p.fed, b);
        p.fed.download(p.fed.acts().logits, c.data(), V);
        EXPECT_EQ(a, c) << "position " << at;
    }
}

// Sampled decoding drawn and fed on the device (Batch::draw: the top-k chain with a uniform the
// host's sampler drew ahead) draws what the host's sampler draws: from the downloaded row in a
// round trip, with a sampler of the same seed, and from the candidates the device drew from,
// with the uniform the device used. Choices queue two deep, as generate() keeps them.
TEST(CudaBackend, DrawnTokensMatchTheHostSampler) {
    NT_REQUIRE_GPU();
    FedAndHost p;
    const int V = p.m.hp.shape.n_vocab, n = 24;
    // A logit bias as a server request carries one (a token twice: added in order).
    const std::vector<std::pair<int32_t, float>> bias = {
        {11, 2.f}, {17, -100.f}, {23, 1.5f}, {101, -0.5f}, {11, 0.25f}};
    for (float temperature : {0.8f, 3.f})
        for (int top_k : {40, 256, 0})  // 0: the whole vocabulary (no top-p)
            for (bool biased : {false, true}) {
                const std::string what = "temperature " + std::to_string(temperature) + ", top-k " +
                                         std::to_string(top_k) + (biased ? ", biased" : "");
                SamplerParams sp;
                sp.seed = 99;
                sp.temperature = temperature;
                sp.top_k = top_k;
                if (top_k == 0) sp.top_p = 1.f;
                Sampler hs(sp, V), fs(sp, V);
                TokenDraw d;
                ASSERT_TRUE(fs.device_draw(d));
                EXPECT_EQ(d.top_k, top_k);
                if (biased) {
                    for (const auto& [id, v] : bias) {
                        d.bias_id[d.n_bias] = id;
                        d.bias[d.n_bias++] = v;
                    }
                }
                std::vector<int32_t> want, got;
                std::vector<float> row(static_cast<size_t>(V));
                int32_t t = 17;
                Batch b;
                for (int i = 0; i < n; i++) {  // the round trip
                    b.clear();
                    b.add(t, i, 0, true);
                    llama_forward(p.m.hp, p.hw, *p.hsrc, p.host, b);
                    p.host.download(p.host.acts().logits, row.data(), row.size());
                    if (biased)
                        for (const auto& [id, v] : bias) row[size_t(id)] += v;
                    want.push_back(t = hs.sample(row.data()));
                }
                int queued = 0;
                std::vector<float> drawn_row;
                auto take = [&] {
                    const DrawnToken t = take_drawn(p.fed, fs, d, drawn_row);
                    queued--;
                    EXPECT_EQ(t.drawn, t.token) << what;
                    got.push_back(t.token);
                };
                for (int i = 0; i < n; i++) {
                    b.clear();
                    b.add(i == 0 ? 17 : kFedToken, i, 0, true);
                    b.choose = true;
                    b.draw = d;
                    b.draw.u = fs.peek_uniform(size_t(queued));
                    llama_forward(p.m.hp, p.fw, *p.fsrc, p.fed, b);
                    queued++;
                    if (i > 0) take();
                }
                take();
                EXPECT_EQ(got, want) << what;
                if (biased) {
                    EXPECT_EQ(std::count(got.begin(), got.end(), 17), 0) << what;
                }
            }
    Batch b;  // a draw past what the kernels take
    b.add(3, 0, 0, true);
    b.choose = true;
    b.draw.top_k = kMaxLogitCandidates + 1;
    b.draw.temperature = 1.f;
    EXPECT_THROW(p.fed.begin_step(b), Error);
    b.draw.top_k = 0;  // top-p over the whole vocabulary
    b.draw.top_p = 0.9f;
    EXPECT_THROW(p.fed.begin_step(b), Error);
    b.draw.top_p = 1.f;
    b.draw.temperature = 0.f;  // greedy takes top-k 1
    EXPECT_THROW(p.fed.begin_step(b), Error);
    b.draw.temperature = 1.f;
    b.draw.top_k = 40;  // a bias on a token past the vocabulary
    b.draw.n_bias = 1;
    b.draw.bias_id[0] = V;
    EXPECT_THROW(p.fed.begin_step(b), Error);
}

// The draw over the whole vocabulary (vocab_draw.h) on the device is the host sampler's, bit
// for bit, on rows of several blocks (the last one partial, a partial last run): random rows
// with -inf, both zeros and subnormals, temperatures, min-p, a logit bias, uniforms at random,
// at both ends and exactly at boundaries of the cumulative weights; the row comes back as the
// step left it (unbiased), and a row with a NaN is refused. A step of no ops but the choice
// draws from the logits uploaded before it.
TEST(CudaBackend, WholeVocabularyDrawsAreTheHostSamplers) {
    NT_REQUIRE_GPU();
    std::mt19937 rng(77);
    for (int V : {1000, 49157, 128256}) {
        ModelShape s = make_shape(64, 4, 1);
        s.n_vocab = V;
        CudaBackend gpu;
        gpu.init(s, 1, 1, 64);
        std::vector<float> row = random_floats(size_t(V), rng(), -12.f, 12.f);
        const float special[] = {-0.f, 0.f, -INFINITY, 1e-40f, -1e-40f};
        for (int i = 0; i < V / 50; i++) row[rng() % uint32_t(V)] = special[rng() % 5];
        row[size_t(V) - 1] = 12.5f;  // the maximum in the partial last block
        int pos = 0, mismatches = 0, draws = 0;
        for (float t : {0.6f, 1.f, 2.5f})
            for (float min_p : {0.f, 0.001f})
                for (bool biased : {false, true}) {
                    SamplerParams sp;
                    sp.temperature = t;
                    sp.top_k = 0;
                    sp.top_p = 1.f;
                    sp.min_p = min_p;
                    Sampler hs(sp, V);
                    TokenDraw d;
                    ASSERT_TRUE(hs.device_draw(d));
                    ASSERT_EQ(d.top_k, 0);
                    std::vector<float> biased_row = row;
                    if (biased) {
                        const std::pair<int32_t, float> bias[] = {
                            {5, 30.f}, {V / 2, 14.f}, {V - 1, -100.f}, {5, -3.5f}};
                        for (const auto& [id, v] : bias) {
                            d.bias_id[d.n_bias] = id;
                            d.bias[d.n_bias++] = v;
                            biased_row[size_t(id)] += v;
                        }
                    }
                    std::vector<double> us = {0.0, 1.0 - 0x1.0p-53};
                    for (int i = 0; i < 8; i++) us.push_back(double(rng() >> 11) * 0x1.0p-53);
                    for (int i = 0; i < 4; i++) {  // a boundary: the mass before a random token
                        const int k = int(rng() % uint32_t(V));
                        double before = 0, all = 0;
                        const float mx =
                            *std::max_element(biased_row.begin(), biased_row.end());
                        for (int j = 0; j < V; j++) {
                            const double w = std::exp(double(biased_row[size_t(j)] - mx) / t);
                            all += w;
                            if (j < k) before += w;
                        }
                        us.push_back(before / all);
                    }
                    for (double u : us) {
                        gpu.upload(gpu.acts().logits, row.data(), row.size() * sizeof(float));
                        Batch b;
                        b.add(3, pos++ % 64, 0, true);
                        b.choose = true;
                        b.draw = d;
                        b.draw.u = u;
                        gpu.begin_step(b);
                        gpu.end_step();
                        std::vector<float> back;
                        const int32_t got = gpu.take_token(nullptr, &back);
                        ASSERT_EQ(back.size(), row.size());
                        ASSERT_EQ(std::memcmp(back.data(), row.data(), row.size() * sizeof(float)),
                                  0);
                        const int32_t want = hs.sample_with(biased_row.data(), u);
                        draws++;
                        if (got != want) {
                            mismatches++;
                            ADD_FAILURE() << "V " << V << " t " << t << " min-p " << min_p
                                          << (biased ? " biased" : "") << " u " << u << ": device "
                                          << got << ", host " << want;
                        }
                    }
                }
        EXPECT_EQ(mismatches, 0) << "of " << draws << " draws, V " << V;
        row[size_t(V) / 3] = NAN;  // refused: the row holds a NaN
        gpu.upload(gpu.acts().logits, row.data(), row.size() * sizeof(float));
        Batch b;
        b.add(3, 0, 0, true);
        b.choose = true;
        b.draw.top_k = 0;
        b.draw.temperature = 1.f;
        gpu.begin_step(b);
        gpu.end_step();
        EXPECT_THROW(gpu.take_token(), Error);
    }
}

// A step that leaves its recorded op sequence runs eagerly and still computes the right thing.
TEST(CudaBackend, GraphFallbackOnDifferentOps) {
    NT_REQUIRE_GPU();
    ModelShape s = make_shape(64, 4, 1);
    Pair p(s, 16, 1, 64);
    if (!p.gpu.graphs()) GTEST_SKIP() << "CUDA graphs are off (NT_CUDA_GRAPHS=0)";
    const int64_t n = 3 * s.n_embd;
    Batch b;
    b.add(1, 0, 0, true);
    auto step = [&](bool twice) {
        p.set(&Activations::x, random_floats(size_t(n), 1));
        p.set(&Activations::xn, random_floats(size_t(n), 2));
        p.begin(b);
        for (Backend* be : {static_cast<Backend*>(&p.cpu), static_cast<Backend*>(&p.gpu)}) {
            be->add(be->acts().x, be->acts().xn, n);
            if (twice) be->add(be->acts().x, be->acts().xn, n);
            be->swiglu(be->acts().x, be->acts().xn, n, be->acts().up);
        }
        expect_equal(p.get_gpu(&Activations::up, size_t(n)), p.get_cpu(&Activations::up, size_t(n)),
                     twice ? "fallback step" : "graph step");
    };
    for (int i = 0; i < 3; i++) step(false);
    EXPECT_EQ(p.gpu.graph_stats().captures, 1);
    EXPECT_EQ(p.gpu.graph_stats().replays, 2);
    step(true);
    EXPECT_EQ(p.gpu.graph_stats().fallbacks, 1);
    step(true);  // recorded anew for the new sequence
    step(true);
    EXPECT_EQ(p.gpu.graph_stats().captures, 2);
    EXPECT_EQ(p.gpu.graph_stats().replays, 3);
}

// ---- the sampler's candidates ----------------------------------------------------------------

// select_logits on the GPU against select_logits_host, bit for bit: vocabularies from one block
// to several hundred thousand (the last past what the kernels take: the row copied back
// instead), rows with ties, both zeros, infinities, subnormals and NaN, every k up to the
// limit, several rows in one call (one launch takes three: the rows in batches of three and one),
// rows of different k in one batch.
void expect_selection_matches_host(std::initializer_list<int> vocabularies) {
    std::mt19937 rng(2024);
    for (int V : vocabularies) {
        ModelShape s = make_shape(64, 4, 1);
        s.n_vocab = V;
        CudaBackend gpu;
        constexpr int kRows = 4;
        gpu.init(s, kRows, 3, 16);  // three sequences: select_logits answers three rows at a time
        std::vector<std::vector<float>> rows(kRows);
        for (int r = 0; r < kRows; r++) {
            std::vector<float>& row = rows[size_t(r)];
            row = random_floats(size_t(V), rng(), -4.f, 4.f);
            const float special[] = {2.5f,      2.5f,   -0.f,    0.f,  INFINITY,
                                     -INFINITY, 1e-40f, -1e-40f, 3.75f};
            for (int i = 0; i < V / 10; i++) row[rng() % uint32_t(V)] = special[rng() % 9];
            if (r == 1) std::fill(row.begin(), row.end(), 0.5f);  // all tied: the lowest ids win
            if (r == 2) row[rng() % uint32_t(V)] = NAN;
            gpu.upload(gpu.acts().logits + size_t(r) * size_t(V), row.data(),
                       row.size() * sizeof(float));
        }
        for (int k : {1, 2, 40, 41, 100, 256, 0}) {  // 0: each row its own k
            std::vector<LogitRequest> req(kRows);
            for (int r = 0; r < kRows; r++) {
                req[size_t(r)].row = (r + k) % kRows;
                req[size_t(r)].k = k > 0 ? k : std::array<int, kRows>{40, 1, 256, 7}[size_t(r)];
                const int n_ids = std::min(kMaxLogitCandidates - req[size_t(r)].k, r * 7);
                for (int i = 0; i < n_ids; i++)
                    req[size_t(r)].ids.push_back(int32_t(rng() % uint32_t(V)));
            }
            std::vector<LogitCandidates> got;
            gpu.select_logits(gpu.acts().logits, V, req, got);
            ASSERT_EQ(got.size(), req.size());
            for (int r = 0; r < kRows; r++) {
                const LogitRequest& q = req[size_t(r)];
                LogitCandidates want;
                select_logits_host(rows[size_t(q.row)].data(), V, q, want);
                const std::string what = "V " + std::to_string(V) + " k " + std::to_string(k) +
                                         " row " + std::to_string(q.row);
                EXPECT_EQ(got[size_t(r)].nan, want.nan) << what;
                ASSERT_EQ(got[size_t(r)].top_id, want.top_id) << what;
                for (size_t i = 0; i < want.top_logit.size(); i++)
                    ASSERT_EQ(got[size_t(r)].top_logit[i], want.top_logit[i])
                        << what << " at " << i;
                ASSERT_EQ(got[size_t(r)].id_logit.size(), q.ids.size()) << what;
                for (size_t i = 0; i < q.ids.size(); i++)
                    ASSERT_EQ(
                        std::memcmp(&got[size_t(r)].id_logit[i], &want.id_logit[i], sizeof(float)),
                        0)
                        << what << " id " << q.ids[i];
            }
        }
        LogitRequest bad;
        bad.k = 0;
        std::vector<LogitCandidates> out;
        EXPECT_THROW(gpu.select_logits(gpu.acts().logits, V, {bad}, out), Error);
        bad.k = 1;
        bad.row = kRows;
        EXPECT_THROW(gpu.select_logits(gpu.acts().logits, V, {bad}, out), Error);
    }
}

TEST(CudaBackend, LogitSelectionMatchesHost) {
    NT_REQUIRE_GPU();
    expect_selection_matches_host({96, 1000, 49152});
}

TEST(CudaBackend, LogitSelectionMatchesHostLargeVocabularies) {
    NT_REQUIRE_GPU();
    expect_selection_matches_host({128256, 200000, 600000});
}

// ---- memory planning and weights -----------------------------------------------------------

TEST(CudaBackend, ClearErrorWhenTheCacheDoesNotFit) {
    NT_REQUIRE_GPU();
    CudaBackend gpu;
    ModelShape s = make_shape(128, 64, 8, 80);  // 70B-like: 320 KiB of KV per position
    try {
        gpu.init(s, 512, 64, 1 << 20);  // 64 sequences x 1M positions: 20 TiB
        FAIL() << "init did not throw";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("not enough GPU memory"), std::string::npos) << msg;
        EXPECT_NE(msg.find("reduce the context (-c)"), std::string::npos) << msg;
    }
    gpu.init(make_shape(64, 4, 1), 8, 1, 128);  // and the backend is still usable
    EXPECT_NE(gpu.acts().x, nullptr);
}

TEST(CudaBackend, WeightsReservation) {
    NT_REQUIRE_GPU();
    CudaBackend gpu;
    gpu.init(make_shape(64, 4, 1), 8, 1, 128);
    const HostWeight a = random_weight(GgmlType::F32, 3, 100, 1),
                     c = random_weight(GgmlType::Q8_0, 2, 64, 2);
    gpu.reserve_weights(a.bytes.size() + c.bytes.size());  // as the engine calls it
    const void* da = gpu.upload_weight(a.bytes.data(), a.bytes.size());
    const void* dc = gpu.upload_weight(c.bytes.data(), c.bytes.size());
    // Carved one after the other from the reservation.
    EXPECT_EQ(static_cast<const char*>(dc),
              static_cast<const char*>(da) + CudaBackend::weight_footprint(a.bytes.size()));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(da) % 256, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(dc) % 256, 0u);
    std::vector<uint8_t> back(a.bytes.size());
    gpu.download(static_cast<const float*>(da), reinterpret_cast<float*>(back.data()),
                 back.size() / 4);
    EXPECT_EQ(back, a.bytes);
    try {
        gpu.reserve_weights(size_t(1) << 50);
        FAIL() << "reserve_weights did not throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not enough GPU memory for the weights"),
                  std::string::npos)
            << e.what();
    }
}

TEST(CudaBackend, ReadBandwidthIsMeasured) {
    NT_REQUIRE_GPU();
    CudaBackend gpu;
    const double gbs = gpu.measure_read_bandwidth();
    std::printf("GPU read bandwidth: %.0f GB/s on %s\n", gbs, describe(gpu.device()).c_str());
    EXPECT_GT(gbs, 100.0);  // any Ampere-or-later GPU's memory is faster than this
}

}  // namespace
}  // namespace nt
