// GEMV instantiations for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (split across files so the build runs in
// parallel).
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {

#define NT_INSTANTIATE(T)                                                                    \
    template void launch_gemv_q8<GgmlType::T>(const void*, int64_t, int64_t, const int8_t*,  \
                                              const float2*, int, float*, const GemvConfig&, \
                                              cudaStream_t);                                 \
    template void prepare_gemv_q8<GgmlType::T>();
NT_INSTANTIATE(Q4_0)
NT_INSTANTIATE(Q4_1)
NT_INSTANTIATE(Q5_0)
NT_INSTANTIATE(Q5_1)
NT_INSTANTIATE(Q8_0)
#undef NT_INSTANTIATE

}  // namespace nt::cuda::detail
