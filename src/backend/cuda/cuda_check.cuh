// Error checking for every CUDA runtime and cuBLAS call in the CUDA backend: a failing call becomes
// nt::Error("CUDA error in <op>: <reason>") so front ends report it like any other failure.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace nt::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* op) {
    throw nt::Error(nt::strfmt("CUDA error in %s: %s", op, cudaGetErrorString(e)));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* op) {
    throw nt::Error(nt::strfmt("CUDA error in %s: cuBLAS %s", op, cublasGetStatusString(s)));
}

inline void check(cudaError_t e, const char* op) {
    if (e != cudaSuccess) throw_cuda_error(e, op);
}
inline void check(cublasStatus_t s, const char* op) {
    if (s != CUBLAS_STATUS_SUCCESS) throw_cublas_error(s, op);
}

// cudaMalloc of `bytes`, or where the GPU's memory is short one sentence that says what did not
// fit and what to do: "not enough GPU memory for <what>: need <bytes>, <free> free on <device>;
// <advice>". Any other failure as check() reports it.
inline void* malloc_or_explain(size_t bytes, const char* what, const char* device,
                               const char* advice) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        auto size = [](size_t n) {
            return n < (size_t(1) << 30) ? nt::strfmt("%.1f MiB", double(n) / double(1 << 20))
                                         : nt::strfmt("%.2f GiB", double(n) / double(1 << 30));
        };
        throw nt::Error(nt::strfmt("not enough GPU memory for %s: need %s, %s free on %s; %s", what,
                                   size(bytes).c_str(), size(free_b).c_str(), device, advice));
    }
    check(e, "cudaMalloc");
    return p;
}

}  // namespace nt::cuda

// NT_CUDA_CHECK(cudaMalloc(&p, n), "cudaMalloc weights"): evaluates expr once; accepts a
// cudaError_t or a cublasStatus_t. After a kernel launch use NT_CUDA_CHECK(cudaGetLastError(),
// "name").
#define NT_CUDA_CHECK(expr, op) ::nt::cuda::check((expr), (op))
