// GEMV instantiations for Q6_K (split across files so the build runs in parallel).
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {

NT_GEMV_INSTANTIATE(Q6_K)

}  // namespace nt::cuda::detail
