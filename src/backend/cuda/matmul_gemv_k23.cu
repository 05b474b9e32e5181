// GEMV instantiations for Q2_K, Q3_K (split across files so the build runs in parallel).
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {

NT_GEMV_INSTANTIATE(Q2_K)
NT_GEMV_INSTANTIATE(Q3_K)

}  // namespace nt::cuda::detail
