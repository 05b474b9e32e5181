// The attention with the output projection folded in (cuda::attn_out_decode) against the
// attention kernel and the projection's GEMV as two launches, in place: decode steps of one row
// through CudaBackend (graphs, programmatic launches) over L layers of Llama-shaped weights,
// each layer the ops before the feed-forward (add_rmsnorm, q/k/v, attention_out_norm), with
// NT_ATTN_OUT's fold on and off. Correctness first: the last layer's output of one step both
// ways, and against the CPU backend. Then each context's µs a layer and the GB/s of the
// layer's weights (q, k, v, o) against the HBM read ceiling measured at start.
//
//   bench_attn_out [--types q4_K,q6_K,q8_0] [--ctx 1,16,64,128,256,512,1024] [--layers 8]
//                  [--steps 200] [--shape 8b|70b|smol]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.cuh"
#include "core/error.h"
#include "matmul_harness.h"
#include "quant/types.h"

using namespace nt;

namespace {

struct Opts {
    std::vector<GgmlType> types{GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0};
    std::vector<int> ctx{1, 16, 64, 128, 256, 512, 1024};
    int layers = 8, steps = 200;
    std::string shape = "8b";
};

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t a = 0;
    while (a <= s.size()) {
        const size_t b = std::min(s.find(',', a), s.size());
        if (b > a) out.push_back(s.substr(a, b - a));
        a = b + 1;
    }
    return out;
}

GgmlType parse_type(const std::string& n) {
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                       GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                       GgmlType::Q5_K, GgmlType::Q6_K})
        if (n == type_name(t)) return t;
    fail("bench_attn_out: unknown type '%s'.", n.c_str());
}

ModelShape make_shape(const std::string& name, int layers) {
    ModelShape s;
    if (name == "8b") {
        s.n_embd = 4096, s.n_head = 32, s.n_head_kv = 8, s.head_dim = 128;
    } else if (name == "70b") {
        s.n_embd = 8192, s.n_head = 64, s.n_head_kv = 8, s.head_dim = 128;
    } else if (name == "smol") {
        s.n_embd = 576, s.n_head = 9, s.n_head_kv = 3, s.head_dim = 64;
    } else {
        fail("bench_attn_out: --shape is 8b, 70b or smol, not '%s'.", name.c_str());
    }
    s.n_layer = layers;
    s.n_ff = 2 * s.n_embd;
    s.n_vocab = 256;
    s.norm_eps = 1e-5f;
    s.rope.n_rot = s.head_dim;
    s.rope.freq_base = 500000.f;
    return s;
}

struct Layer {
    std::vector<uint8_t> bytes[4];  // q, k, v, o
    std::vector<float> attn_norm, ffn_norm;
    WeightView host[6], dev[6];  // q, k, v, o, attn_norm, ffn_norm
};

Layer make_layer(const ModelShape& s, GgmlType t, uint64_t seed, CudaBackend& gpu) {
    Layer L;
    const int64_t qd = int64_t(s.n_head) * s.head_dim, kd = int64_t(s.n_head_kv) * s.head_dim;
    const int64_t rows[4] = {qd, kd, kd, s.n_embd}, cols[4] = {s.n_embd, s.n_embd, s.n_embd, qd};
    for (int i = 0; i < 4; i++) {
        L.bytes[i] = bench::random_weights(t, rows[i], cols[i], seed + uint64_t(i));
        L.host[i] = WeightView{t, cols[i], rows[i], L.bytes[i].data(), L.bytes[i].size()};
    }
    bench::Rng rng(seed + 9);
    for (auto* v : {&L.attn_norm, &L.ffn_norm}) {
        v->resize(size_t(s.n_embd));
        for (float& f : *v) f = 0.5f + rng.uniform();
    }
    L.host[4] = WeightView{GgmlType::F32, s.n_embd, 1, L.attn_norm.data(), L.attn_norm.size() * 4};
    L.host[5] = WeightView{GgmlType::F32, s.n_embd, 1, L.ffn_norm.data(), L.ffn_norm.size() * 4};
    for (int i = 0; i < 6; i++) {
        L.dev[i] = L.host[i];
        L.dev[i].data = gpu.upload_weight(L.host[i].data, L.host[i].nbytes);
    }
    return L;
}

// One decode step at position pos over every layer: x += ..., the layer's ops up to the
// feed-forward's norm (its output xn is the next layer's residual).
void step(Backend& be, const ModelShape& s, const std::vector<Layer>& layers, bool dev, int pos) {
    Batch b;
    b.add(1, pos, 0, true);
    be.begin_step(b);
    Activations& a = be.acts();
    for (int l = 0; l < int(layers.size()); l++) {
        const WeightView* w = dev ? layers[size_t(l)].dev : layers[size_t(l)].host;
        be.add_rmsnorm(a.x, l == 0 ? nullptr : a.xn, w[4], 1, s.n_embd, a.xn, w[0].type);
        be.qkv(w[0], w[1], w[2], a.xn, 1, a.q, a.k, a.v);
        be.attention_out_norm(l, a.q, a.k, a.v, a.att, w[3], a.x, w[5], 1, a.xn, w[0].type);
    }
    be.end_step();
}

