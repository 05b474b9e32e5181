// The small kernels of a Llama layer on their own: embedding lookup (per weight type), RMSNorm,
// rope (both versions), residual add + RMSNorm + activation quantization (three kernels against
// the fused one), SwiGLU, residual add, logit-row gather, the sampler's candidates from a logit
// row (logit_select: the k best of a Llama-3 row, with and without asked ids) and the greedy
// choice fed on the device (logit_choose). Each is checked against a CPU reference
// on random data, then timed; bytes read + written per call against the measured HBM read
// bandwidth. At batch 1 they are launch-bound (a few microseconds whatever the bytes): that is
// what CUDA graphs are for.
//
//   bench_elementwise [--embd 4096] [--ff 14336] [--heads 32] [--kv-heads 8] [--hd 128] [--iters
//   200]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_info.h"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/ops.cuh"
#include "core/error.h"
#include "core/f16.h"
#include "engine/sampler.h"
#include "quant/quant.h"

using namespace nt;
using namespace nt::cuda;

namespace {

struct Opts {
    int embd = 4096, ff = 14336, heads = 32, kv_heads = 8, hd = 128, iters = 200;
};

template <class T>
T* dev_copy(const std::vector<T>& v) {
    void* p = nullptr;
    NT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)), "cudaMalloc");
    NT_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                  "cudaMemcpy");
    return static_cast<T*>(p);
}
template <class T>
std::vector<T> host_copy(const T* d, size_t n) {
    std::vector<T> v(n);
    NT_CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
    double e = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double d = std::fabs(double(got[i]) - want[i]) / (std::fabs(double(want[i])) + 1e-3);
        e = std::isnan(d) ? INFINITY : std::max(e, d);
    }
    return e;
}

double time_us(int iters, const std::function<void()>& launch) {
    launch();
    NT_CUDA_CHECK(cudaDeviceSynchronize(), "warm-up");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < iters; i++) launch();
    cudaEventRecord(e1);
    NT_CUDA_CHECK(cudaEventSynchronize(e1), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return double(ms) * 1e3 / iters;
}

double g_hbm = 0;
int g_iters = 200;

void report(const std::string& what, int rows, double bytes, double err, double tol,
            const std::function<void()>& launch) {
    const double us = time_us(g_iters, launch);
    const double gbs = bytes / (us * 1e-6) / 1e9;
    std::printf("%-22s %5d | %10.0f %8.2f %8.0f %6.1f%% | %.1e%s\n", what.c_str(), rows, bytes, us,
                gbs, 100 * gbs / g_hbm, err, err > tol ? "  <-- WRONG" : "");
}

// Random blocks with finite scales (every quant bit pattern), as the GPU tests make them.
std::vector<uint8_t> random_blocks(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
    if (can_quantize(t)) {  // from floats with llama.cpp's rounding
        const std::vector<float> f = random_floats(size_t(rows * cols), seed);
        std::vector<uint8_t> b(row_bytes(t, cols) * size_t(rows));
        for (int64_t r = 0; r < rows; r++)
            quantize_row(t, f.data() + r * cols, b.data() + size_t(r) * row_bytes(t, cols), cols);
        return b;
    }
    // K-quants: random bytes, then d/dmin (the first or last f16 fields) set small and finite.
    std::vector<uint8_t> b(row_bytes(t, cols) * size_t(rows));
    std::mt19937 rng(seed);
    for (uint8_t& x : b) x = uint8_t(rng());
    const TypeTraits& tr = traits(t);
    for (size_t i = 0; i < b.size(); i += size_t(tr.block_bytes)) {
        const uint16_t d = f32_to_f16(0.001f), dm = f32_to_f16(0.01f);
        size_t od = 0, om = SIZE_MAX;
        switch (t) {
            case GgmlType::Q2_K:
                od = offsetof(block_q2_K, d), om = offsetof(block_q2_K, dmin);
                break;
            case GgmlType::Q3_K:
                od = offsetof(block_q3_K, d);
                break;
            case GgmlType::Q4_K:
                od = offsetof(block_q4_K, d), om = offsetof(block_q4_K, dmin);
                break;
            case GgmlType::Q5_K:
                od = offsetof(block_q5_K, d), om = offsetof(block_q5_K, dmin);
                break;
            case GgmlType::Q6_K:
                od = offsetof(block_q6_K, d);
                break;
            default:
                break;
        }
        std::memcpy(&b[i + od], &d, 2);
        if (om != SIZE_MAX) std::memcpy(&b[i + om], &dm, 2);
    }
    return b;
}

