// Helpers shared by the quantization tests (test_quant.cpp, test_batch_invariance.cpp): every
// weight type the engine multiplies, and every SIMD level this CPU can run.
#pragma once
#include <vector>

#include "quant/kernels.h"
#include "quant/types.h"

namespace nt::testing_quant {

inline constexpr GgmlType kWeightTypes[] = {
    GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
    GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
    GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// Scalar up to the best level the CPU has.
inline std::vector<quant_detail::SimdLevel> simd_levels() {
    std::vector<quant_detail::SimdLevel> v;
    for (int l = 0; l <= int(quant_detail::cpu_level()); ++l)
        v.push_back(quant_detail::SimdLevel(l));
    return v;
}

}  // namespace nt::testing_quant
