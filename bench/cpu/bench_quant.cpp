// bench_quant: single-threaded quantized dot-product kernels (src/quant) on Llama-sized weights.
//
// For each weight type and shape it times
//   GEMV  vec_dot_tile(rows, 1 column): the decode step; weights are cycled through a pool
//         larger than the last-level cache, so this is the DRAM-bound case a real model sees;
//   GEMM  vec_dot_tile(rows, C columns): the prompt step (C activation rows at once), weights
//         hot in cache, compute-bound;
// and prints weight GB/s, GFLOP/s, the ratio to the measured single-core read bandwidth (GEMV),
// the largest difference from the scalar reference kernel (relative to sum |terms|), and whether
// the kernel is batch-invariant (each column of a 9-column tile bit-identical to its 1-column run).
// With --ggml DIR (a directory holding libggml-base.so and libggml-cpu.so, e.g. the lib/ folder
// of the llama-cpp-python package) it times ggml's own kernels on the same data, one thread:
// ggml_vec_dot_* over the rows (ggml's decode path) and ggml_mul_mat (its prompt path, including
// the activation quantization, which the GEMM column here does not include).
//
// usage: bench_quant [--types q4_0,q4_1,...] [--shapes 4096x4096,1536x576,576x1536] [--cols 64]
//                    [--ggml DIR] [--no-check] [--sweep]
// --sweep prints GFLOP/s (hot weights) for 1..64 activation columns instead: it shows where the
// kernels switch from the row-direct (GEMV) shape to the transposed tiles.
// Shapes are ROWSxN: ROWS weight rows (outputs) of N elements (the dot-product length).
// GCC 12's AVX-512 intrinsics trip -Wuninitialized when inlined (false positive, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <dlfcn.h>
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "quant/kernels.h"
#include "quant/quant.h"

using namespace nt;

namespace {

// Times are this thread's CPU time, not wall time: on a shared machine the wall clock also
// counts the time other processes hold the core.
double cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best time of fn() over enough repetitions to fill ~min_s seconds (at least 3): on a shared
// machine the minimum is the run least disturbed by other processes.
template <typename F>
double time_it(F&& fn, double min_s = 0.4) {
    fn();  // warm-up
    std::vector<double> t;
    const double start = cpu_seconds();
    while (t.size() < 3 || (cpu_seconds() - start < min_s && t.size() < 1000)) {
        const double t0 = cpu_seconds();
        fn();
        t.push_back(cpu_seconds() - t0);
    }
    return *std::min_element(t.begin(), t.end());
}

std::string cpu_name() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    }
    return "unknown CPU";
}

// Single-core streaming read bandwidth over a buffer much larger than the caches: the GEMV
// roofline.
double measure_read_bw() {
    const size_t n = size_t(256) << 20;
    std::vector<uint64_t> buf(n / 8);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;
    volatile uint64_t sink = 0;
    const double t = time_it(
        [&] {
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = 0; i < buf.size(); i += 4) {
                s0 += buf[i];
                s1 += buf[i + 1];
                s2 += buf[i + 2];
                s3 += buf[i + 3];
            }
            sink = s0 + s1 + s2 + s3;
        },
        1.0);
    (void)sink;
    return double(n) / t / 1e9;
}

// Peak rate of one core's int8 dot-product instruction (VPDPBUSD on twelve independent
// accumulators; 64 multiply-adds each): the compute roofline of the quantized GEMM at the avx512
// level. Built for AVX-512 through a target attribute and only called when the CPU has it.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double measure_vnni_macs() {
    __m512i acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
    const long iters = 20000000;
    const double t0 = cpu_seconds();
    for (long i = 0; i < iters; ++i) {
        for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    const double t = cpu_seconds() - t0;
    int sink = 0;
    for (int j = 0; j < 12; ++j) sink += _mm_cvtsi128_si32(_mm512_castsi512_si128(acc[j]));
    __asm__ volatile("" ::"r"(sink));
    return double(iters) * 12 * 64 / t;
}