// The sampler's candidates from Llama-3 logit rows, bit for bit against the host's selection
// (the bytes: the rows, read once): one row, then a server step's 8 rows in one call.
void bench_selection() {
    const int V = 128256;
    constexpr int kRows = 8;
    std::vector<std::vector<float>> rows;
    std::vector<float> all;
    for (int r = 0; r < kRows; r++) {
        rows.push_back(random_floats(size_t(V), 11 + r, -20.f, 20.f));
        all.insert(all.end(), rows.back().begin(), rows.back().end());
    }
    float* dlogits = dev_copy(all);
    const float* drow = dlogits;
    unsigned long long* keys = nullptr;
    int* nan = nullptr;
    LogitSelection* out = nullptr;
    LogitAsk* dasks = nullptr;
    NT_CUDA_CHECK(cudaMalloc(&keys, size_t(kRows) * kMergeKeys * sizeof(*keys)), "cudaMalloc");
    NT_CUDA_CHECK(cudaMalloc(&nan, size_t(kRows) * logit_select_nan_stride(V) * sizeof(int)),
                  "cudaMalloc");
    NT_CUDA_CHECK(cudaMalloc(&out, kRows * sizeof(LogitSelection)), "cudaMalloc");
    NT_CUDA_CHECK(cudaMalloc(&dasks, kRows * sizeof(LogitAsk)), "cudaMalloc");
    logit_select_init();
    std::mt19937 rng(12);
    for (int n_rows : {1, kRows})
        for (int k : {1, 40, 256})
            for (int n_ids : {0, 64}) {
                if (k + n_ids > kMaxLogitCandidates || (n_rows > 1 && n_ids > 0)) continue;
                std::vector<LogitRequest> req(static_cast<size_t>(n_rows));
                std::vector<LogitAsk> asks(static_cast<size_t>(n_rows));
                for (int r = 0; r < n_rows; r++) {
                    req[size_t(r)].row = asks[size_t(r)].row = r;
                    req[size_t(r)].k = asks[size_t(r)].m = k;
                    asks[size_t(r)].ids.n = n_ids;
                    for (int i = 0; i < n_ids; i++)
                        req[size_t(r)].ids.push_back(asks[size_t(r)].ids.id[i] =
                                                         int32_t(rng() % V));
                }
                NT_CUDA_CHECK(cudaMemcpy(dasks, asks.data(), asks.size() * sizeof(LogitAsk),
                                         cudaMemcpyHostToDevice),
                              "cudaMemcpy");
                const auto launch = [&] {
                    logit_select(dlogits, V, dasks, n_rows, k, keys, nan, out, nullptr);
                };
                launch();
                std::vector<LogitSelection> h(static_cast<size_t>(n_rows));
                NT_CUDA_CHECK(cudaMemcpy(h.data(), out, h.size() * sizeof(LogitSelection),
                                         cudaMemcpyDeviceToHost),
                              "cudaMemcpy");
                bool same = true;
                for (int r = 0; r < n_rows; r++) {
                    LogitCandidates got, want;
                    logit_selection_unpack(h[size_t(r)], k, n_ids, got);
                    select_logits_host(rows[size_t(r)].data(), V, req[size_t(r)], want);
                    same = same && got.top_id == want.top_id && got.top_logit == want.top_logit &&
                           got.id_logit == want.id_logit && got.nan == want.nan;
                }
                report("select top " + std::to_string(k) + (n_ids ? " +ids" : "") +
                           (n_rows > 1 ? ", " + std::to_string(n_rows) + " rows" : ""),
                       n_rows, double(V) * 4 * n_rows, same ? 0 : 1, 0, launch);
            }
    // The token drawn as a fed step draws it, greedy and with generate's default sampler:
    // the token, the answer ring, the count and the position, against the host's sampler on
    // the same candidates with the same uniform.
    for (bool greedy : {true, false}) {
        SamplerParams sp;
        sp.seed = 5;
        if (greedy) sp.temperature = 0.f;
        Sampler sampler(sp, V);
        TokenDraw d;
        sampler.device_draw(d);
        d.u = sampler.peek_uniform(0);
        int32_t* dint = nullptr;
        TokenDraw* ddraw = nullptr;
        LogitSelection* ring = nullptr;
        NT_CUDA_CHECK(cudaMalloc(&dint, 3 * sizeof(int32_t)), "cudaMalloc");
        NT_CUDA_CHECK(cudaMemset(dint, 0, 3 * sizeof(int32_t)), "cudaMemset");
        NT_CUDA_CHECK(cudaMalloc(&ring, 4 * sizeof(LogitSelection)), "cudaMalloc");
        ddraw = dev_copy(std::vector<TokenDraw>{d});
        LogitChoice c;
        c.fed = dint;
        c.count = dint + 1;
        c.pos = dint + 2;
        c.ring = ring;
        c.ring_size = 4;
        c.draw = ddraw;
        logit_choose(drow, V, d.top_k, keys, nan, c, nullptr);
        const std::vector<int32_t> h = host_copy(dint, 3);
        LogitSelection sel;
        NT_CUDA_CHECK(cudaMemcpy(&sel, ring, sizeof sel, cudaMemcpyDeviceToHost), "cudaMemcpy");
        LogitCandidates from;
        logit_selection_unpack(sel, d.top_k, 0, from);
        LogitRequest req;
        req.k = d.top_k;
        const int32_t want = sampler.sample(req, from);
        const bool ok = h[0] == want && sel.token == want && h[1] == 1 && h[2] == 1;
        report(greedy ? "choose greedy (fed)" : "choose top-40 chain", 1, double(V) * 4, ok ? 0 : 1,
               0, [&] { logit_choose(drow, V, d.top_k, keys, nan, c, nullptr); });
        cudaFree(dint);
        cudaFree(ddraw);
        cudaFree(ring);
    }
    cudaFree(keys);
    cudaFree(nan);
    cudaFree(out);
    cudaFree(dasks);
    cudaFree(dlogits);
}

