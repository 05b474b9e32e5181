#include "backend/cuda/stream_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_info.h"
#include "core/error.h"
#include "memory/clock.h"
#include "memory/cufile.h"
#include "memory/io_reader.h"
#include "memory/planner.h"

namespace nt {

namespace {

// Left free for the CUDA context's growth, cuBLAS and graph instantiation, and the 1 MiB of
// slack the backend's weight reservation adds.
constexpr uint64_t kHeadroom = uint64_t(512) << 20;

double time_copies(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s,
                   int reps);

class CudaStreamDevice : public mem::StreamDevice {
public:
    explicit CudaStreamDevice(CudaBackend& be) : be_(be) {
        NT_CUDA_CHECK(cudaSetDevice(be.device().device), "cudaSetDevice");
        NT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate copy");
        size_t free_b = 0, total_b = 0;
        NT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        free0_ = free_b;
        NT_CUDA_CHECK(cudaEventCreate(&anchor_), "cudaEventCreate");
        anchor();
    }
    ~CudaStreamDevice() override {
        cudaStreamSynchronize(copy_);
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
        for (cudaEvent_t e : pool_) cudaEventDestroy(e);
        for (auto& [id, e] : marks_) cudaEventDestroy(e);
        if (anchor_) cudaEventDestroy(anchor_);
        if (copy_) cudaStreamDestroy(copy_);
        (void)cudaGetLastError();
    }

    std::string name() const override { return "cuda " + be_.device().name; }

    uint64_t backend_bytes() const override {
        size_t free_b = 0, total_b = 0;
        NT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        return free0_ > free_b ? free0_ - free_b : 0;
    }
    uint64_t free_bytes() override {
        size_t free_b = 0, total_b = 0;
        NT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        return free_b;
    }
    uint64_t headroom_bytes() const override { return kHeadroom; }
    uint64_t resident_footprint(uint64_t n) const override { return CudaBackend::weight_footprint(n); }

    void* alloc_device(size_t bytes, const char* what) override {
        return cuda::malloc_or_explain(bytes, what, be_.device().name.c_str(),
                                       "lower --vram-budget or --slots.");
    }
    void free_device(void* p) override { cudaFree(p); }
    void* alloc_pinned(size_t bytes) override {
        void* p = nullptr;
        // Portable: the feeder and reader threads touch it too (same context, but be explicit).
        const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        return p;
    }
    void free_pinned(void* p) override { cudaFreeHost(p); }

    void make_events(int n) override {
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
        events_.assign(size_t(n), nullptr);
        for (cudaEvent_t& e : events_)
            NT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
    void copy_wait(int e) override {
        NT_CUDA_CHECK(cudaStreamWaitEvent(copy_, events_.at(size_t(e)), 0), "cudaStreamWaitEvent copy");
    }
    void copy_h2d(void* dst, const void* src, size_t bytes) override {
        NT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_), "cudaMemcpyAsync layer");
    }
    void copy_record(int e) override {
        NT_CUDA_CHECK(cudaEventRecord(events_.at(size_t(e)), copy_), "cudaEventRecord copy");
    }
    void compute_wait(int e) override {
        NT_CUDA_CHECK(cudaStreamWaitEvent(be_.stream(), events_.at(size_t(e)), 0), "cudaStreamWaitEvent compute");
    }
    void compute_record(int e) override {
        NT_CUDA_CHECK(cudaEventRecord(events_.at(size_t(e)), be_.stream()), "cudaEventRecord compute");
    }
    void host_wait(int e) override {
        NT_CUDA_CHECK(cudaEventSynchronize(events_.at(size_t(e))), "cudaEventSynchronize");
    }
    void sync() override {
        NT_CUDA_CHECK(cudaStreamSynchronize(copy_), "cudaStreamSynchronize copy");
        NT_CUDA_CHECK(cudaStreamSynchronize(be_.stream()), "cudaStreamSynchronize compute");
        // A fresh anchor keeps event times precise on long runs (float milliseconds).
        if (marks_.empty()) anchor();
    }
    void begin_streaming() override {
        // Weight addresses (slots) and cross-stream waits change between steps: no graphs.
        be_.set_graphs(false);
        be_.set_pdl(false);
    }
    void bind_thread() override {
        // cuFile finds the slots' context through the calling thread's current device.
        if (cudaSetDevice(be_.device().device) != cudaSuccess) (void)cudaGetLastError();
    }