// Weights of a realistic distribution: quantized from Gaussian floats where we can quantize,
// random bits with sane scales for the K-quants.
std::vector<uint8_t> make_weights(GgmlType t, int64_t rows, int64_t n, std::mt19937& rng) {
    const size_t rb = row_bytes(t, n);
    std::vector<uint8_t> w(rb * size_t(rows));
    std::normal_distribution<float> nd(0.0f, 0.02f);
    if (can_quantize(t)) {
        std::vector<float> x(static_cast<size_t>(n));
        for (int64_t r = 0; r < rows; ++r) {
            for (auto& v : x) v = nd(rng);
            quantize_row(t, x.data(), w.data() + size_t(r) * rb, n);
        }
        return w;
    }
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : w) b = uint8_t(byte(rng));
    const int bb = traits(t).block_bytes;
    auto put = [](uint8_t* p, float v) {
        const uint16_t h = f32_to_f16(v);
        std::memcpy(p, &h, 2);
    };
    for (size_t off = 0; off < w.size(); off += size_t(bb)) {
        uint8_t* b = w.data() + off;
        switch (t) {
            case GgmlType::Q2_K:
                put(b + 80, 1e-3f);
                put(b + 82, 5e-4f);
                break;
            case GgmlType::Q3_K:
                put(b + 108, 1e-3f);
                break;
            case GgmlType::Q4_K:
            case GgmlType::Q5_K:
                put(b, 5e-4f);
                put(b + 2, 1e-3f);
                break;
            case GgmlType::Q6_K:
                put(b + 208, 2e-4f);
                break;
            default:
                break;
        }
    }
    return w;
}

std::vector<uint8_t> make_acts(GgmlType wt, int64_t cols, int64_t n, std::vector<float>& x,
                               std::mt19937& rng) {
    const GgmlType at = vec_dot_type(wt);
    const size_t rb = row_bytes(at, n);
    std::vector<uint8_t> a(rb * size_t(cols));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    x.resize(size_t(cols * n));
    for (auto& v : x) v = nd(rng);
    for (int64_t c = 0; c < cols; ++c)
        quantize_row(at, x.data() + c * n, a.data() + size_t(c) * rb, n);
    return a;
}

// ---- optional: ggml's kernels, loaded at run time from a llama.cpp build ----
struct Ggml {
    struct TraitsCpu {
        void (*from_float)(const float*, void*, int64_t);
        void (*vec_dot)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
        int vec_dot_type;
        int64_t nrows;
    };
    struct InitParams {
        size_t mem_size;
        void* mem_buffer;
        bool no_alloc;
    };
    void (*cpu_init)() = nullptr;
    const TraitsCpu* (*traits_cpu)(int) = nullptr;
    void* (*init)(InitParams) = nullptr;
    void (*free)(void*) = nullptr;
    void* (*new_tensor_2d)(void*, int, int64_t, int64_t) = nullptr;
    void* (*get_data)(void*) = nullptr;
    void* (*mul_mat)(void*, void*, void*) = nullptr;
    void* (*new_graph)(void*) = nullptr;
    void (*build_forward_expand)(void*, void*) = nullptr;
    int (*graph_compute_with_ctx)(void*, void*, int) = nullptr;

    bool load(const std::string& dir) {
        void* base = dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
        void* cpu = dlopen((dir + "/libggml-cpu.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
        if (!base || !cpu) {
            std::fprintf(stderr, "cannot load ggml from %s: %s\n", dir.c_str(), dlerror());
            return false;
        }
        auto sym = [&](void* h, const char* name, auto& fn) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
            return fn != nullptr;
        };
        const bool ok =
            sym(cpu, "ggml_cpu_init", cpu_init) &&
            sym(cpu, "ggml_get_type_traits_cpu", traits_cpu) && sym(base, "ggml_init", init) &&
            sym(base, "ggml_free", free) && sym(base, "ggml_new_tensor_2d", new_tensor_2d) &&
            sym(base, "ggml_get_data", get_data) && sym(base, "ggml_mul_mat", mul_mat) &&
            sym(base, "ggml_new_graph", new_graph) &&
            sym(base, "ggml_build_forward_expand", build_forward_expand) &&
            sym(cpu, "ggml_graph_compute_with_ctx", graph_compute_with_ctx);
        if (!ok) {
            std::fprintf(stderr, "ggml in %s lacks a symbol this benchmark needs\n", dir.c_str());
            return false;
        }
        cpu_init();
        return true;
    }
};

struct Options {
    std::vector<GgmlType> types;
    std::vector<std::pair<int64_t, int64_t>> shapes;  // rows, n
    int cols = 64;
    std::string ggml_dir;
    bool check = true;
    bool sweep = false;
};

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
        const size_t e = s.find(sep, start);
        out.push_back(s.substr(start, e == std::string::npos ? std::string::npos : e - start));
        if (e == std::string::npos) break;
        start = e + 1;
    }
    return out;
}