void bench(const Opts& o) {
    const int vocab = 32000;
    const int qd = o.heads * o.hd, kd = o.kv_heads * o.hd;
    std::printf("%-22s %5s | %10s %8s %8s %7s | %s\n", "op", "rows", "bytes", "us", "GB/s",
                "of HBM", "max rel err");
    for (int rows : {1, 8, 512}) {
        std::mt19937 rng(1);
        std::vector<int32_t> tokens(static_cast<size_t>(rows));
        for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(vocab));
        int32_t* dtok = dev_copy(tokens);
        float* dx = dev_copy(std::vector<float>(size_t(rows) * o.ff));

        for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
            const std::vector<uint8_t> table = random_blocks(t, vocab, o.embd, 2);
            uint8_t* dtab = dev_copy(table);
            const WeightView w{t, o.embd, vocab, dtab, table.size()};
            embed(w, dtok, nullptr, rows, dx, nullptr);
            const std::vector<float> got = host_copy(dx, size_t(rows) * o.embd);
            std::vector<float> want(got.size());
            for (int i = 0; i < rows; i++)
                dequantize_row(t, table.data() + size_t(tokens[size_t(i)]) * row_bytes(t, o.embd),
                               &want[size_t(i) * o.embd], o.embd);
            const double bytes = double(rows) * (double(row_bytes(t, o.embd)) + 4.0 * o.embd);
            report(std::string("embed ") + type_name(t), rows, bytes, max_rel_error(got, want), 0,
                   [&] { embed(w, dtok, nullptr, rows, dx, nullptr); });
            cudaFree(dtab);
        }

        {  // rmsnorm
            const std::vector<float> x = random_floats(size_t(rows) * o.embd, 3, -3.f, 3.f),
                                     wv = random_floats(size_t(o.embd), 4);
            float* dxin = dev_copy(x);
            float* dw = dev_copy(wv);
            const WeightView w{GgmlType::F32, o.embd, 1, dw, wv.size() * 4};
            rmsnorm(dxin, w, rows, o.embd, 1e-5f, dx, nullptr);
            std::vector<float> want(x.size());
            for (int i = 0; i < rows; i++) {
                double ss = 0;
                for (int j = 0; j < o.embd; j++)
                    ss += double(x[size_t(i) * o.embd + j]) * x[size_t(i) * o.embd + j];
                const float sc = 1.f / std::sqrt(float(ss / o.embd) + 1e-5f);
                for (int j = 0; j < o.embd; j++)
                    want[size_t(i) * o.embd + j] = x[size_t(i) * o.embd + j] * sc * wv[size_t(j)];
            }
            report("rmsnorm f32", rows, double(rows) * o.embd * 8 + o.embd * 4.0,
                   max_rel_error(host_copy(dx, x.size()), want), 1e-5,
                   [&] { rmsnorm(dxin, w, rows, o.embd, 1e-5f, dx, nullptr); });
            cudaFree(dxin);
            cudaFree(dw);
        }

        {  // rope on q and k
            std::vector<float> q = random_floats(size_t(rows) * qd, 5),
                               k = random_floats(size_t(rows) * kd, 6);
            std::vector<int32_t> pos(static_cast<size_t>(rows));
            for (int32_t& p : pos) p = int32_t(rng() % 8192u);
            std::vector<float> inv(size_t(o.hd / 2));
            for (int i = 0; i < o.hd / 2; i++)
                inv[size_t(i)] = std::pow(500000.f, -2.0f * float(i) / float(o.hd));
            float* dq = dev_copy(q);
            float* dk = dev_copy(k);
            int32_t* dpos = dev_copy(pos);
            float* dinv = dev_copy(inv);
            std::vector<float> got;  // version 1's result
            auto ref = [&](std::vector<float>& x, int nh) {
                for (int i = 0; i < rows; i++)
                    for (int h = 0; h < nh; h++)
                        for (int j = 0; j < o.hd / 2; j++) {
                            const float th = float(pos[size_t(i)]) * inv[size_t(j)];
                            float* v = &x[(size_t(i) * nh + h) * o.hd + 2 * j];
                            const float a = v[0], b = v[1], c = std::cos(th), s = std::sin(th);
                            v[0] = a * c - b * s;
                            v[1] = a * s + b * c;
                        }
            };
            const std::vector<float> q0 = q, k0 = k;
            ref(q, o.heads);
            ref(k, o.kv_heads);
            q.insert(q.end(), k.begin(), k.end());
            // Version 1: a block per row looping over the pairs; 2: a thread per pair (default).
            for (int version : {1, 2}) {
                NT_CUDA_CHECK(cudaMemcpy(dq, q0.data(), q0.size() * 4, cudaMemcpyHostToDevice),
                              "cudaMemcpy");
                NT_CUDA_CHECK(cudaMemcpy(dk, k0.data(), k0.size() * 4, cudaMemcpyHostToDevice),
                              "cudaMemcpy");
                rope(dq, dk, dpos, rows, o.heads, o.kv_heads, o.hd, o.hd, dinv, nullptr, version);
                std::vector<float> gv = host_copy(dq, q0.size()), gkv = host_copy(dk, k0.size());
                gv.insert(gv.end(), gkv.begin(), gkv.end());
                if (version == 1)
                    got = gv;
                else if (std::memcmp(got.data(), gv.data(), got.size() * 4) != 0)
                    std::printf("rope v2 differs from v1  <-- WRONG\n");
                report("rope q+k v" + std::to_string(version), rows, double(rows) * (qd + kd) * 8,
                       max_rel_error(gv, q), 1e-4, [&] {
                           rope(dq, dk, dpos, rows, o.heads, o.kv_heads, o.hd, o.hd, dinv, nullptr,
                                version);
                       });
            }
            cudaFree(dq);
            cudaFree(dk);
            cudaFree(dpos);
            cudaFree(dinv);
        }

        {  // residual add + rmsnorm (+ Q8_K activations for a K-quant GEMV): separate, fused
            const size_t m = size_t(rows) * o.embd;
            const std::vector<float> x = random_floats(m, 10, -3.f, 3.f), y = random_floats(m, 11),
                                     wv = random_floats(size_t(o.embd), 12);
            float* dxr = dev_copy(x);
            float* dy = dev_copy(y);
            float* dw = dev_copy(wv);
            int8_t* xq = nullptr;
            float2* xd = nullptr;
            NT_CUDA_CHECK(cudaMalloc(&xq, m), "cudaMalloc");
            NT_CUDA_CHECK(cudaMalloc(&xd, m / 32 * sizeof(float2)), "cudaMalloc");
            const WeightView w{GgmlType::F32, o.embd, 1, dw, wv.size() * 4};
            std::vector<float> want(m), xs = x;
            for (int i = 0; i < rows; i++) {
                float* xr = &xs[size_t(i) * o.embd];
                double ss = 0;
                for (int j = 0; j < o.embd; j++) {
                    xr[j] += y[size_t(i) * o.embd + j];
                    ss += double(xr[j]) * xr[j];
                }
                const float sc = 1.f / std::sqrt(float(ss / o.embd) + 1e-5f);
                for (int j = 0; j < o.embd; j++)
                    want[size_t(i) * o.embd + j] = xr[j] * sc * wv[size_t(j)];
            }
            ActivationSlot slot;
            slot.xq = xq;
            slot.xd = xd;
            slot.mode = detail::ActQuant::Q8_K;
            // x, y, w read; x, out written; int8 + scales written.
            const double bytes = double(m) * 16 + o.embd * 4.0 + double(m) * 1.25;
            auto reset = [&] {
                NT_CUDA_CHECK(cudaMemcpy(dxr, x.data(), m * 4, cudaMemcpyHostToDevice),
                              "cudaMemcpy");
            };
            reset();
            add(dxr, dy, int64_t(m), nullptr);
            rmsnorm(dxr, w, rows, o.embd, 1e-5f, dx, nullptr);
            detail::quantize_q8(dx, rows, o.embd, detail::ActQuant::Q8_K, xq, xd, nullptr);
            report("add+norm+q8k 3 kernels", rows, bytes, max_rel_error(host_copy(dx, m), want),
                   1e-5, [&] {
                       add(dxr, dy, int64_t(m), nullptr);
                       rmsnorm(dxr, w, rows, o.embd, 1e-5f, dx, nullptr);
                       detail::quantize_q8(dx, rows, o.embd, detail::ActQuant::Q8_K, xq, xd,
                                           nullptr);
                   });
            reset();
            add_rmsnorm(dxr, dy, w, rows, o.embd, 1e-5f, dx, &slot, nullptr);
            report("add+norm+q8k fused", rows, bytes, max_rel_error(host_copy(dx, m), want), 1e-5,
                   [&] { add_rmsnorm(dxr, dy, w, rows, o.embd, 1e-5f, dx, &slot, nullptr); });
            cudaFree(dxr);
            cudaFree(dy);
            cudaFree(dw);
            cudaFree(xq);
            cudaFree(xd);
        }

        {  // swiglu and add
            const size_t n = size_t(rows) * o.ff;
            const std::vector<float> g = random_floats(n, 7, -8.f, 8.f), u = random_floats(n, 8);
            float* dg = dev_copy(g);
            float* du = dev_copy(u);
            swiglu(dg, du, int64_t(n), dx, nullptr);
            std::vector<float> want(n);
            for (size_t i = 0; i < n; i++) want[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
            report("swiglu", rows, double(n) * 12, max_rel_error(host_copy(dx, n), want), 1e-5,
                   [&] { swiglu(dg, du, int64_t(n), dx, nullptr); });
            const size_t m = size_t(rows) * o.embd;
            NT_CUDA_CHECK(cudaMemcpy(dx, g.data(), m * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
            add(dx, du, int64_t(m), nullptr);
            for (size_t i = 0; i < m; i++) want[i] = g[i] + u[i];
            want.resize(m);
            report("add", rows, double(m) * 12, max_rel_error(host_copy(dx, m), want), 0,
                   [&] { add(dx, du, int64_t(m), nullptr); });
            cudaFree(dg);
            cudaFree(du);
        }

        {  // gather every 4th row (and the last)
            const std::vector<float> x = random_floats(size_t(rows) * o.embd, 9);
            std::vector<int32_t> sel;
            for (int i = 0; i < rows; i++)
                if (i % 4 == 3 || i == rows - 1) sel.push_back(i);
            float* dxin = dev_copy(x);
            int32_t* dsel = dev_copy(sel);
            gather_rows(dxin, o.embd, dsel, int(sel.size()), dx, nullptr);
            std::vector<float> want;
            for (int32_t r : sel)
                want.insert(want.end(), x.begin() + ptrdiff_t(r) * o.embd,
                            x.begin() + ptrdiff_t(r + 1) * o.embd);
            report("gather " + std::to_string(sel.size()) + " rows", rows,
                   double(sel.size()) * o.embd * 8, max_rel_error(host_copy(dx, want.size()), want),
                   0, [&] { gather_rows(dxin, o.embd, dsel, int(sel.size()), dx, nullptr); });
            cudaFree(dxin);
            cudaFree(dsel);
        }
        cudaFree(dtok);
        cudaFree(dx);
    }
    bench_selection();
}

}  // namespace

