// Weights pulled into L2 ahead of the kernels that read them. A decode layer's attention reads no
// weights and runs on a few multiprocessors, so HBM idles for its whole length; a kernel that
// runs there can ask L2 for the weights of the kernels after it (the o projection, the first
// rows of gate/up), which then read them from L2. The requests are bulk prefetches
// (cp.async.bulk.prefetch.L2): fire and forget, no shared memory, nothing to wait for, and
// only a hint to the memory system, so what the kernels compute does not change.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define NT_L2_HD __host__ __device__ __forceinline__
#else
#define NT_L2_HD inline
#endif

namespace nt::cuda {

struct L2Ahead {
    static constexpr int kMaxRanges = 3;
    static constexpr uint32_t kChunk = 32u << 10;  // bytes a request
    const void* p[kMaxRanges] = {};                // 16-byte aligned
    uint32_t bytes[kMaxRanges] = {};               // multiples of 16
    int n = 0;
};

// Calls f(address, bytes) for worker `worker` of `workers`'s share of the ranges' chunks: chunk c
// of the ranges laid end to end goes to worker c mod workers.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
NT_L2_HD void for_each_l2_chunk(const L2Ahead& a, unsigned worker, unsigned workers, F&& f) {
    unsigned first = 0;  // index of the range's first chunk in the whole list
#if defined(__CUDACC__)
#pragma unroll  // constant indices: the ranges stay in the kernel's parameter space
#endif
    for (int r = 0; r < L2Ahead::kMaxRanges; r++) {
        if (r >= a.n) break;
        const char* p = static_cast<const char*>(a.p[r]);
        const uint32_t nb = a.bytes[r];
        const unsigned chunks = (nb + L2Ahead::kChunk - 1) / L2Ahead::kChunk;
        for (unsigned c = (worker + workers - first % workers) % workers; c < chunks;
             c += workers) {
            const uint32_t off = c * L2Ahead::kChunk;
            f(p + off, nb - off < L2Ahead::kChunk ? nb - off : L2Ahead::kChunk);
        }
        first += chunks;
    }
}

#if defined(__CUDACC__)
// The worker's share, asked of L2. sm_90 and newer; elsewhere nothing.
__device__ __forceinline__ void l2_prefetch_share(const L2Ahead& a, unsigned worker,
                                                  unsigned workers) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for_each_l2_chunk(a, worker, workers, [](const char* p, uint32_t len) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(len) : "memory");
    });
#endif
}
#endif

}  // namespace nt::cuda