std::vector<float> get(Backend& be, const float* p, size_t n) {
    std::vector<float> r(n);
    be.download(p, r.data(), n);
    return r;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

int main(int argc, char** argv) try {
    Opts o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) fail("bench_attn_out: %s needs a value.", a.c_str());
            return argv[++i];
        };
        if (a == "--types") {
            o.types.clear();
            for (const auto& n : split(val())) o.types.push_back(parse_type(n));
        } else if (a == "--ctx") {
            o.ctx.clear();
            for (const auto& n : split(val())) o.ctx.push_back(std::max(1, std::atoi(n.c_str())));
        } else if (a == "--layers") {
            o.layers = std::max(1, std::atoi(val().c_str()));
        } else if (a == "--steps") {
            o.steps = std::max(1, std::atoi(val().c_str()));
        } else if (a == "--shape") {
            o.shape = val();
        } else {
            fail("bench_attn_out: unknown argument '%s'.", a.c_str());
        }
    }
    const ModelShape s = make_shape(o.shape, o.layers);
    const int n_ctx = *std::max_element(o.ctx.begin(), o.ctx.end());
    bool ok = true;
    for (GgmlType t : o.types) {
        CudaBackend gpu;
        gpu.init(s, 1, 1, n_ctx);
        const double ceiling = gpu.measure_read_bandwidth();
        std::vector<Layer> layers;
        for (int l = 0; l < o.layers; l++)
            layers.push_back(make_layer(s, t, 1000 + 10 * uint64_t(l), gpu));
        size_t bytes = 0;
        for (int i = 0; i < 4; i++) bytes += layers[0].host[i].nbytes;
        const std::vector<float> x0 = bench::random_activations(1, s.n_embd, 7);
        auto reset = [&](Backend& be, bool dev) {
            if (dev)
                gpu.upload(be.acts().x, x0.data(), x0.size() * sizeof(float));
            else
                std::memcpy(be.acts().x, x0.data(), x0.size() * sizeof(float));
        };
        // Correctness: steps at positions 0..2 with the fold on (the cache cells it writes
        // are the next steps' context), then position 3 both ways and on the CPU.
        CpuBackend cpu;
        cpu.init(s, 1, 1, n_ctx);
        for (int p = 0; p < 4; p++) {
            reset(gpu, true);
            reset(cpu, false);
            gpu.set_attn_out_fusion(true);
            step(gpu, s, layers, true, p);
            const std::vector<float> folded = get(gpu, gpu.acts().xn, size_t(s.n_embd));
            step(cpu, s, layers, false, p);
            const std::vector<float> want = get(cpu, cpu.acts().xn, size_t(s.n_embd));
            reset(gpu, true);
            gpu.set_attn_out_fusion(false);
            step(gpu, s, layers, true, p);
            const std::vector<float> plain = get(gpu, gpu.acts().xn, size_t(s.n_embd));
            const double e_fold = rel_l2(folded, want), e_plain = rel_l2(plain, want);
            const bool good = e_fold < 2e-2 && e_fold < 3 * e_plain + 1e-5;
            ok = ok && good;
            std::printf("%s pos %d: folded vs CPU %.2e, unfolded vs CPU %.2e, folded vs unfolded "
                        "%.2e %s\n",
                        type_name(t), p, e_fold, e_plain, rel_l2(folded, plain),
                        good ? "ok" : "FAIL");
        }
        std::printf("\n%s, %s shape, %d layers, q/k/v/o %.1f MB a layer, HBM ceiling %.0f GB/s\n",
                    type_name(t), o.shape.c_str(), o.layers, double(bytes) / 1e6, ceiling);
        std::printf("| ctx | unfolded µs/layer | folded µs/layer | speedup | folded GB/s | %% of HBM "
                    "| steps folded |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        cudaEvent_t e0, e1;
        NT_CUDA_CHECK(cudaEventCreate(&e0), "cudaEventCreate");
        NT_CUDA_CHECK(cudaEventCreate(&e1), "cudaEventCreate");
        for (int c : o.ctx) {
            double us[2] = {0, 0};
            int folded_steps = 0;
            for (int fold = 0; fold < 2; fold++) {
                gpu.set_attn_out_fusion(fold == 1);
                const int before = gpu.graph_stats().folded;
                for (int w = 0; w < 5; w++) step(gpu, s, layers, true, c - 1);  // warm, capture
                gpu.wait();
                NT_CUDA_CHECK(cudaEventRecord(e0, gpu.stream()), "cudaEventRecord");
                for (int k = 0; k < o.steps; k++) step(gpu, s, layers, true, c - 1);
                gpu.wait();
                NT_CUDA_CHECK(cudaEventRecord(e1, gpu.stream()), "cudaEventRecord");
                NT_CUDA_CHECK(cudaEventSynchronize(e1), "cudaEventSynchronize");
                float ms = 0;
                NT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
                us[fold] = 1e3 * ms / o.steps / o.layers;
                if (fold) folded_steps = gpu.graph_stats().folded - before;
            }
            const double gbs = double(bytes) / (us[1] * 1e-6) / 1e9;
            std::printf("| %d | %.2f | %.2f | %.3f | %.0f | %.1f%% | %s |\n", c, us[0], us[1],
                        us[0] / us[1], gbs, ceiling > 0 ? 100 * gbs / ceiling : 0.0,
                        folded_steps > 0 ? "yes" : "no");
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    return ok ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attn_out: %s\n", e.what());
    return 1;
}
