// Chooses the SIMD level once per process (CPU features, capped by NT_SIMD) and routes
// vec_dot / vec_dot_tile to that level's kernels. Built without ISA flags: it only asks the CPU.
#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "quant/kernels.h"
#include "quant/quant.h"

namespace nt {
namespace quant_detail {
namespace {

bool has_f16c() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & bit_F16C) != 0;
}

SimdLevel detect() {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("bmi2") && has_f16c();
    if (!avx2) return SimdLevel::Scalar;
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vnni");
    return avx512 ? SimdLevel::Avx512 : SimdLevel::Avx2;
}

const KernelTable& table(SimdLevel level) {
    switch (level) {
        case SimdLevel::Avx512:
            return avx512_kernels();
        case SimdLevel::Avx2:
            return avx2_kernels();
        case SimdLevel::Scalar:
            break;
    }
    return scalar_kernels();
}

}  // namespace

namespace {

// The process's level: NT_SIMD's on first use (a bad value throws, and the next call asks
// again), then whatever set_active_level() says.
std::atomic<int>& level_slot() {
    static std::atomic<int> level{int(level_from_env(std::getenv("NT_SIMD")))};
    return level;
}

}  // namespace

SimdLevel active_level() {
    return SimdLevel(level_slot().load(std::memory_order_relaxed));
}

SimdLevel set_active_level(SimdLevel level) {
    if (int(level) > int(cpu_level())) level = cpu_level();
    return SimdLevel(level_slot().exchange(int(level)));
}

SimdLevel cpu_level() {
    static const SimdLevel level = detect();
    return level;
}

SimdLevel level_from_env(const char* value) {
    const SimdLevel best = cpu_level();
    if (value == nullptr || value[0] == '\0') return best;
    SimdLevel want;
    if (std::strcmp(value, "scalar") == 0) {
        want = SimdLevel::Scalar;
    } else if (std::strcmp(value, "avx2") == 0) {
        want = SimdLevel::Avx2;
    } else if (std::strcmp(value, "avx512") == 0) {
        want = SimdLevel::Avx512;
    } else {
        fail("NT_SIMD=%s is not a SIMD level: use scalar, avx2 or avx512 (or unset it).", value);
    }
    return int(want) < int(best) ? want : best;
}

const char* level_name(SimdLevel level) {
    switch (level) {
        case SimdLevel::Avx512:
            return "avx512";
        case SimdLevel::Avx2:
            return "avx2";
        case SimdLevel::Scalar:
            break;
    }
    return "scalar";
}

TileFn tile_kernel(SimdLevel level, GgmlType t) {
    const uint32_t id = uint32_t(t);
    if (id >= uint32_t(kMaxTypeId)) return nullptr;
    for (int l = int(level); l >= 0; --l) {
        if (TileFn f = table(SimdLevel(l)).tile[id]) return f;
    }
    return nullptr;
}

QuantizeFn quantize_kernel(SimdLevel level, GgmlType t) {
    const uint32_t id = uint32_t(t);
    if (id >= uint32_t(kMaxTypeId)) return nullptr;
    for (int l = int(level); l >= 0; --l) {
        if (QuantizeFn f = table(SimdLevel(l)).quantize[id]) return f;
    }
    return nullptr;
}

}  // namespace quant_detail

using namespace quant_detail;

const char* simd_level() {
    return level_name(active_level());
}

namespace {

TileFn checked_kernel(GgmlType t, int64_t n) {
    TileFn f = tile_kernel(active_level(), t);
    if (!f) fail("tensor type %s has no dot product kernel.", type_name(t));
    const int be = traits(t).block_elems;
    if (n % be != 0)
        fail("dot product of %lld elements of type %s: not a multiple of its block size %d.",
             (long long)n, type_name(t), be);
    return f;
}

}  // namespace

float vec_dot(GgmlType t, int64_t n, const void* w_row, const void* act_row) {
    float out = 0.0f;
    checked_kernel(t, n)(n, 1, 1, w_row, 0, act_row, 0, &out, 1);
    return out;
}

void vec_dot_tile(GgmlType t, int64_t n, int nrows, int ncols, const void* w, size_t w_stride,
                  const void* a, size_t a_stride, float* out, size_t out_stride) {
    if (nrows <= 0 || ncols <= 0) return;
    checked_kernel(t, n)(n, nrows, ncols, w, w_stride, a, a_stride, out, out_stride);
}

}  // namespace nt
