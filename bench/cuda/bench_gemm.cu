// GEMM harness (prompt processing, n > 8): matmul() against the CPU reference, then timed whole
// and in parts: the integer tensor-core GEMM (matmul_mmq.cu; matmul() takes it with
// NT_EXACT_PROMPT=1) and the dequantize-to-FP16 + cuBLAS path, next to a loop of 8-row GEMVs.
//
//   bench_gemm [--types q4_K,q6_K,q8_0|all] [--shapes 8b|70b|all|ROWSxCOLS,...]
//              [--n 16,64,128,512] [--hbm 4455] [--tflops 989] [--tops 1979] [--iters 10]
//              [--check-rows 32]
//
// Lines per (type, shape, n):
//   matmul   : the public call; TFLOP/s = 2 n rows cols / time, % of --tflops (dense FP16
//              peak), or with the integer GEMM of --tops (dense int8 peak, default twice
//              --tflops; a K-quant kernel running two or three chains a block does that many
//              times the counted operations). With the integer GEMM: "bits" = the checked
//              outputs that equal the CPU backend's nt::vec_dot bit for bit (all of them, or
//              FAIL); otherwise (x -> f16, dequantize in slices, cublasGemmEx) err = max |y -
//              ref| / sum|w*x| against a double reference on FP16-rounded weights and x.
//   mmq      : the integer GEMM alone on activations already quantized (quantize_q8), the
//              kernel matmul() takes (on compute capability 9.0, wgmma for every type but Q2_K
//              and Q3_K);
//   mmq-sync : the mma.sync kernel every device has (the same bits).
//   dequant  : the weight -> FP16 kernel alone: GB/s of bytes read + written, % of --hbm.
//   cublas   : cublasGemmEx alone on already-dequantized weights (the ceiling for matmul).
//   gemv-loop: ceil(n/8) GEMV passes of 8 rows (n <= 128 only): where the GEMV path still wins.
// Exit status 1 if a check fails.
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "matmul_harness.h"

using namespace bench;

