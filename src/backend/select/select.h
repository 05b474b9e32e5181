// Creates the backend a user asked for: "cpu", "cuda", or "auto" (CUDA when a usable GPU is
// present). Lives outside the core library so the core never links CUDA.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace nt {

std::unique_ptr<Backend> make_backend(const std::string& device, int n_threads);
bool cuda_available();  // built with CUDA and a GPU of compute capability >= 8.0 is present

}  // namespace nt
