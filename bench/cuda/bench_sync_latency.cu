// What one warp's synchronization costs while the rest of the GPU streams weights: the latency
// of a global atomic whose result is used, of a dependent load that hits L2, and of a
// __threadfence after a store, each measured alone on an idle GPU and then beside a grid that
// reads HBM as fast as it can (a decode GEMV's situation). Every way of fusing decode kernels
// across CTAs (a last-CTA handoff, a grid-wide flag, claimed work) puts some of these on the
// critical path; this says at what price.
//
//   bench_sync_latency [--mib 4096] [--samples 2000] [--ctas-per-sm 4]
//
// The probe is warp 0 of block 0; with load, every other block reads a buffer of --mib MiB
// (16-byte streaming loads) until the probe is done. Latencies are the mean of --samples
// dependent operations (each one's address or value depends on the one before), in ns.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.cuh"

using namespace nt;

namespace {

struct Opts {
    long long mib = 4096;
    int samples = 2000;
    int ctas_per_sm = 4;
};

struct Probe {
    int* counter;      // the atomics' target
    const int* chain;  // 64 ints, chain[i] = (i + 1) % 64: a pointer chase held in L2
    int* store;        // what the fence follows
    int mask;          // 0 at run time: makes each address depend on the last result
    int samples;
    unsigned long long* out;  // ns: atomic, L2 load, fence; then the streamed bytes
    volatile int* stop;       // set by the probe when it is done
};

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__global__ void sync_latency(Probe p, const int4* __restrict__ buf, long long n16) {
    if (blockIdx.x == 0) {
        if (threadIdx.x != 0) return;
        if (gridDim.x > 1) {  // let the streaming blocks reach full bandwidth first
            const unsigned long long t = now_ns();
            while (now_ns() - t < 50000) {
            }
        }
        int v = 0;
        unsigned long long t0 = now_ns();
        for (int i = 0; i < p.samples; ++i) v = atomicAdd(p.counter + (v & p.mask), 1);
        unsigned long long t1 = now_ns();
        p.out[0] = (t1 - t0) / p.samples;
        int idx = v & p.mask;
        t0 = now_ns();
        for (int i = 0; i < p.samples; ++i) idx = __ldcg(p.chain + idx);
        t1 = now_ns();
        p.out[1] = (t1 - t0) / p.samples;
        t0 = now_ns();
        for (int i = 0; i < p.samples; ++i) {
            p.store[idx & p.mask] = i;
            __threadfence();
        }
        t1 = now_ns();
        p.out[2] = (t1 - t0) / p.samples + (idx == 12345 ? 1 : 0);
        *p.stop = 1;
        return;
    }
    // Streaming blocks: grid-stride 16-byte loads, evict-first, until the probe is done.
    const long long stride = (long long)(gridDim.x - 1) * blockDim.x;
    long long i = (long long)(blockIdx.x - 1) * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    long long bytes = 0;  // this thread's
    while (true) {
        for (int r = 0; r < 8; ++r) {  // the flag read once every 64 loads
#pragma unroll 8
            for (int k = 0; k < 8; ++k) {
                const int4 q = __ldcs(buf + i);
                acc ^= unsigned(q.x ^ q.y ^ q.z ^ q.w);
                i += stride;
                if (i >= n16) i -= n16;
            }
        }
        bytes += 64 * 16;
        if (*p.stop) break;
    }
    if (acc == 0x9e3779b9u) p.store[1] = int(acc);  // keeps the loads
    const unsigned warp_bytes = __reduce_add_sync(0xffffffffu, unsigned(bytes));
    if ((threadIdx.x & 31) == 0) atomicAdd(p.out + 3, (unsigned long long)warp_bytes);
}

long long arg_ll(int& i, int argc, char** argv) {
    if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(1);
    }
    return std::atoll(argv[++i]);
}

}  // namespace

