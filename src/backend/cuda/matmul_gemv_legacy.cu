// GEMV instantiations for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (split across files so the build runs in
// parallel).
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {

NT_GEMV_INSTANTIATE(Q4_0)
NT_GEMV_INSTANTIATE(Q4_1)
NT_GEMV_INSTANTIATE(Q5_0)
NT_GEMV_INSTANTIATE(Q5_1)
NT_GEMV_INSTANTIATE(Q8_0)

}  // namespace nt::cuda::detail
