#include "backend/select/select.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#ifdef NT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#endif

namespace nt {

bool cuda_available() {
#ifdef NT_HAVE_CUDA
    return cuda_usable_device_count() > 0;
#else
    return false;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device, int n_threads, bool exact_prompt) {
    if (device == "cpu") return std::make_unique<CpuBackend>(n_threads);
    if (device == "cuda" || device == "auto") {
#ifdef NT_HAVE_CUDA
        if (device == "auto" && !cuda_available()) return std::make_unique<CpuBackend>(n_threads);
        auto gpu = std::make_unique<CudaBackend>();  // throws a clear sentence when no usable GPU
        if (exact_prompt) gpu->set_exact_prompt(true);
        return gpu;
#else
        (void)exact_prompt;
        if (device == "auto") return std::make_unique<CpuBackend>(n_threads);
        fail("this build of ntransformer has no CUDA backend; rebuild with -DNT_CUDA=ON or use --device cpu.");
#endif
    }
    fail("unknown device '%s' (choose cpu, cuda or auto).", device.c_str());
}

}  // namespace nt
