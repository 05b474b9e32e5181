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
void* malloc_or_explain(size_t bytes, const char* what, const char* device, const char* advice);

}  // namespace nt::cuda

// NT_CUDA_CHECK(cudaMalloc(&p, n), "cudaMalloc weights"): evaluates expr once; accepts a
// cudaError_t or a cublasStatus_t. After a kernel launch use NT_CUDA_CHECK(cudaGetLastError(),
// "name").
#define NT_CUDA_CHECK(expr, op) ::nt::cuda::check((expr), (op))