int main(int argc, char** argv) try {
    std::vector<std::string> types = {"q4_K", "q6_K", "q8_0"};
    std::vector<std::string> shape_names = {"8b", "70b"};
    std::vector<int> ns = {16, 64, 128, 512};
    double hbm = 4455, tflops = 989, tops = 0;
    int iters = 10, check_rows = 32;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) nt::fail("%s needs a value.", a.c_str());
            return argv[++i];
        };
        if (a == "--types") {
            const std::string v = val();
            types = v == "all" ? std::vector<std::string>{"q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                                                          "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
                                                          "f16",  "bf16", "f32"}
                               : split(v);
        } else if (a == "--shapes")
            shape_names = split(val());
        else if (a == "--n") {
            ns.clear();
            for (auto& s : split(val())) ns.push_back(std::atoi(s.c_str()));
        } else if (a == "--hbm")
            hbm = std::atof(val().c_str());
        else if (a == "--tflops")
            tflops = std::atof(val().c_str());
        else if (a == "--tops")
            tops = std::atof(val().c_str());
        else if (a == "--iters")
            iters = std::atoi(val().c_str());
        else if (a == "--check-rows")
            check_rows = std::atoi(val().c_str());
        else
            nt::fail("unknown option %s (see the header of bench_gemm.cu).", a.c_str());
    }
    print_device(hbm);
    if (tops <= 0) tops = 2 * tflops;
    std::printf("# dense peaks used for %%: FP16 %.0f TFLOP/s, int8 %.0f TOPS (integer GEMM)\n",
                tflops, tops);
    std::printf("# %-5s %-13s %-13s %4s  %-9s %9s %8s %7s %9s\n", "type", "shape", "rows x cols",
                "n", "what", "us", "TFLOP/s", "%peak", "GB/s|err");
    cudaStream_t stream;
    NT_CUDA_CHECK(cudaStreamCreate(&stream), "stream");
    int sms = 0;
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0),
                  "device attribute");
    int failures = 0;
    uint64_t seed = 100;

    std::vector<Shape> shapes;
    for (auto& s : shape_names)
        for (auto& sh : shapes_named(s)) shapes.push_back(sh);

    for (const auto& tname : types) {
        const GgmlType t = type_from_name(tname);
        const auto& tr = nt::traits(t);
        const bool quantized = tr.block_elems > 1;
        for (const Shape& sh : shapes) {
            if (sh.cols % tr.block_elems != 0) continue;
            const std::vector<uint8_t> hw = random_weights(t, sh.rows, sh.cols, seed++);
            DeviceBuffer<uint8_t> dw(hw.size());
            dw.upload(hw.data(), hw.size());
            const auto rows_checked = sample_rows(sh.rows, check_rows);
            DeviceBuffer<__half> wh(quantized ? size_t(sh.rows) * sh.cols : 0);
            if (quantized)
                nt::cuda::detail::dequant_to_f16(t, dw.p, sh.rows, sh.cols, wh.p, stream);

            for (int n : ns) {
                if (n <= nt::cuda::kGemvMaxBatch)
                    nt::fail("bench_gemm measures n > 8; use bench_gemv below that.");
                const std::vector<float> hx = random_activations(n, sh.cols, seed++);
                const std::vector<float> xr = t == GgmlType::F32    ? hx
                                              : t == GgmlType::BF16 ? round_bf16(hx)
                                              : quantized ? round_q8_f16(t, hx, n, sh.cols)
                                                          : round_f16(hx);
                const bool mmq =
                    nt::cuda::prompt_exact() && nt::cuda::detail::mmq_supported(t);
                const Reference ref =
                    mmq ? cpu_gemv_reference(t, hw, sh.cols, hx, n, rows_checked)
                        : reference(t, hw, sh.cols, xr, n, rows_checked, quantized);
                DeviceBuffer<float> dx(hx.size()), dy(size_t(n) * sh.rows);
                dx.upload(hx.data(), hx.size());
                nt::cuda::MatmulWorkspace ws;
                DeviceBuffer<uint8_t> wsbuf(nt::cuda::matmul_workspace_bytes(sh.cols, sh.rows, n));
                nt::cuda::matmul_init(ws, wsbuf.p, wsbuf.count, stream);
                const nt::WeightView wv{t, sh.cols, sh.rows, dw.p, hw.size()};
                const double flop = 2.0 * n * double(sh.rows) * double(sh.cols);
                auto line = [&](const char* what, double us, const char* extra, bool int8) {
                    const double tf = flop / us * 1e-6;
                    std::printf("  %-5s %-13s %6lldx%-6lld %4d  %-9s %9.1f %8.1f %6.1f%% %9s\n",
                                tname.c_str(), sh.name, (long long)sh.rows, (long long)sh.cols, n,
                                what, us, tf, 100 * tf / (int8 ? tops : tflops), extra);
                    std::fflush(stdout);
                };

                NT_CUDA_CHECK(cudaMemsetAsync(dy.p, 0xFF, dy.count * sizeof(float), stream),
                              "memset");
                nt::cuda::matmul(wv, dx.p, n, dy.p, ws, stream);
                NT_CUDA_CHECK(cudaStreamSynchronize(stream), "matmul");
                const std::vector<float> y = dy.download(dy.count);
                char extra[64];
                bool ok;
                if (mmq) {
                    size_t same = 0;
                    for (int i = 0; i < n; ++i)
                        for (size_t k = 0; k < rows_checked.size(); ++k)
                            same += y[size_t(i) * sh.rows + rows_checked[k]] ==
                                    float(ref.y[i * rows_checked.size() + k]);
                    ok = same == size_t(n) * rows_checked.size();
                    std::snprintf(extra, sizeof extra, "bits %s", ok ? "ok" : "FAIL");
                } else {
                    const double err = max_rel_error(ref, y, n, sh.rows);
                    ok = err <= 5e-5;
                    std::snprintf(extra, sizeof extra, "%.1e %s", err, ok ? "ok" : "FAIL");
                }
                failures += ok ? 0 : 1;
                const double mm_us = time_stream_us(
                    stream, iters, [&](int) { nt::cuda::matmul(wv, dx.p, n, dy.p, ws, stream); });
                line("matmul", mm_us, extra, mmq);
                if (nt::cuda::detail::mmq_supported(t)) {
                    DeviceBuffer<int8_t> xq(size_t(n) * sh.cols);
                    DeviceBuffer<float2> xd(size_t(n) * sh.cols / 32);
                    nt::cuda::detail::quantize_q8(dx.p, n, sh.cols, nt::cuda::detail::act_quant(t),
                                                  xq.p, xd.p, stream);
                    using nt::cuda::detail::MmqKernel;
                    for (const MmqKernel k : {MmqKernel::Best, MmqKernel::Sync}) {
                        const double mq_us = time_stream_us(stream, iters, [&](int) {
                            nt::cuda::detail::gemm_mmq(t, dw.p, sh.rows, sh.cols, xq.p, xd.p, n,
                                                       dy.p, stream, k);
                        });
                        line(k == MmqKernel::Best ? "mmq" : "mmq-sync", mq_us, "", true);
                    }
                }

                if (quantized) {
                    const double dq_us = time_stream_us(stream, iters, [&](int) {
                        nt::cuda::detail::dequant_to_f16(t, dw.p, sh.rows, sh.cols, wh.p, stream);
                    });
                    const double bytes =
                        double(hw.size()) + 2.0 * double(sh.rows) * double(sh.cols);
                    std::snprintf(extra, sizeof extra, "%.0f %.0f%%", bytes / dq_us * 1e-3,
                                  100 * bytes / dq_us * 1e-3 / hbm);
                    line("dequant", dq_us, extra, false);

                    DeviceBuffer<__half> xh(hx.size());
                    nt::cuda::detail::convert_to_f16(dx.p, int64_t(hx.size()), xh.p, stream);
                    const float alpha = 1.f, beta = 0.f;
                    const double cb_us = time_stream_us(stream, iters, [&](int) {
                        NT_CUDA_CHECK(
                            cublasGemmEx(ws.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(sh.rows), n,
                                         int(sh.cols), &alpha, wh.p, CUDA_R_16F, int(sh.cols), xh.p,
                                         CUDA_R_16F, int(sh.cols), &beta, dy.p, CUDA_R_32F,
                                         int(sh.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                            "cublasGemmEx");
                    });
                    line("cublas", cb_us, "", false);

                    if (n <= 128) {
                        DeviceBuffer<int8_t> xq(size_t(8) * sh.cols);
                        DeviceBuffer<float2> xd(size_t(8) * sh.cols / 32);
                        const auto cfg = nt::cuda::detail::gemv_default(t, sh.rows, sh.cols, 8, sms);
                        const double gl_us = time_stream_us(stream, iters, [&](int) {
                            for (int i0 = 0; i0 < n; i0 += 8) {
                                const int m = std::min(8, n - i0);
                                nt::cuda::detail::quantize_q8(
                                    dx.p + size_t(i0) * sh.cols, m, sh.cols,
                                    nt::cuda::detail::act_quant(t), xq.p, xd.p, stream);
                                nt::cuda::detail::gemv_q8(t, dw.p, sh.rows, sh.cols, xq.p, xd.p, m,
                                                          dy.p + size_t(i0) * sh.rows, cfg, stream);
                            }
                        });
                        line("gemv-loop", gl_us, "", false);
                    }
                }
                nt::cuda::matmul_free(ws);
            }
        }
    }
    cudaStreamDestroy(stream);
    std::printf("# %s\n", failures ? "FAILURES above" : "all checks passed");
    return failures ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 2;
}