int main(int argc, char** argv) {
    Opts o;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--mib"))
            o.mib = arg_ll(i, argc, argv);
        else if (!std::strcmp(argv[i], "--samples"))
            o.samples = int(arg_ll(i, argc, argv));
        else if (!std::strcmp(argv[i], "--ctas-per-sm"))
            o.ctas_per_sm = int(arg_ll(i, argc, argv));
        else {
            std::fprintf(stderr,
                         "usage: bench_sync_latency [--mib N] [--samples N] [--ctas-per-sm N]\n");
            return 1;
        }
    }
    if (o.mib < 64 || o.samples < 1 || o.ctas_per_sm < 1) {
        std::fprintf(
            stderr,
            "bench_sync_latency: --mib at least 64, --samples and --ctas-per-sm at least 1.\n");
        return 1;
    }
    try {
        int sms = 0;
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sms");
        const size_t bytes = size_t(o.mib) << 20;
        int4* buf = nullptr;
        NT_CUDA_CHECK(cudaMalloc(&buf, bytes), "cudaMalloc buffer");
        NT_CUDA_CHECK(cudaMemset(buf, 1, bytes), "cudaMemset buffer");
        int* ints = nullptr;
        NT_CUDA_CHECK(cudaMalloc(&ints, 4096), "cudaMalloc ints");
        int chain[64];
        for (int i = 0; i < 64; ++i) chain[i] = (i + 1) % 64;
        NT_CUDA_CHECK(cudaMemset(ints, 0, 4096), "cudaMemset ints");
        NT_CUDA_CHECK(cudaMemcpy(ints + 256, chain, sizeof chain, cudaMemcpyHostToDevice), "chain");
        unsigned long long* out = nullptr;
        NT_CUDA_CHECK(cudaMalloc(&out, 4 * sizeof(unsigned long long)), "cudaMalloc out");
        int* stop = nullptr;
        NT_CUDA_CHECK(cudaMalloc(&stop, sizeof(int)), "cudaMalloc stop");

        const Probe base{ints, ints + 256, ints + 512, 0, o.samples, out, stop};
        std::printf(
            "probe: %d dependent operations each; load: %d CTAs of 256 threads reading %lld MiB\n",
            o.samples, sms * o.ctas_per_sm, o.mib);
        for (int loaded = 0; loaded < 2; ++loaded) {
            for (int rep = 0; rep < 2; ++rep) {  // the first of each is a warm-up
                NT_CUDA_CHECK(cudaMemset(out, 0, 4 * sizeof(unsigned long long)), "reset");
                NT_CUDA_CHECK(cudaMemset(stop, 0, sizeof(int)), "reset");
                cudaEvent_t e0, e1;
                NT_CUDA_CHECK(cudaEventCreate(&e0), "event");
                NT_CUDA_CHECK(cudaEventCreate(&e1), "event");
                const int grid = loaded ? 1 + sms * o.ctas_per_sm : 1;
                NT_CUDA_CHECK(cudaEventRecord(e0), "event");
                sync_latency<<<grid, loaded ? 256 : 32>>>(base, buf, (long long)(bytes / 16));
                NT_CUDA_CHECK(cudaGetLastError(), "sync_latency launch");
                NT_CUDA_CHECK(cudaEventRecord(e1), "event");
                NT_CUDA_CHECK(cudaEventSynchronize(e1), "sync_latency");
                float ms = 0;
                NT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
                unsigned long long r[4];
                NT_CUDA_CHECK(cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost), "read back");
                if (rep == 0) continue;
                std::printf(
                    "%-7s atomicAdd (result used) %6llu ns | L2-hit load %5llu ns | store + "
                    "__threadfence %6llu ns",
                    loaded ? "loaded:" : "idle:", r[0], r[1], r[2]);
                if (loaded)
                    std::printf(" | streaming %.0f GB/s over %.2f ms", double(r[3]) / (ms * 1e6),
                                ms);
                std::printf("\n");
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
            }
        }
        cudaFree(buf);
        cudaFree(ints);
        cudaFree(out);
        cudaFree(stop);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_sync_latency: %s\n", e.what());
        return 1;
    }
    return 0;
}
