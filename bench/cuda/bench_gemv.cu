// GEMV harness (decode, n <= 8): every kernel variant against the CPU reference on random
// weights, then timed inside CUDA graphs with the weight copies rotated so that they do not
// sit in L2 (as in a real decode step, where every weight is read once per token).
//
//   bench_gemv [--types q4_K,q6_K,...|all] [--shapes 8b|70b|small|all|ROWSxCOLS,...]
//              [--n 1,2,4,8] [--variants default|all] [--hbm 4455] [--reps 10] [--check-rows 48]
//              [--pdl]
//
// One line per (type, shape, n, variant):
//   gemv_us / GB/s / %hbm: the GEMV kernel alone (activations already quantized), weight bytes
//   over time, and that against --hbm; mm_us / GB/s / %hbm: the public matmul() (activation
//   quantization + GEMV). Variant: staged-p = staged kernel with a persistent grid, staged = one
//   CTA per row tile, direct = registers only, stream = whole rows per warp with several
//   16-byte loads per lane in flight (matmul_gemv_stream.cuh), pipe = register or shared-memory
//   (TMA) ring of raw weights per warp, pipe-r = its register ring only, pipe-s = pipe with
//   column slices allowed, so that rows too long for the TMA form whole go in slices (as
//   matmul() runs it); nxN rwR kK = activation
//   rows per pass, weight rows per warp, warps splitting the columns. err: max |y - ref| / sum|w*x|
//   over the checked rows, against the CPU backend's nt::vec_dot on the CPU's own quantized
//   activations (the GPU quantizes them identically); ok / FAIL against the tolerance.
// --pdl: every GEMV as a programmatic dependent launch, so that in the timed back-to-back
// sequence each one's weight loads start under the previous one's tail (as in decode).
// A '*' marks the dispatcher's default variant. Exit status 1 if any check fails.
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "matmul_harness.h"

using namespace bench;
using nt::cuda::detail::GemvConfig;
using nt::cuda::detail::GemvKernel;

namespace {

struct Options {
    std::vector<std::string> types = {"q4_K", "q5_K", "q6_K", "q8_0", "q4_0"};
    std::vector<std::string> shapes = {"all"};
    std::vector<int> ns = {1, 2, 4, 8};
    bool all_variants = false;
    bool pdl = false;
    double hbm = 4455;
    int reps = 10;
    int check_rows = 48;
};

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) nt::fail("%s needs a value.", a.c_str());
            return argv[++i];
        };
        if (a == "--types") {
            const std::string v = val();
            o.types = v == "all" ? std::vector<std::string>{"q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                                                            "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
                                                            "f16",  "bf16", "f32"}
                                 : split(v);
        } else if (a == "--shapes")
            o.shapes = split(val());
        else if (a == "--n") {
            o.ns.clear();
            for (auto& s : split(val())) o.ns.push_back(std::atoi(s.c_str()));
        } else if (a == "--variants")
            o.all_variants = val() == "all";
        else if (a == "--pdl")
            o.pdl = true;
        else if (a == "--hbm")
            o.hbm = std::atof(val().c_str());
        else if (a == "--reps")
            o.reps = std::atoi(val().c_str());
        else if (a == "--check-rows")
            o.check_rows = std::atoi(val().c_str());
        else
            nt::fail("unknown option %s (see the header of bench_gemv.cu).", a.c_str());
    }
    for (int n : o.ns)
        if (n < 1 || n > nt::cuda::kGemvMaxBatch) nt::fail("--n values must lie in 1..8.");
    return o;
}

std::string describe(const GemvConfig& c) {
    char b[64];
    std::snprintf(b, sizeof b, "%s nx%d rw%d k%d",
                  c.kernel == GemvKernel::Direct   ? "direct"
                  : c.kernel == GemvKernel::Stream ? "stream"
                  : c.kernel == GemvKernel::Mma    ? "mma"
                  : c.kernel == GemvKernel::Pipe   ? (!c.tma    ? "pipe-r"
                                                      : c.split ? "pipe-s"
                                                                : "pipe")
                  : c.persistent                   ? "staged-p"
                                                   : "staged",
                  c.nx, c.rows_per_warp, c.ksplit);
    return b;
}

bool same(const GemvConfig& a, const GemvConfig& b) {
    return a.kernel == b.kernel && a.nx == b.nx && a.rows_per_warp == b.rows_per_warp &&
           a.ksplit == b.ksplit &&
           (a.kernel != GemvKernel::Staged || a.persistent == b.persistent) &&
           (a.kernel != GemvKernel::Pipe || (a.tma == b.tma && a.split == b.split));
}

}  // namespace

