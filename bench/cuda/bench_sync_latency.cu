// What one warp's synchronization costs while the rest of the GPU streams weights: the latency
// of a global atomic whose result is used, of a dependent load that hits L2, and of a
// __threadfence after a store, each measured alone on an idle GPU and then beside a grid that
// reads HBM as fast as it can (a decode GEMV's situation). Every way of fusing decode kernels
// across CTAs (a last-CTA handoff, a grid-wide flag, claimed work) puts some of these on the
// critical path; this says at what price. Then the handoff a cluster offers instead: each CTA
// of a cluster of 2, 4 or 8 stores into the first CTA's shared memory (distributed shared
// memory) and all meet at the cluster barrier, which orders those stores without a fence at
// gpu scope.
//
//   bench_sync_latency [--mib 4096] [--samples 2000] [--ctas-per-sm 4]
//
// The probe is warp 0 of block 0 (for the cluster, every thread of the first cluster); with
// load, every other block reads a buffer of --mib MiB (16-byte streaming loads) until the probe
// is done. Latencies are the mean of --samples dependent operations (each one's address or value
// depends on the one before), in ns.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_info.h"
#include "matmul_harness.h"

using namespace nt;
using bench::DeviceBuffer;

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

// The load: grid-stride 16-byte loads, evict-first, by the blocks from `first` on, until the
// probe is done; their bytes counted into p.out[3].
__device__ void stream_until_stop(const Probe& p, const int4* __restrict__ buf, long long n16,
                                  int first) {
    const long long stride = (long long)(gridDim.x - first) * blockDim.x;
    long long i = (long long)(blockIdx.x - first) * blockDim.x + threadIdx.x;
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

// With load, the probe waits until the streaming blocks are at full bandwidth.
__device__ void settle(bool loaded) {
    if (!loaded) return;
    const unsigned long long t = now_ns();
    while (now_ns() - t < 50000) {
    }
}

__global__ void sync_latency(Probe p, const int4* __restrict__ buf, long long n16) {
    if (blockIdx.x == 0) {
        if (threadIdx.x != 0) return;
        settle(gridDim.x > 1);
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
        p.out[2] = (t1 - t0) / p.samples;
        *p.stop = 1;
        return;
    }
    stream_until_stop(p, buf, n16, 1);
}

// The first cluster's CTAs, --samples rounds: thread 0 of each stores the round's number into
// its slot of the first CTA's shared memory, then every thread arrives at the cluster barrier
// and waits; the first CTA's thread 0 then checks every slot (p.out[2] counts the slots that
// did not hold the round: the barrier's ordering failing) and times the rounds (p.out[0]). Two
// sets of slots, by the round's parity: a set is written again two rounds later, after a
// barrier that the check precedes, so one barrier a round suffices. The other clusters stream.
__global__ void cluster_latency(Probe p, const int4* __restrict__ buf, long long n16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ int slot[2][8];
    const int csize = int(cluster.num_blocks());
    if (blockIdx.x >= unsigned(csize)) return stream_until_stop(p, buf, n16, csize);
    const int rank = int(cluster.block_rank());
    int* lead = cluster.map_shared_rank(&slot[0][0], 0);
    settle(gridDim.x > unsigned(csize));
    cluster.sync();
    unsigned long long wrong = 0;
    const unsigned long long t0 = now_ns();
    for (int i = 0; i < p.samples; ++i) {
        if (threadIdx.x == 0) lead[(i & 1) * 8 + rank] = i;
        cluster.sync();
        if (rank == 0 && threadIdx.x == 0)
            for (int r = 0; r < csize; ++r) wrong += slot[i & 1][r] != i;
    }
    const unsigned long long t1 = now_ns();
    if (rank == 0 && threadIdx.x == 0) {
        p.out[0] = (t1 - t0) / p.samples;
        p.out[2] = wrong;
        *p.stop = 1;
    }
#else
    __trap();  // launched only on compute capability 9.0+
#endif
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
        const CudaDeviceInfo dev = cuda_device_info(0);
        const size_t bytes = size_t(o.mib) << 20;
        DeviceBuffer<int4> buf(bytes / 16);
        NT_CUDA_CHECK(cudaMemset(buf.p, 1, bytes), "cudaMemset buffer");
        DeviceBuffer<int> ints(1024);  // the counter, then the chain at 256, the store at 512
        NT_CUDA_CHECK(cudaMemset(ints.p, 0, 1024 * sizeof(int)), "cudaMemset ints");
        int chain[64];
        for (int i = 0; i < 64; ++i) chain[i] = (i + 1) % 64;
        NT_CUDA_CHECK(cudaMemcpy(ints.p + 256, chain, sizeof chain, cudaMemcpyHostToDevice),
                      "chain");
        DeviceBuffer<unsigned long long> out(4);
        DeviceBuffer<int> stop(1);

        const Probe base{ints.p, ints.p + 256, ints.p + 512, 0, o.samples, out.p, stop.p};
        const int load = dev.sm_count * o.ctas_per_sm;
        std::printf("# device: %s\n", describe(dev).c_str());
        std::printf(
            "probe: %d dependent operations each; load: %d CTAs of 256 threads reading %lld MiB\n",
            o.samples, load, o.mib);
        // One launch after a warm-up one (in clusters of `cluster` CTAs): the probe's figures
        // (out) and the launch's ms.
        struct Result {
            std::vector<unsigned long long> r;
            double ms;
        };
        auto measure = [&](void (*kernel)(Probe, const int4*, long long), int grid, int block,
                           int cluster) {
            cudaLaunchConfig_t cfg{};
            cfg.gridDim = dim3(unsigned(grid));
            cfg.blockDim = dim3(unsigned(block));
            cudaLaunchAttribute attr{};
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = unsigned(cluster);
            attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
            cfg.attrs = cluster > 1 ? &attr : nullptr;
            cfg.numAttrs = cluster > 1 ? 1 : 0;
            const double us = bench::time_stream_us(nullptr, 1, [&](int) {
                NT_CUDA_CHECK(cudaMemset(out.p, 0, 4 * sizeof(unsigned long long)), "reset");
                NT_CUDA_CHECK(cudaMemset(stop.p, 0, sizeof(int)), "reset");
                NT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, base, (const int4*)buf.p,
                                                 (long long)(bytes / 16)),
                              "probe launch");
            });
            return Result{out.download(4), us / 1000.0};
        };
        // The line's end: with load, what the streaming blocks read.
        auto end_line = [](bool loaded, const Result& res) {
            if (loaded)
                std::printf(" | streaming %.0f GB/s over %.2f ms",
                            double(res.r[3]) / (res.ms * 1e6), res.ms);
            std::printf("\n");
        };
        for (int loaded = 0; loaded < 2; ++loaded) {
            const Result res = measure(sync_latency, loaded ? 1 + load : 1, loaded ? 256 : 32, 1);
            std::printf(
                "%-7s atomicAdd (result used) %6llu ns | L2-hit load %5llu ns | store + "
                "__threadfence %6llu ns",
                loaded ? "loaded:" : "idle:", res.r[0], res.r[1], res.r[2]);
            end_line(loaded, res);
        }
        if (dev.cc_major < 9) {
            std::printf("no clusters below compute capability 9.0\n");
            return 0;
        }
        for (int c : {2, 4, 8}) {
            for (int loaded = 0; loaded < 2; ++loaded) {
                const int grid = loaded ? c + load / c * c : c;
                const Result res = measure(cluster_latency, grid, 256, c);
                std::printf(
                    "%-7s cluster of %d: DSMEM store + cluster barrier %6llu ns (%llu slots wrong)",
                    loaded ? "loaded:" : "idle:", c, res.r[0], res.r[2]);
                end_line(loaded, res);
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_sync_latency: %s\n", e.what());
        return 1;
    }
    return 0;
}
