// Creates the backend a user asked for: "cpu", "cuda", or "auto" (CUDA when a usable GPU is
// present). Lives outside the core library so the core never links CUDA.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace nt {

// exact_prompt: a CUDA backend runs prompts with the CPU backend's arithmetic too
// (CudaBackend::set_exact_prompt; its decode steps always do), so that its outputs are the CPU's
// bits on every path. The CPU backend is that arithmetic already.
std::unique_ptr<Backend> make_backend(const std::string& device, int n_threads,
                                      bool exact_prompt = false);
bool cuda_available();  // built with CUDA and a GPU of compute capability >= 8.0 is present

}  // namespace nt