int main(int argc, char** argv) try {
    const Options opt = parse(argc, argv);
    int sms = 0;
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0),
                  "device attribute");
    print_device(opt.hbm);
    std::printf("# %-5s %-15s %-12s %2s   %-20s %8s %7s %6s | %8s %7s %6s | %8s\n", "type", "shape",
                "rows x cols", "n", "variant", "gemv_us", "GB/s", "%hbm", "mm_us", "GB/s", "%hbm",
                "err");
    cudaStream_t stream;
    NT_CUDA_CHECK(cudaStreamCreate(&stream), "stream");
    int failures = 0;
    uint64_t seed = 1;

    std::vector<Shape> shapes;
    for (auto& s : opt.shapes)
        for (auto& sh : shapes_named(s)) shapes.push_back(sh);

    int64_t max_cols = 1, max_rows = 1;
    for (const Shape& sh : shapes)
        max_cols = std::max(max_cols, sh.cols), max_rows = std::max(max_rows, sh.rows);
    nt::cuda::MatmulWorkspace ws;
    DeviceBuffer<uint8_t> wsbuf(
        nt::cuda::matmul_workspace_bytes(max_cols, max_rows, nt::cuda::kGemvMaxBatch));
    nt::cuda::matmul_init(ws, wsbuf.p, wsbuf.count, stream);

    for (const auto& tname : opt.types) {
        const GgmlType t = type_from_name(tname);
        const auto& tr = nt::traits(t);
        const bool quantized = tr.block_elems > 1;
        for (const Shape& sh : shapes) {
            if (sh.cols % tr.block_elems != 0) {
                std::printf("  %-5s %-15s %6lldx%-6lld    skipped: cols not a multiple of %d\n",
                            tname.c_str(), sh.name, (long long)sh.rows, (long long)sh.cols,
                            tr.block_elems);
                continue;
            }
            const std::vector<uint8_t> hw = random_weights(t, sh.rows, sh.cols, seed++);
            const size_t wbytes = hw.size();
            // Enough copies to exceed L2 several times over, so each call reads from HBM.
            const int copies =
                int(std::min<size_t>(64, std::max<size_t>(1, (size_t(256) << 20) / wbytes + 1)));
            std::vector<DeviceBuffer<uint8_t>> dw;
            for (int c = 0; c < copies; ++c) {
                dw.emplace_back(wbytes);
                if (c == 0)
                    dw[0].upload(hw.data(), wbytes);
                else
                    NT_CUDA_CHECK(cudaMemcpy(dw[c].p, dw[0].p, wbytes, cudaMemcpyDeviceToDevice),
                                  "copy weights");
            }
            const auto rows_checked = sample_rows(sh.rows, opt.check_rows);
            const int per_graph = std::max(20, copies);

            for (int n : opt.ns) {
                const std::vector<float> hx = random_activations(n, sh.cols, seed++);
                const Reference ref = quantized
                                          ? cpu_gemv_reference(t, hw, sh.cols, hx, n, rows_checked)
                                          : reference(t, hw, sh.cols, hx, n, rows_checked, false);
                const double tol = quantized ? 1e-4 : 1e-5;
                DeviceBuffer<float> dx(hx.size()), dy(size_t(n) * sh.rows);
                dx.upload(hx.data(), hx.size());

                nt::WeightView wv{t, sh.cols, sh.rows, dw[0].p, wbytes};

                // matmul() as the engine calls it.
                auto run_matmul = [&](int i) {
                    wv.data = dw[i % copies].p;
                    nt::cuda::matmul(wv, dx.p, n, dy.p, ws, stream);
                };
                run_matmul(0);
                NT_CUDA_CHECK(cudaStreamSynchronize(stream), "matmul");
                const double mm_err = max_rel_error(ref, dy.download(dy.count), n, sh.rows);
                const double mm_us = time_graph_us(stream, per_graph, opt.reps, run_matmul);

                std::vector<GemvConfig> variants;
                const GemvConfig def =
                    quantized ? nt::cuda::detail::gemv_default(t, sh.rows, sh.cols, n, sms)
                              : GemvConfig{};
                variants.push_back(def);
                // The pipe kernel as matmul() runs it: rows too long for its TMA form whole go
                // in column slices there.
                if (def.kernel == GemvKernel::Pipe && def.tma && n == 1) {
                    GemvConfig c = def;
                    c.split = true;
                    variants.push_back(c);
                }
                if (quantized && opt.all_variants) {
                    for (auto kern : {GemvKernel::Staged, GemvKernel::Direct, GemvKernel::Stream,
                                      GemvKernel::Pipe, GemvKernel::Mma})
                        for (int rw : {1, 2})
                            for (int ks : {1, 2, 4, 8})
                                for (bool pers : {true, false}) {
                                    if (kern != GemvKernel::Staged && kern != GemvKernel::Pipe &&
                                        pers)
                                        continue;  // only Staged has it (Pipe: its TMA form)
                                    GemvConfig c{kern, def.nx, rw, ks, pers};
                                    c.tma = pers;
                                    if (!same(c, def) &&
                                        nt::cuda::detail::gemv_config_available(t, c))
                                        variants.push_back(c);
                                }
                }
                DeviceBuffer<int8_t> xq(size_t(n) * sh.cols);
                DeviceBuffer<float2> xd(size_t(n) * sh.cols / 32 + 1);
                if (quantized)
                    nt::cuda::detail::quantize_q8(dx.p, n, sh.cols, nt::cuda::detail::act_quant(t),
                                                  xq.p, xd.p, stream);

                for (GemvConfig c : variants) {
                    c.pdl = opt.pdl;
                    double us = 0, err = 0;
                    std::string name = quantized ? describe(c) : "float";
                    if (quantized) {
                        auto run = [&](int i) {
                            nt::cuda::detail::gemv_q8(t, dw[i % copies].p, sh.rows, sh.cols, xq.p,
                                                      xd.p, n, dy.p, c, stream);
                        };
                        NT_CUDA_CHECK(cudaMemsetAsync(dy.p, 0xFF, dy.count * sizeof(float), stream),
                                      "memset");
                        run(0);
                        NT_CUDA_CHECK(cudaStreamSynchronize(stream), "gemv");
                        err = max_rel_error(ref, dy.download(dy.count), n, sh.rows);
                        us = time_graph_us(stream, per_graph, opt.reps, run);
                    } else {
                        auto run = [&](int i) {
                            nt::cuda::detail::gemv_float(t, dw[i % copies].p, sh.rows, sh.cols,
                                                         dx.p, n, dy.p, sms, stream);
                        };
                        NT_CUDA_CHECK(cudaMemsetAsync(dy.p, 0xFF, dy.count * sizeof(float), stream),
                                      "memset");
                        run(0);
                        NT_CUDA_CHECK(cudaStreamSynchronize(stream), "gemv");
                        err = max_rel_error(ref, dy.download(dy.count), n, sh.rows);
                        us = time_graph_us(stream, per_graph, opt.reps, run);
                    }
                    const bool is_def = same(c, def);
                    const double e = is_def ? std::max(err, mm_err) : err;
                    const bool ok = e <= tol;  // NaN fails too
                    failures += ok ? 0 : 1;
                    const double gbs = double(wbytes) / us * 1e-3,
                                 mgbs = double(wbytes) / mm_us * 1e-3;
                    if (is_def)
                        std::printf(
                            "%s %-5s %-15s %6lldx%-6lld %2d   %-20s %8.2f %7.0f %5.1f%% | %8.2f "
                            "%7.0f %5.1f%% | %8.1e %s\n",
                            "*", tname.c_str(), sh.name, (long long)sh.rows, (long long)sh.cols, n,
                            name.c_str(), us, gbs, 100 * gbs / opt.hbm, mm_us, mgbs,
                            100 * mgbs / opt.hbm, e, ok ? "ok" : "FAIL");
                    else
                        std::printf(
                            "%s %-5s %-15s %6lldx%-6lld %2d   %-20s %8.2f %7.0f %5.1f%% | %8s %7s "
                            "%6s | %8.1e %s\n",
                            " ", tname.c_str(), sh.name, (long long)sh.rows, (long long)sh.cols, n,
                            name.c_str(), us, gbs, 100 * gbs / opt.hbm, "", "", "", e,
                            ok ? "ok" : "FAIL");
                    std::fflush(stdout);
                }
            }
        }
    }
    nt::cuda::matmul_free(ws);
    cudaStreamDestroy(stream);
    std::printf("# %s\n", failures ? "FAILURES above" : "all checks passed");
    return failures ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemv: %s\n", e.what());
    return 2;
}
