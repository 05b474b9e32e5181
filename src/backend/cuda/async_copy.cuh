// Asynchronous global -> shared copies (cp.async, compute capability 8.0+), shared by the kernels
// that stage data through shared memory (GEMV, attention). Device code only; include from .cu
// files.
#pragma once
#include <cuda_runtime.h>

namespace nt::cuda::detail {

// 16 bytes, bypassing L1; only the first src_bytes are read, the rest of the 16 are zeroed.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}
// 8 bytes through L1 (.cg takes only 16); only the first src_bytes (0 or 8) are read.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes = 8) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace nt::cuda::detail