GgmlType type_by_name(const std::string& name) {
    for (uint32_t id = 0; id < 31; ++id) {
        const TypeTraits* tr = type_traits(id);
        if (tr && tr->weight_type && name == tr->name) return GgmlType(id);
    }
    fail("--types: '%s' is not a weight type (try q4_0, q4_1, q8_0, q4_K, q6_K, f16 ...).",
         name.c_str());
}

Options parse(int argc, char** argv) {
    Options o;
    o.types = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
               GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
               GgmlType::F16,  GgmlType::BF16, GgmlType::F32};
    o.shapes = {{4096, 4096}, {1536, 576}, {576, 1536}};
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) fail("%s needs a value.", arg.c_str());
            return argv[++i];
        };
        if (arg == "--types") {
            o.types.clear();
            for (const auto& s : split(value(), ',')) o.types.push_back(type_by_name(s));
        } else if (arg == "--shapes") {
            o.shapes.clear();
            for (const auto& s : split(value(), ',')) {
                long long r = 0, n = 0;
                if (std::sscanf(s.c_str(), "%lldx%lld", &r, &n) != 2 || r <= 0 || n <= 0)
                    fail("--shapes: '%s' is not ROWSxN.", s.c_str());
                o.shapes.push_back({r, n});
            }
        } else if (arg == "--cols") {
            o.cols = std::atoi(value().c_str());
            if (o.cols <= 0) fail("--cols must be a positive number.");
        } else if (arg == "--ggml") {
            o.ggml_dir = value();
        } else if (arg == "--no-check") {
            o.check = false;
        } else if (arg == "--sweep") {
            o.sweep = true;
        } else {
            fail("unknown argument %s (see the comment at the top of bench_quant.cpp).",
                 arg.c_str());
        }
    }
    return o;
}

