// Marks inside the decode step's kernels, for seeing where a layer's time goes in place: when
// each CTA starts, when its programmatic wait returns, when its first weights (or its first K/V
// tile) are in shared memory, and when it is done, all on the GPU's global nanosecond clock.
// CUPTI's timeline (bench/cuda/kernel_trace.cpp) sees only a launch's first start and last end;
// with programmatic launches a kernel starts long before its wait returns, so the handoff from
// one kernel to the next (the primary's last CTA done, then the dependents' waits returning) is
// out of its sight.
//
// Off unless the build asks for it (cmake -DNT_PHASE_TRACE=ON: a build for measuring, not for
// shipping): NT_PHASE_* then compile to nothing. With it, each marking thread reserves its
// records (one atomic on its multiprocessor's counter) where that costs the kernel nothing, before
// its wait, and stores each mark as it passes; bench writes the records at exit to the file
// NT_PHASE_OUT names, and bench/cuda/phase_timeline.py reads them.
#pragma once

#include <cstdint>

#ifdef NT_PHASE_TRACE
#include <cuda_runtime.h>
#endif

namespace nt::cuda::phase {

// The marks of a kernel (Record::mark).
// kStep1..kStep4: points inside a kernel's work after its wait, the kernel's own (the decode
// attention: its first tile scored, weighted by the softmax, summed (P*V), its output written;
// the fused add + norm: its sum of squares reduced).
enum Mark : uint8_t {
    kEntry = 0,
    kWaited = 1,
    kFirstData = 2,
    kDone = 3,
    kStep1 = 4,
    kStep2 = 5,
    kStep3 = 6,
    kStep4 = 7,
    kMarks = 8
};
// What ran (Record::kind's low 4 bits; the high 4 bits carry the weights' quant type where there
// are weights, 0 otherwise).
enum Kind : uint8_t { kGemv = 1, kGemvPair = 2, kGemvSplit = 3, kAttention = 4, kNorm = 5 };

struct Record {
    unsigned long long time;  // %globaltimer, ns; 0: a slot never written
    uint32_t tag;             // the launch: its weights' (or cache's) address / 256
    uint16_t sm;
    uint8_t kind;
    uint8_t mark;
};
static_assert(sizeof(Record) == 16);

#ifdef NT_PHASE_TRACE
constexpr int kSms = 144;        // multiprocessors a buffer has room for
constexpr int kPerSm = 1 << 15;  // records a multiprocessor keeps (a ring: the newest)
// Every translation unit that marks keeps its own counters and buffer pointer (device variables
// without separate compilation are a unit's own), and registers a binder that points it at its
// share of one device buffer (init, from the CUDA backend's constructor).
void register_unit(void (*bind)(Record* base));
void init();                  // allocates and binds, once
void dump(const char* path);  // every unit's records, raw, to path

namespace {
__device__ Record* g_records;
__device__ unsigned g_count[kSms];
void bind_unit(Record* base) {
    cudaMemcpyToSymbol(g_records, &base, sizeof base);
}
[[maybe_unused]] const bool g_registered = (register_unit(bind_unit), true);

__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// A marking thread's records: `n` consecutive slots on its multiprocessor's ring, filled in
// the order its marks come.
struct Slots {
    Record* at = nullptr;
    uint32_t tag = 0;
    uint16_t sm = 0;
    uint8_t kind = 0;
    uint8_t used = 0, n = 0;
    __device__ void reserve(int k, const void* launch, int records) {
        if (!g_records) return;  // never bound (a program that did not call init): no marks
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        sm = uint16_t(s);
        kind = uint8_t(k);
        tag = uint32_t(reinterpret_cast<uintptr_t>(launch) >> 8);
        n = uint8_t(records);
        const unsigned ring = s % kSms;
        const unsigned i = atomicAdd(&g_count[ring], unsigned(n)) % (kPerSm - kMarks);
        at = g_records + size_t(ring) * kPerSm + i;
    }
    __device__ void mark(int m, unsigned long long t) {
        if (used < n) at[used++] = Record{t, tag, sm, kind, uint8_t(m)};
    }
};
}  // namespace
#endif

}  // namespace nt::cuda::phase

// NT_PHASE_SLOTS(name): a thread's slots (declared either way, so that call sites need no
// #ifdef); NT_PHASE_RESERVE(name, kind, launch tag pointer, records); NT_PHASE_MARK(name, mark),
// stored at once; NT_PHASE_TIME(var) / NT_PHASE_MARK_AT(name, mark, var): a time taken now and
// stored later (the entry mark, taken before anything else and stored once the slots exist).
#ifdef NT_PHASE_TRACE
#define NT_PHASE_SLOTS(s) ::nt::cuda::phase::Slots s
#define NT_PHASE_RESERVE(s, kind, tag, n) (s).reserve((kind), (tag), (n))
#define NT_PHASE_MARK(s, m) (s).mark((m), ::nt::cuda::phase::now())
#define NT_PHASE_TIME(v) const unsigned long long v = ::nt::cuda::phase::now()
#define NT_PHASE_MARK_AT(s, m, v) (s).mark((m), (v))
#else
#define NT_PHASE_SLOTS(s) [[maybe_unused]] int s = 0
#define NT_PHASE_RESERVE(s, kind, tag, n) ((void)0)
#define NT_PHASE_MARK(s, m) ((void)0)
#define NT_PHASE_TIME(v) ((void)0)
#define NT_PHASE_MARK_AT(s, m, v) ((void)0)
#endif
