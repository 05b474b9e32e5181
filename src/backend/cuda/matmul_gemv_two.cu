// Stacks of two weight types in one GEMV launch (launch_tma_two): Q4_K_M's Q4_K q and k with
// its Q6_K v. In a file of its own: it instantiates both types' TMA kernel bodies.
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {

bool gemv_stack_two(GgmlType t1, const GemvStack& s1, GgmlType t2, const GemvStack& s2,
                    int64_t cols, const int8_t* xq, const float2* xd, bool pdl,
                    cudaStream_t stream) {
    if (t1 == GgmlType::Q4_K && t2 == GgmlType::Q6_K)
        return launch_tma_two<GgmlType::Q4_K, GgmlType::Q6_K>(s1, s2, cols, xq, xd, pdl, stream);
    return false;
}

void prepare_gemv_stack_two() {
    constexpr GgmlType T1 = GgmlType::Q4_K, T2 = GgmlType::Q6_K;
    if (!tma_usable()) return;
    any_tma_units<T1>([](auto x1) {
        constexpr int XU1 = decltype(x1)::value;
        if constexpr (tma_four_rows_compiled<T1>(XU1)) {
            any_tma_units<T2>([](auto x2) {
                tma_two_ctas_by_registers<T1, XU1, 4, T2, decltype(x2)::value, 2>();
                return false;  // every one
            });
        }
        return false;
    });
}

}  // namespace nt::cuda::detail
