// The current GPU's multiprocessors and shared-memory limits, read once (host code): what
// launches size their grids and shared memory by.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.cuh"

namespace nt::cuda::detail {

struct DeviceLimits {
    int sms = 0;          // multiprocessors
    int optin = 0;        // the most dynamic shared memory a block may ask for
    int smem_per_sm = 0;  // shared memory a multiprocessor holds
    int reserved = 0;     // shared memory the system takes a block
    int l2 = 0;           // bytes of L2 cache
};
inline const DeviceLimits& device_limits() {
    static const DeviceLimits d = [] {
        DeviceLimits v;
        int dev = 0;
        NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
        const std::pair<int*, cudaDeviceAttr> attrs[] = {
            {&v.sms, cudaDevAttrMultiProcessorCount},
            {&v.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
            {&v.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
            {&v.reserved, cudaDevAttrReservedSharedMemoryPerBlock},
            {&v.l2, cudaDevAttrL2CacheSize}};
        for (auto [out, attr] : attrs)
            NT_CUDA_CHECK(cudaDeviceGetAttribute(out, attr, dev), "device attribute");
        return v;
    }();
    return d;
}

}  // namespace nt::cuda::detail
