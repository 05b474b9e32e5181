// Weight prefetch into L2 for the GEMV kernels (internal). A warp names the next bytes it will
// read and the L2 fetches them from HBM on its own (cp.async.bulk.prefetch, sm_90: one
// instruction for a whole row, no registers held, nothing to wait for). Two gaps close:
//  - at a kernel's start, its CTAs prefetch their first rows before griddepcontrol.wait, so
//    HBM streams this kernel's weights while the small kernels before it (norm, rope,
//    attention: a few SMs, latency-bound) still run;
//  - inside a kernel, the rows a fixed distance ahead, so the register loads meet L2 latency
//    instead of HBM latency and the bytes in flight no longer depend on registers alone.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace nt::cuda::detail {

// Asks L2 to fetch [p, p + bytes): the whole 16-byte vectors inside the range (the bulk
// prefetch takes 16-byte aligned addresses and sizes; a row's stray bytes are left to its own
// loads). A hint: no effect on results, nothing on the architectures without it.
__device__ __forceinline__ void l2_prefetch(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t(15);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t(15);
    if (e > a)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(uint32_t(e - a)));
#else
    (void)p;
    (void)bytes;
#endif
}

// How far ahead of its reads a warp keeps weights on their way into L2, in bytes
// (NT_L2_AHEAD; 0 turns the prefetch off, for A/B runs).
inline int64_t l2_ahead_bytes() {
    static const int64_t bytes = [] {
        const char* e = std::getenv("NT_L2_AHEAD");
        return e ? std::max<int64_t>(0, std::atoll(e)) : int64_t(0);
    }();
    return bytes;
}

// The same distance in units of `unit_bytes` (a warp's row group): at least one unit when on.
inline int l2_ahead_units(int64_t unit_bytes) {
    const int64_t b = l2_ahead_bytes();
    if (b == 0 || unit_bytes <= 0) return 0;
    return int(std::min<int64_t>(1024, (b + unit_bytes - 1) / unit_bytes));
}

}  // namespace nt::cuda::detail
