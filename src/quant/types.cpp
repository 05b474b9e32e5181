#include "quant/types.h"

namespace nt {

const TypeTraits* type_traits(uint32_t id) {
    static const TypeTraits f32{"f32", 1, 4, true};
    static const TypeTraits f16{"f16", 1, 2, true};
    static const TypeTraits bf16{"bf16", 1, 2, true};
    static const TypeTraits q4_0{"q4_0", QK4_0, sizeof(block_q4_0), true};
    static const TypeTraits q4_1{"q4_1", QK4_1, sizeof(block_q4_1), true};
    static const TypeTraits q5_0{"q5_0", QK5_0, sizeof(block_q5_0), true};
    static const TypeTraits q5_1{"q5_1", QK5_1, sizeof(block_q5_1), true};
    static const TypeTraits q8_0{"q8_0", QK8_0, sizeof(block_q8_0), true};
    static const TypeTraits q8_1{"q8_1", QK8_1, sizeof(block_q8_1), false};
    static const TypeTraits q2_k{"q2_K", QK_K, sizeof(block_q2_K), true};
    static const TypeTraits q3_k{"q3_K", QK_K, sizeof(block_q3_K), true};
    static const TypeTraits q4_k{"q4_K", QK_K, sizeof(block_q4_K), true};
    static const TypeTraits q5_k{"q5_K", QK_K, sizeof(block_q5_K), true};
    static const TypeTraits q6_k{"q6_K", QK_K, sizeof(block_q6_K), true};
    static const TypeTraits q8_k{"q8_K", QK_K, sizeof(block_q8_K), false};
    switch (GgmlType(id)) {
        case GgmlType::F32: return &f32;
        case GgmlType::F16: return &f16;
        case GgmlType::BF16: return &bf16;
        case GgmlType::Q4_0: return &q4_0;
        case GgmlType::Q4_1: return &q4_1;
        case GgmlType::Q5_0: return &q5_0;
        case GgmlType::Q5_1: return &q5_1;
        case GgmlType::Q8_0: return &q8_0;
        case GgmlType::Q8_1: return &q8_1;
        case GgmlType::Q2_K: return &q2_k;
        case GgmlType::Q3_K: return &q3_k;
        case GgmlType::Q4_K: return &q4_k;
        case GgmlType::Q5_K: return &q5_k;
        case GgmlType::Q6_K: return &q6_k;
        case GgmlType::Q8_K: return &q8_k;
    }
    return nullptr;
}

const char* type_name(GgmlType t) {
    const TypeTraits* tr = type_traits(uint32_t(t));
    return tr ? tr->name : "unknown";
}

}  // namespace nt