    int mark(Lane lane) override {
        cudaEvent_t e = nullptr;
        if (!pool_.empty()) {
            e = pool_.back();
            pool_.pop_back();
        } else {
            NT_CUDA_CHECK(cudaEventCreate(&e), "cudaEventCreate mark");
        }
        NT_CUDA_CHECK(cudaEventRecord(e, lane == Lane::Copy ? copy_ : be_.stream()), "cudaEventRecord mark");
        const int id = next_mark_++;
        marks_[id] = e;
        return id;
    }
    bool resolve(int id, double* seconds) override {
        auto it = marks_.find(id);
        if (it == marks_.end()) return false;
        const cudaError_t q = cudaEventQuery(it->second);
        if (q == cudaErrorNotReady) return false;
        NT_CUDA_CHECK(q, "cudaEventQuery mark");
        float ms = 0;
        NT_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_, it->second), "cudaEventElapsedTime");
        *seconds = anchor_host_ + double(ms) * 1e-3;
        pool_.push_back(it->second);
        marks_.erase(it);
        return true;
    }

    double measure_h2d_gbs() override {
        const size_t bytes = size_t(256) << 20;
        void* h = nullptr;
        void* d = nullptr;
        double best = 0;
        try {
            NT_CUDA_CHECK(cudaHostAlloc(&h, bytes, 0), "cudaHostAlloc bandwidth buffer");
            NT_CUDA_CHECK(cudaMalloc(&d, bytes), "cudaMalloc bandwidth buffer");
            std::memset(h, 1, bytes);
            best = time_copies(d, h, bytes, cudaMemcpyHostToDevice, copy_, 3);
        } catch (...) {
            best = 0;
        }
        if (h) cudaFreeHost(h);
        if (d) cudaFree(d);
        (void)cudaGetLastError();
        return best;
    }
    double measure_hbm_gbs() override { return be_.measure_read_bandwidth(); }

private:
    void anchor() {
        NT_CUDA_CHECK(cudaEventRecord(anchor_, be_.stream()), "cudaEventRecord anchor");
        NT_CUDA_CHECK(cudaEventSynchronize(anchor_), "cudaEventSynchronize anchor");
        anchor_host_ = mem::now_seconds();
    }

    CudaBackend& be_;
    cudaStream_t copy_ = nullptr;
    size_t free0_ = 0;
    std::vector<cudaEvent_t> events_;
    std::vector<cudaEvent_t> pool_;
    std::map<int, cudaEvent_t> marks_;
    int next_mark_ = 0;
    cudaEvent_t anchor_ = nullptr;
    double anchor_host_ = 0;
};

// Best GB/s of `reps` copies of `bytes` on `s`.
double time_copies(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s, int reps) {
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    double best = 0;
    try {
        NT_CUDA_CHECK(cudaEventCreate(&e0), "cudaEventCreate");
        NT_CUDA_CHECK(cudaEventCreate(&e1), "cudaEventCreate");
        for (int r = 0; r <= reps; r++) {  // the first is a warm-up
            NT_CUDA_CHECK(cudaEventRecord(e0, s), "cudaEventRecord");
            NT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
            NT_CUDA_CHECK(cudaEventRecord(e1, s), "cudaEventRecord");
            NT_CUDA_CHECK(cudaEventSynchronize(e1), "cudaEventSynchronize");
            float ms = 0;
            NT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
            if (r > 0 && ms > 0) best = std::max(best, double(bytes) / (double(ms) * 1e-3) / 1e9);
        }
    } catch (...) {
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        throw;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

}  // namespace

std::unique_ptr<mem::StreamDevice> make_cuda_stream_device(Backend& be) {
    auto* cb = dynamic_cast<CudaBackend*>(&be);
    if (!cb) return nullptr;
    return std::make_unique<CudaStreamDevice>(*cb);
}

CudaLinkReport cuda_measure_links(int device, size_t bytes) {
    CudaLinkReport r;
    const CudaDeviceInfo info = cuda_device_info(device);
    r.gpu = describe(info);
    char bus[32] = {};
    NT_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device), "cudaDeviceGetPCIBusId");
    r.pci_bus_id = bus;
    size_t free_b = 0, total_b = 0;
    NT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    r.free_mem = free_b;
    r.total_mem = total_b;
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&r.async_engines, cudaDevAttrAsyncEngineCount, device), "cudaDeviceGetAttribute");

    void *h = nullptr, *h2 = nullptr, *d = nullptr, *d2 = nullptr;
    char* pageable = nullptr;
    cudaStream_t s1 = nullptr, s2 = nullptr;
    try {
        NT_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), "cudaStreamCreate");
        NT_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreate");
        NT_CUDA_CHECK(cudaHostAlloc(&h, bytes, 0), "cudaHostAlloc");
        NT_CUDA_CHECK(cudaHostAlloc(&h2, bytes, 0), "cudaHostAlloc");
        NT_CUDA_CHECK(cudaMalloc(&d, bytes), "cudaMalloc");
        NT_CUDA_CHECK(cudaMalloc(&d2, bytes), "cudaMalloc");
        std::memset(h, 1, bytes);
        std::memset(h2, 2, bytes);
        r.h2d_pinned_gbs = time_copies(d, h, bytes, cudaMemcpyHostToDevice, s1, 4);
        r.d2h_pinned_gbs = time_copies(h2, d2, bytes, cudaMemcpyDeviceToHost, s1, 4);
        r.h2d_small_gbs = time_copies(d, h, size_t(1) << 20, cudaMemcpyHostToDevice, s1, 20);
        // Both directions at once, on two streams (two copy engines).
        {
            const double t0 = mem::now_seconds();
            for (int i = 0; i < 3; i++) {
                NT_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s1), "cudaMemcpyAsync");
                NT_CUDA_CHECK(cudaMemcpyAsync(h2, d2, bytes, cudaMemcpyDeviceToHost, s2), "cudaMemcpyAsync");
            }
            NT_CUDA_CHECK(cudaStreamSynchronize(s1), "cudaStreamSynchronize");
            NT_CUDA_CHECK(cudaStreamSynchronize(s2), "cudaStreamSynchronize");
            r.both_ways_gbs = 6.0 * double(bytes) / (mem::now_seconds() - t0) / 1e9;
        }
        pageable = static_cast<char*>(std::malloc(bytes));
        if (!pageable) fail("out of host memory for the pageable copy test.");
        std::memset(pageable, 3, bytes);  // touch every page: measure the copy, not page faults
        r.h2d_pageable_gbs = time_copies(d, pageable, bytes, cudaMemcpyHostToDevice, s1, 3);
    } catch (...) {
        std::free(pageable);
        if (h) cudaFreeHost(h);
        if (h2) cudaFreeHost(h2);
        if (d) cudaFree(d);
        if (d2) cudaFree(d2);
        if (s1) cudaStreamDestroy(s1);
        if (s2) cudaStreamDestroy(s2);
        throw;
    }
    std::free(pageable);
    cudaFreeHost(h);
    cudaFreeHost(h2);
    cudaFree(d);
    cudaFree(d2);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    return r;
}

