// The chained GEMV's instantiations (matmul_gemv_chain.cuh) and its dispatch by type.
#include "backend/cuda/matmul_gemv_chain.cuh"

namespace nt::cuda::detail {

bool gemv_chain(GgmlType t, int64_t cols, const ChainArgs& c, bool pdl, cudaStream_t stream) {
    switch (t) {
        case GgmlType::Q4_K:
            return launch_chain<GgmlType::Q4_K>(c, cols, pdl, stream);
        case GgmlType::Q6_K:
            return launch_chain<GgmlType::Q6_K>(c, cols, pdl, stream);
        default:
            return false;
    }
}

int64_t gemv_chain_count() {
    return gemv_chain_launches();
}

}  // namespace nt::cuda::detail
