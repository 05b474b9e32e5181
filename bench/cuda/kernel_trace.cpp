// A kernel timeline for machines without a system profiler: a CUDA injection library that
// records every kernel's start and end (graph nodes included, launches left concurrent) with
// CUPTI's activity API and writes them as CSV when the program exits.
//
//   g++ -shared -fPIC -O2 -I$CUDA/include bench/cuda/kernel_trace.cpp -L$CUPTI_LIB -lcupti \
//       -o libnt_kernel_trace.so
//   CUDA_INJECTION64_PATH=$PWD/libnt_kernel_trace.so NT_TRACE_OUT=trace.csv ntransformer bench ...
//   python3 bench/cuda/kernel_timeline.py trace.csv
//
// Columns: "Start (ns)","Duration (ns)","Name" (what kernel_timeline.py reads).
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
    uint64_t start, end;
    std::string name;
};
std::mutex mu;
std::vector<Row> rows;

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = kBufferBytes;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* record = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        rows.push_back({k->start, k->end, k->name ? k->name : "?"});
    }
    std::free(buffer);
}

void write_out() {
    cuptiActivityFlushAll(1);
    const char* path = std::getenv("NT_TRACE_OUT");
    FILE* f = std::fopen(path ? path : "kernel_trace.csv", "w");
    if (!f) return;
    std::fprintf(f, "\"Start (ns)\",\"Duration (ns)\",\"Name\"\n");
    std::lock_guard<std::mutex> lock(mu);
    for (const Row& r : rows) {
        std::string n = r.name;
        for (char& c : n)
            if (c == '"') c = '\'';
        std::fprintf(f, "%llu,%llu,\"%s\"\n", (unsigned long long)r.start,
                     (unsigned long long)(r.end - r.start), n.c_str());
    }
    std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        std::fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
        return 0;
    }
    std::atexit(write_out);
    return 1;
}