int main(int argc, char** argv) {
    Opts o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (!v) {
            std::fprintf(stderr,
                         "usage: bench_elementwise [--embd N] [--ff N] [--heads N] [--kv-heads N] "
                         "[--hd N] [--iters N]\n");
            return 2;
        }
        i++;
        if (a == "--embd")
            o.embd = std::atoi(v);
        else if (a == "--ff")
            o.ff = std::atoi(v);
        else if (a == "--heads")
            o.heads = std::atoi(v);
        else if (a == "--kv-heads")
            o.kv_heads = std::atoi(v);
        else if (a == "--hd")
            o.hd = std::atoi(v);
        else if (a == "--iters")
            o.iters = std::atoi(v);
        else {
            std::fprintf(stderr, "unknown option %s\n", a.c_str());
            return 2;
        }
    }
    g_iters = o.iters;
    try {
        const CudaDeviceInfo dev = cuda_device_info(0);
        std::printf("bench_elementwise on %s; n_embd %d, n_ff %d, heads %d/%d x %d\n",
                    describe(dev).c_str(), o.embd, o.ff, o.heads, o.kv_heads, o.hd);
        // HBM ceiling: the same streaming read the backend's measure_read_bandwidth uses.
        const size_t bytes = size_t(1) << 30;
        void* buf = nullptr;
        uint32_t* sink = nullptr;
        NT_CUDA_CHECK(cudaMalloc(&buf, bytes), "cudaMalloc");
        NT_CUDA_CHECK(cudaMalloc(&sink, size_t(dev.sm_count) * 4 * sizeof(uint32_t)), "cudaMalloc");
        NT_CUDA_CHECK(cudaMemset(buf, 1, bytes), "cudaMemset");
        const double us =
            time_us(5, [&] { read_bandwidth_kernel(buf, bytes, sink, dev.sm_count * 4, nullptr); });
        g_hbm = double(bytes) / (us * 1e-6) / 1e9;
        cudaFree(buf);
        cudaFree(sink);
        std::printf("HBM streaming read: %.0f GB/s\n", g_hbm);
        bench(o);
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
