// The TMA GEMV's A/B settings by weight type and pair (TmaSetting, matmul_gemv_tma.cuh): which
// environment variable wins for which launch. Host code only, so it runs without a GPU too.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/cuda/matmul_gemv_tma.cuh"

namespace {

using nt::GgmlType;
using nt::cuda::detail::TmaRingOf;
using nt::cuda::detail::TmaSetting;

long long fallback(GgmlType t, bool pair) {
    return (t == GgmlType::Q4_K ? 100 : 200) + pair;
}

TEST(TmaSettingHost, FallbackByTypeAndPairWhenUnset) {
    const TmaSetting s("TEST_UNSET_KNOB", fallback);
    EXPECT_EQ(s(GgmlType::Q4_K, false), 100);
    EXPECT_EQ(s(GgmlType::Q4_K, true), 101);
    EXPECT_EQ(s(GgmlType::Q6_K, true), 201);
    EXPECT_EQ(s(GgmlType::F16, false), 200);
}

TEST(TmaSettingHost, MostSpecificVariableWins) {
    setenv("NT_TEST_KNOB", "5", 1);
    setenv("NT_TEST_KNOB_PAIR", "6", 1);
    setenv("NT_TEST_KNOB_Q6_K", "7", 1);
    setenv("NT_TEST_KNOB_PAIR_Q8_0", "8", 1);
    const TmaSetting s("TEST_KNOB", fallback);
    for (const char* v :
         {"NT_TEST_KNOB", "NT_TEST_KNOB_PAIR", "NT_TEST_KNOB_Q6_K", "NT_TEST_KNOB_PAIR_Q8_0"})
        unsetenv(v);
    // Every launch: NT_TEST_KNOB; pairs: NT_TEST_KNOB_PAIR over it.
    EXPECT_EQ(s(GgmlType::Q4_K, false), 5);
    EXPECT_EQ(s(GgmlType::Q4_K, true), 6);
    EXPECT_EQ(s(GgmlType::F16, false), 5);
    EXPECT_EQ(s(GgmlType::F16, true), 6);
    // A type's own variable over both, for its pairs too.
    EXPECT_EQ(s(GgmlType::Q6_K, false), 7);
    EXPECT_EQ(s(GgmlType::Q6_K, true), 7);
    // A type's pairs' variable for its pairs only.
    EXPECT_EQ(s(GgmlType::Q8_0, false), 5);
    EXPECT_EQ(s(GgmlType::Q8_0, true), 8);
    // Read once: the environment after construction does not change it.
    setenv("NT_TEST_KNOB", "9", 1);
    EXPECT_EQ(s(GgmlType::Q4_K, false), 5);
    unsetenv("NT_TEST_KNOB");
}

// Column slices of one or two rows a stage read their own setting, which by default is the
// type's ring for single matrices (70B's two-unit Q4_K slices, Q6_K's and Q8_0's slices).
TEST(TmaSettingHost, SlicesRingIsTheTypesRingByDefault) {
    using nt::cuda::detail::tma_ring_bytes;
    for (const GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_K})
        EXPECT_EQ(tma_ring_bytes(t, false, TmaRingOf::Slices), tma_ring_bytes(t, false)) << int(t);
}

}  // namespace
