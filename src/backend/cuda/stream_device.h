// The CUDA side of weight streaming: a StreamDevice on a CudaBackend (its compute stream, a copy
// stream of our own, events between them, timing marks anchored to the host clock), and the
// link measurements `ntransformer doctor` prints. Plain C++ so the CLI can include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "memory/stream_device.h"

namespace nt {

// The stream device for `be` when it is a CudaBackend; null for any other backend. Made before
// the backend's init(): the memory init() takes is what backend_bytes() reports.
std::unique_ptr<mem::StreamDevice> make_cuda_stream_device(Backend& be);

struct CudaLinkReport {
    std::string gpu;         // describe(CudaDeviceInfo)
    std::string pci_bus_id;  // "0000:3b:00.0"
    uint64_t total_mem = 0, free_mem = 0;
    int async_engines = 0;
    double h2d_pinned_gbs = 0, d2h_pinned_gbs = 0, both_ways_gbs = 0, h2d_pageable_gbs = 0;
    double h2d_small_gbs = 0;  // pinned, 1 MiB copies: what per-copy overhead costs
};
// Measures GPU `device`'s links with `bytes` per copy (best of a few). Throws nt::Error.
CudaLinkReport cuda_measure_links(int device, size_t bytes);

// Tries to pin `bytes` of host memory with cudaHostAlloc; returns the seconds it took, or a
// negative number when the system refused.
double cuda_try_pin(int device, size_t bytes);

// GB/s of cuFile (GPUDirect Storage) reads of `bytes` of the file at `path` from `offset` into
// GPU `device`'s memory, `threads` reads of 8 MiB in flight (what --gds does); negative, with
// one sentence in `why`, when cuFile cannot read the file here (`why` may carry a note on
// success too: a buffer cuFile would not register).
double cuda_measure_gds(int device, const std::string& path, uint64_t offset, uint64_t bytes, int threads,
                        std::string* why);

}  // namespace nt
