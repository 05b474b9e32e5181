// The fence of the "last to finish" handoffs: a warp or block writes its partial results and
// counts itself done with an atomic; the one that completes the count reads everyone's (the
// column-split GEMV, the SwiGLU pair's own quantization, the decode attention's slice merge).
// Under the PTX memory model fence.acq_rel.gpu is all that pattern needs (release: the
// writes, the fence, then the atomic; acquire: the atomic, the fence, then the reads).
// __threadfence() is fence.sc.gpu, which the PTX manual calls the slower fence: it restores
// sequential consistency, which none of these handoffs relies on. Device code only.
#pragma once

namespace nt::cuda {

__device__ __forceinline__ void fence_acq_rel_gpu() {
#ifdef NT_FENCE_SC  // the sequentially consistent fence, for A/B builds
    __threadfence();
#else
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
}

}  // namespace nt::cuda
