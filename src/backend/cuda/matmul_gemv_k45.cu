// GEMV instantiations for Q4_K, Q5_K (split across files so the build runs in parallel).
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {

NT_GEMV_INSTANTIATE(Q4_K)
NT_GEMV_INSTANTIATE(Q5_K)

}  // namespace nt::cuda::detail
