// Programmatic dependent launch (compute capability 9.0+). A kernel launched with it may start
// while the kernel before it in the stream is still finishing: it can set up and load what no
// earlier kernel writes (weights) and must call pdl_wait() before it touches anything an
// earlier kernel writes or reads (activations, outputs). A kernel that calls pdl_trigger()
// lets the next one launch as soon as all of its CTAs have started. In a stream capture the
// dependency becomes a programmatic graph edge. Without the attribute (or below sm_90) both
// calls do nothing and launches are ordinary.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.cuh"
#include "core/env.h"

namespace nt::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// pdl_wait(), then each pointer passed through an asm statement ordered after the wait, so that
// no load through it can be scheduled before the wait: the compiler takes __ldg and __restrict__
// data to be unchanging for the whole kernel and may otherwise hoist such loads above it, where
// they would read what the kernel before has not written yet (it may still be running). Every
// pointer to what an earlier kernel writes goes through here.
template <class P>
__device__ __forceinline__ void pdl_order(P& p) {
    asm volatile("" : "+l"(p)::"memory");
}
template <class... P>
__device__ __forceinline__ void pdl_wait(P&... p) {
    pdl_wait();
    (pdl_order(p), ...);
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kernels launched with PDL may also load their first weights before pdl_wait() (on
// unless NT_PDL_PREFETCH=0, for A/B runs).
inline bool pdl_prefetch_enabled() {
    static const bool on = env_switch("NT_PDL_PREFETCH");
    return on;
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch when
// `pdl`; `what` names the kernel in the error.
template <typename... Params, typename... Args>
void launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, const char* what, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = pdl ? attr : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    NT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

}  // namespace nt::cuda