double cuda_try_pin(int device, size_t bytes) {
    NT_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    void* p = nullptr;
    const double t0 = mem::now_seconds();
    const cudaError_t e = cudaHostAlloc(&p, bytes, 0);
    const double dt = mem::now_seconds() - t0;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    cudaFreeHost(p);
    return dt;
}

double cuda_measure_gds(int device, const std::string& path, uint64_t offset, uint64_t bytes, int threads,
                        std::string* why) {
    NT_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    const mem::CuFileApi* api = mem::cufile_api(why);
    if (!api) return -1;
    mem::ReaderOptions o;
    o.threads = threads;
    o.gds = api;
    o.thread_init = [device] { (void)cudaSetDevice(device); };
    auto r = std::make_unique<mem::FileReader>(path, o);
    if (!r->gds()) {
        *why = r->gds_reason();
        return -1;
    }
    offset = mem::align_down(std::min<uint64_t>(offset, r->size()), mem::kBlobAlign);
    bytes = std::min<uint64_t>(bytes, mem::align_down(r->size() - offset, mem::kBlobAlign));
    if (bytes < mem::kBlobAlign) {
        *why = "the file is too small to measure";
        return -1;
    }
    // Two halves of one registered buffer, read alternately so that reads stay in flight.
    const uint64_t half = uint64_t(128) << 20;
    char* d = nullptr;
    NT_CUDA_CHECK(cudaMalloc(&d, 2 * half), "cudaMalloc cuFile buffer");
    r->gds_register(d, 2 * half, why);  // refused: slower reads through cuFile's bounce buffers, and a note
    mem::FileReader::Ticket t[2] = {0, 0};
    double gbs = -1;
    try {
        const double t0 = mem::now_seconds();
        uint64_t done = 0;
        for (int i = 0; done < bytes; i++) {
            if (t[i % 2]) r->wait(std::exchange(t[i % 2], 0));
            const uint64_t len = std::min(half, bytes - done);
            t[i % 2] = r->submit_device({{offset + done, len, 0}}, d + size_t(i % 2) * half);
            done += len;
        }
        for (auto& x : t)
            if (x) r->wait(std::exchange(x, 0));
        gbs = double(bytes) / (mem::now_seconds() - t0) / 1e9;
    } catch (const Error& e) {
        *why = e.what();
    }
    r.reset();  // the reads in flight land and the buffer is deregistered before it is freed
    cudaFree(d);
    return gbs;
}

}  // namespace nt