// Largest |kernel - scalar| over the sampled outputs, relative to the largest |scalar| value.
double check_vs_scalar(GgmlType t, int64_t n, int rows, int cols, const uint8_t* w, size_t ws,
                       const uint8_t* a, size_t as, const float* got, size_t os) {
    std::vector<float> ref(size_t(rows) * size_t(cols));
    quant_detail::tile_kernel(quant_detail::SimdLevel::Scalar, t)(n, rows, cols, w, ws, a, as,
                                                                  ref.data(), size_t(rows));
    double maxdiff = 0, maxref = 0;
    for (int c = 0; c < cols; ++c) {
        for (int r = 0; r < rows; ++r) {
            const double v = ref[size_t(c) * rows + r];
            maxref = std::max(maxref, std::fabs(v));
            maxdiff = std::max(maxdiff, std::fabs(double(got[size_t(c) * os + r]) - v));
        }
    }
    return maxref > 0 ? maxdiff / maxref : maxdiff;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options opt = parse(argc, argv);
        Ggml ggml;
        const bool have_ggml = !opt.ggml_dir.empty() && ggml.load(opt.ggml_dir);
        if (!opt.ggml_dir.empty() && !have_ggml) return 1;

        std::printf("bench_quant: %s, 1 thread, SIMD level %s\n", cpu_name().c_str(), simd_level());
        std::printf("command:");
        for (int i = 0; i < argc; ++i) std::printf(" %s", argv[i]);
        std::printf("\n");
        const double bw = measure_read_bw();
        std::printf("single-core DRAM read: %.1f GB/s (roofline of the cold GEMV)\n", bw);
        __builtin_cpu_init();
        const bool vnni =
            __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
        const double peak_macs = vnni ? measure_vnni_macs() : 0.0;
        if (vnni) {
            std::printf(
                "single-core VPDPBUSD peak: %.1f GOP/s (roofline of the int8 GEMM at avx512)\n",
                2 * peak_macs / 1e9);
        }
        std::printf(
            "\nGEMV: 1 activation column; cold: weights cycled through 256 MiB, hot: in cache."
            "\nGEMM: %d activation columns, hot weights. diff: max |kernel - scalar| / max "
            "|scalar|; bi: batch-invariant\n(every column of a 9-column tile bit-identical to its "
            "1-column result).\n\n",
            opt.cols);
        std::printf("%-5s %-10s | %-25s | %-9s | %-26s | %s\n", "type", "shape", "GEMV cold",
                    "GEMV hot", "GEMM", "diff, bi");
        std::printf("%-5s %-10s | %7s %7s %9s | %9s | %8s %6s %10s |\n", "", "rows x n", "GB/s",
                    "GFLOP/s", "%roofline", "GB/s", "GFLOP/s", "%peak", "GB/s(w)");

        std::mt19937 rng(1234);
        if (opt.sweep) {
            const int counts[] = {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64};
            std::printf("GFLOP/s by activation columns (hot weights):\n%-5s %-10s", "type",
                        "shape");
            for (int c : counts) std::printf(" %6d", c);
            std::printf("\n");
            for (GgmlType t : opt.types) {
                for (auto [rows, n] : opt.shapes) {
                    if (n % traits(t).block_elems != 0) continue;
                    const size_t rb = row_bytes(t, n);
                    const std::vector<uint8_t> w = make_weights(t, rows, n, rng);
                    std::vector<float> x;
                    const std::vector<uint8_t> a = make_acts(t, 64, n, x, rng);
                    const size_t as = row_bytes(vec_dot_type(t), n);
                    std::vector<float> out(size_t(rows) * 64);
                    std::printf("%-5s %5lldx%-5lld", type_name(t), (long long)rows, (long long)n);
                    for (int c : counts) {
                        const double sec = time_it(
                            [&] {
                                vec_dot_tile(t, n, int(rows), c, w.data(), rb, a.data(), as,
                                             out.data(), size_t(rows));
                            },
                            0.2);
                        std::printf(" %6.1f", 2.0 * double(rows) * double(n) * c / sec / 1e9);
                    }
                    std::printf("\n");
                }
            }
            return 0;
        }
        for (GgmlType t : opt.types) {
            for (auto [rows, n] : opt.shapes) {
                if (n % traits(t).block_elems != 0) continue;
                const size_t rb = row_bytes(t, n);
                const size_t wbytes = rb * size_t(rows);
                // A pool of weight copies larger than the last-level cache for the cold GEMV.
                const size_t copies = std::max<size_t>(1, (size_t(256) << 20) / wbytes);
                std::vector<uint8_t> w = make_weights(t, rows, n, rng);
                std::vector<uint8_t> pool(wbytes * copies);
                for (size_t i = 0; i < copies; ++i)
                    std::memcpy(pool.data() + i * wbytes, w.data(), wbytes);
                std::vector<float> x;
                const std::vector<uint8_t> a = make_acts(t, opt.cols, n, x, rng);
                const size_t as = row_bytes(vec_dot_type(t), n);
                std::vector<float> out(size_t(rows) * size_t(opt.cols));

                size_t which = 0;
                const double t_gemv = time_it([&] {
                    vec_dot_tile(t, n, int(rows), 1, pool.data() + (which++ % copies) * wbytes, rb,
                                 a.data(), as, out.data(), size_t(rows));
                });
                const double gemv_gbs = double(wbytes) / t_gemv / 1e9;
                const double t_gemv_hot = time_it([&] {
                    vec_dot_tile(t, n, int(rows), 1, w.data(), rb, a.data(), as, out.data(),
                                 size_t(rows));
                });
                const double t_gemm = time_it([&] {
                    vec_dot_tile(t, n, int(rows), opt.cols, w.data(), rb, a.data(), as, out.data(),
                                 size_t(rows));
                });
                const double flops = 2.0 * double(rows) * double(n);
                char shape[32];
                std::snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)n);
                const double gemm_flops = flops * opt.cols / t_gemm;
                const bool int8 = traits(t).block_elems > 1 && peak_macs > 0 &&
                                  std::string(simd_level()) == "avx512";
                char pct[16] = "-";
                if (int8)
                    std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * gemm_flops / (2 * peak_macs));
                std::printf("%-5s %-10s | %7.1f %7.1f %8.0f%% | %9.1f | %8.1f %6s %10.2f |",
                            type_name(t), shape, gemv_gbs, flops / t_gemv / 1e9,
                            100.0 * gemv_gbs / bw, double(wbytes) / t_gemv_hot / 1e9,
                            gemm_flops / 1e9, pct, double(wbytes) / t_gemm / 1e9);
                if (opt.check) {
                    const int crow = int(std::min<int64_t>(rows, 64)), ccol = std::min(opt.cols, 9);
                    std::vector<float> got(size_t(crow) * size_t(ccol));
                    vec_dot_tile(t, n, crow, ccol, w.data(), rb, a.data(), as, got.data(),
                                 size_t(crow));
                    std::printf(" %.1e", check_vs_scalar(t, n, crow, ccol, w.data(), rb, a.data(),
                                                         as, got.data(), size_t(crow)));
                    int differ = 0;
                    std::vector<float> one(static_cast<size_t>(crow));
                    for (int c = 0; c < ccol; ++c) {
                        vec_dot_tile(t, n, crow, 1, w.data(), rb, a.data() + size_t(c) * as, as,
                                     one.data(), size_t(crow));
                        differ += std::memcmp(one.data(), got.data() + size_t(c) * crow,
                                              sizeof(float) * size_t(crow)) != 0;
                    }
                    std::printf(" %s", differ ? "NOT batch-invariant" : "bi");
                }
                std::printf("\n");

                if (have_ggml) {
                    const Ggml::TraitsCpu* tr = ggml.traits_cpu(int(t));
                    // ggml's own activation encoding (its Q8_1 differs from ours only in the s
                    // field's use).
                    const size_t gas = row_bytes(GgmlType(tr->vec_dot_type), n);
                    std::vector<uint8_t> ga(gas * size_t(opt.cols));
                    if (tr->vec_dot_type == int(GgmlType::F32)) {
                        std::memcpy(ga.data(), x.data(), ga.size());
                    } else {
                        for (int c = 0; c < opt.cols; ++c)
                            tr->from_float(x.data() + size_t(c) * n, ga.data() + size_t(c) * gas,
                                           n);
                    }
                    which = 0;
                    const double g_gemv = time_it([&] {
                        const uint8_t* wp = pool.data() + (which++ % copies) * wbytes;
                        for (int64_t r = 0; r < rows; ++r)
                            tr->vec_dot(int(n), &out[size_t(r)], 0, wp + size_t(r) * rb, 0,
                                        ga.data(), 0, 1);
                    });
                    // ggml_mul_mat on one thread: weights [n, rows] x activations [n, cols].
                    const size_t mem = 2 * wbytes + size_t(opt.cols) * size_t(n) * 4 * 4 +
                                       size_t(rows) * size_t(opt.cols) * 4 + (size_t(1) << 30);
                    void* ctx = ggml.init({mem, nullptr, false});
                    void* tw = ggml.new_tensor_2d(ctx, int(t), n, rows);
                    void* ta = ggml.new_tensor_2d(ctx, int(GgmlType::F32), n, opt.cols);
                    std::memcpy(ggml.get_data(tw), w.data(), wbytes);
                    std::memcpy(ggml.get_data(ta), x.data(), size_t(opt.cols) * size_t(n) * 4);
                    void* tout = ggml.mul_mat(ctx, tw, ta);
                    void* graph = ggml.new_graph(ctx);
                    ggml.build_forward_expand(graph, tout);
                    const double g_gemm =
                        time_it([&] { ggml.graph_compute_with_ctx(ctx, graph, 1); });
                    ggml.free(ctx);
                    const double g_gemv_hot = time_it([&] {
                        for (int64_t r = 0; r < rows; ++r)
                            tr->vec_dot(int(n), &out[size_t(r)], 0, w.data() + size_t(r) * rb, 0,
                                        ga.data(), 0, 1);
                    });
                    const double g_gemm_flops = flops * opt.cols / g_gemm;
                    char gpct[16] = "-";
                    if (int8)
                        std::snprintf(gpct, sizeof gpct, "%.0f%%",
                                      100.0 * g_gemm_flops / (2 * peak_macs));
                    std::printf(
                        "%-5s %-10s | %7.1f %7.1f %8.0f%% | %9.1f | %8.1f %6s %10.2f | ggml\n",
                        type_name(t), shape, double(wbytes) / g_gemv / 1e9, flops / g_gemv / 1e9,
                        100.0 * double(wbytes) / g_gemv / 1e9 / bw,
                        double(wbytes) / g_gemv_hot / 1e9, g_gemm_flops / 1e9, gpct,
                        double(wbytes) / g_gemm / 1e9);
                }
            }
        }
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "bench_quant: %s\n", e.what());
        return 1;
    }
}
