// The phase marks' buffer (phase_trace.cuh): one device allocation, a share for each translation
// unit that marks, written raw to a file at the end of a measuring run.
#include "backend/cuda/phase_trace.cuh"

#ifdef NT_PHASE_TRACE
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_check.cuh"

namespace nt::cuda::phase {

namespace {
std::vector<void (*)(Record*)>& binders() {
    static std::vector<void (*)(Record*)> b;  // filled during static initialization
    return b;
}
Record* g_buffer = nullptr;
constexpr size_t kUnitRecords = size_t(kSms) * kPerSm;
}  // namespace

void register_unit(void (*bind)(Record*)) {
    binders().push_back(bind);
}

void init() {
    if (g_buffer) return;
    const size_t bytes = binders().size() * kUnitRecords * sizeof(Record);
    NT_CUDA_CHECK(cudaMalloc(&g_buffer, bytes), "phase trace buffer");
    NT_CUDA_CHECK(cudaMemset(g_buffer, 0, bytes), "phase trace buffer");
    for (size_t i = 0; i < binders().size(); ++i) binders()[i](g_buffer + i * kUnitRecords);
    NT_CUDA_CHECK(cudaDeviceSynchronize(), "phase trace buffer");
}

void dump(const char* path) {
    if (!g_buffer || !path) return;
    std::vector<Record> all(binders().size() * kUnitRecords);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(all.data(), g_buffer, all.size() * sizeof(Record), cudaMemcpyDeviceToHost) !=
            cudaSuccess)
        return;
    std::vector<Record> kept;  // the slots written
    for (const Record& r : all)
        if (r.time) kept.push_back(r);
    if (FILE* f = std::fopen(path, "wb")) {
        std::fwrite(kept.data(), sizeof(Record), kept.size(), f);
        std::fclose(f);
        std::fprintf(stderr, "phase trace: %zu marks to %s\n", kept.size(), path);
    }
}

}  // namespace nt::cuda::phase
#endif
