#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_info.h"
#include "core/error.h"
#include "memory/planner.h"

namespace nt {

namespace {

constexpr int kMinMajor = 8;  // cp.async, bf16 and the mma shapes the kernels use need Ampere

// Loading any kernel tells whether this build carries GPU code (or PTX) the device can run.
__global__ void probe_kernel() {}

bool supported(const cudaDeviceProp& p) {
    return p.major >= kMinMajor;
}

}  // namespace

void* cuda::malloc_or_explain(size_t bytes, const char* what, const char* device,
                              const char* advice) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        fail("not enough GPU memory for %s: need %s, %s free on %s; %s", what,
             mem::format_size(bytes).c_str(), mem::format_size(free_b).c_str(), device, advice);
    }
    cuda::check(e, "cudaMalloc");
    return p;
}

int cuda_usable_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver or no GPU: not an error for a query
        return 0;
    }
    int usable = 0;
    for (int d = 0; d < n; d++) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, d) == cudaSuccess && supported(p)) usable++;
    }
    return usable;
}

CudaDeviceInfo cuda_device_info(int device) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        fail(
            "no CUDA GPU found (%s); run on a machine with an NVIDIA GPU and its driver, or use "
            "--device cpu.",
            e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports no devices");
    }
    if (device < 0 || device >= n)
        fail("GPU %d does not exist (this machine has %d CUDA GPU%s).", device, n,
             n == 1 ? "" : "s");
    cudaDeviceProp p{};
    NT_CUDA_CHECK(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    if (!supported(p))
        fail(
            "GPU %d (%s) has compute capability %d.%d, but the CUDA backend needs %d.0 (Ampere) or "
            "newer; use --device cpu.",
            device, p.name, p.major, p.minor, kMinMajor);

    NT_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    cudaFuncAttributes attr{};
    const cudaError_t fe = cudaFuncGetAttributes(&attr, probe_kernel);
    if (fe != cudaSuccess) {
        (void)cudaGetLastError();
        fail(
            "this build has no GPU code for %s (compute capability %d.%d: %s); rebuild with "
            "-DCMAKE_CUDA_ARCHITECTURES=%d%d.",
            p.name, p.major, p.minor, cudaGetErrorString(fe), p.major, p.minor);
    }

    CudaDeviceInfo info;
    info.device = device;
    info.name = p.name;
    info.cc_major = p.major;
    info.cc_minor = p.minor;
    info.sm_count = p.multiProcessorCount;
    info.total_mem = p.totalGlobalMem;
    info.l2_bytes = size_t(p.l2CacheSize);
    info.smem_per_block_optin = p.sharedMemPerBlockOptin;
    info.smem_per_sm = p.sharedMemPerMultiprocessor;
    return info;
}

std::string describe(const CudaDeviceInfo& info) {
    return strfmt("%s (compute capability %d.%d, %d SMs, %.1f GiB)", info.name.c_str(),
                  info.cc_major, info.cc_minor, info.sm_count,
                  double(info.total_mem) / double(1ull << 30));
}

}  // namespace nt
