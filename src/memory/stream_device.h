// What the weight streamer needs from a GPU, and nothing more: device and pinned memory, a copy
// stream beside the backend's compute stream, events between the two, and timing marks.
// CudaStreamDevice (backend/cuda/stream_device.h) implements it on a CudaBackend; the unit tests
// implement it on the host with a copy thread, so the streamer's ordering is tested without a GPU.
//
// Events follow CUDA's rules: a wait applies to the event's latest record at the time of the
// call, and a wait on an event never recorded returns at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nt::mem {

class StreamDevice {
public:
    virtual ~StreamDevice() = default;
    virtual std::string name() const = 0;

    // ---- memory
    virtual uint64_t backend_bytes() const = 0;  // device bytes the backend holds (KV, scratch)
    virtual uint64_t free_bytes() = 0;           // device memory free now
    virtual uint64_t headroom_bytes() const = 0;  // left free for the runtime (context, cuBLAS)
    virtual uint64_t resident_footprint(uint64_t nbytes) const = 0;  // one uploaded tensor
    // Throws nt::Error (one sentence, naming `what`) when the device cannot give `bytes`.
    virtual void* alloc_device(size_t bytes, const char* what) = 0;
    virtual void free_device(void* p) = 0;
    // Page-locked host memory, 4 KiB-aligned; nullptr when the system refuses to pin that much.
    virtual void* alloc_pinned(size_t bytes) = 0;
    virtual void free_pinned(void* p) = 0;

    // ---- the pipeline; events are ids 0..n-1 made by make_events
    virtual void make_events(int n) = 0;
    virtual void copy_wait(int event) = 0;  // the copy stream waits for the event
    virtual void copy_h2d(void* dst, const void* src, size_t bytes) = 0;  // on the copy stream
    virtual void copy_record(int event) = 0;
    virtual void compute_wait(int event) = 0;  // the compute stream waits for the event
    virtual void compute_record(int event) = 0;
    virtual void host_wait(int event) = 0;  // blocks the calling thread (any thread)
    virtual void sync() = 0;                // both streams drained
    // Called once before the first streamed step (the CUDA backend turns its graphs off: the
    // weight addresses and cross-stream waits change from step to step).
    virtual void begin_streaming() = 0;
    // Makes the device current on the calling thread (the reader threads that issue cuFile reads
    // into device memory). No-op where threads need nothing.
    virtual void bind_thread() {}

    // ---- timing, on the mem::now_seconds() clock
    enum class Lane { Copy, Compute };
    virtual int mark(Lane lane) = 0;
    // The mark's time once the stream has passed it (then the mark is freed); false until then.
    virtual bool resolve(int mark, double* seconds) = 0;

    // ---- ceilings measured now (GB/s): pinned host -> device, device memory read
    virtual double measure_h2d_gbs() = 0;
    virtual double measure_hbm_gbs() = 0;
};

}  // namespace nt::mem
