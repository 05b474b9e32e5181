// GEMV instantiations for Q4_K, Q5_K (split across files so the build runs in parallel).
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {

#define NT_INSTANTIATE(T)                                                                    \
    template void launch_gemv_q8<GgmlType::T>(const void*, int64_t, int64_t, const int8_t*,  \
                                              const float2*, int, float*, const GemvConfig&, \
                                              cudaStream_t);                                 \
    template void prepare_gemv_q8<GgmlType::T>();
NT_INSTANTIATE(Q4_K)
NT_INSTANTIATE(Q5_K)
#undef NT_INSTANTIATE

}  // namespace nt::cuda::detail
