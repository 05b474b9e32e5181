// Which GPU the CUDA backend runs on, and whether it can: compute capability 8.0 (Ampere) or newer
// with GPU code in this build for it. Plain C++ so the backend selector can include it.
#pragma once
#include <cstddef>
#include <string>

namespace nt {

struct CudaDeviceInfo {
    int device = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;
    int sm_count = 0;
    size_t total_mem = 0;  // bytes
    size_t l2_bytes = 0;
    size_t smem_per_block_optin = 0;  // the most dynamic shared memory a block may ask for
    size_t smem_per_sm = 0;
};

// Number of GPUs this build can run on (0 when there is no driver, no GPU, or only older GPUs).
int cuda_usable_device_count();

// Properties of GPU `device`; throws nt::Error with one sentence when there is no GPU, when it is
// older than compute capability 8.0, or when this build carries no code for it.
CudaDeviceInfo cuda_device_info(int device = 0);

// "NVIDIA H200 (compute capability 9.0, 132 SMs, 139.8 GiB)".
std::string describe(const CudaDeviceInfo& info);

}  // namespace nt
