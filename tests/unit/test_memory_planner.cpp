// The tier planner: a pure function of budgets, layer sizes and bandwidths, checked against
// hand-computed plans and, on random inputs, against its invariants (budgets respected, the
// fewest layers streamed, errors naming the minimum).
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "memory/planner.h"

namespace nt::mem {
namespace {

constexpr uint64_t MiB = uint64_t(1) << 20, GiB = uint64_t(1) << 30;

PlanInput uniform(int layers, uint64_t res, uint64_t blob) {
    PlanInput in;
    in.resident_bytes.assign(size_t(layers), res);
    in.blob_bytes.assign(size_t(layers), blob);
    in.vram_avail = 100 * GiB;
    in.vram_backend = 1 * GiB;
    in.vram_fixed_weights = 1 * GiB;
    in.ram_avail = 100 * GiB;
    in.h2d_gbs = 50;
    in.disk_gbs = 2;
    in.hbm_gbs = 4000;
    return in;
}

std::string error_of(const PlanInput& in) {
    try {
        plan_tiers(in);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(MemoryPlanner, EverythingFitsStaysResident) {
    PlanInput in = uniform(10, 500 * MiB, 500 * MiB + 4096);
    in.vram_budget = 2 * GiB + 10 * 500 * MiB;  // exactly enough
    TierPlan p = plan_tiers(in);
    EXPECT_TRUE(p.all_resident());
    EXPECT_EQ(p.layers[0], 10);
    EXPECT_EQ(p.slots, 0);
    EXPECT_EQ(p.h2d_per_step, 0u);
    EXPECT_EQ(p.vram_used, in.vram_budget);
    EXPECT_NEAR(p.roofline_tok_s, 4000e9 / double(GiB + 10 * 500 * MiB), 1e-6);
}

TEST(MemoryPlanner, VramBudgetStreamsTheFewestLayersSpreadEvenly) {
    PlanInput in = uniform(10, 500 * MiB, 512 * MiB);
    // base 2 GiB + 3 slots x 0.5 GiB leaves room for 4 resident layers (and a bit).
    in.vram_budget = 2 * GiB + 3 * 512 * MiB + 4 * 500 * MiB + 100 * MiB;
    TierPlan p = plan_tiers(in);
    EXPECT_EQ(p.slots, 3);
    EXPECT_EQ(p.slot_bytes, 512 * MiB);
    EXPECT_EQ(p.layers[0], 4);
    EXPECT_EQ(p.layers[1], 6);
    EXPECT_EQ(p.layers[2], 0);
    EXPECT_LE(p.vram_used, in.vram_budget);
    // Six of ten streamed, spread: the middles of six equal parts.
    std::vector<int> streamed;
    for (int i = 0; i < 10; i++)
        if (p.tier[size_t(i)] != Tier::Vram) streamed.push_back(i);
    EXPECT_EQ(streamed, (std::vector<int>{0, 2, 4, 5, 7, 9}));
    EXPECT_EQ(p.h2d_per_step, 6 * 512 * MiB);
    EXPECT_EQ(p.disk_per_step, 0u);
    EXPECT_NEAR(p.t_h2d, double(6 * 512 * MiB) / 50e9, 1e-12);
    EXPECT_NEAR(p.roofline_tok_s, 50e9 / double(6 * 512 * MiB), 1e-9);
    EXPECT_EQ(p.staging, 0);
    EXPECT_EQ(p.ram_used, 6 * 512 * MiB);
}

TEST(MemoryPlanner, TightBudgetUsesTwoSlotsAndErrorsNameTheMinimum) {
    PlanInput in = uniform(4, GiB, GiB);
    in.vram_budget = 2 * GiB + 2 * GiB + GiB / 2;  // room for two slots only
    TierPlan p = plan_tiers(in);
    EXPECT_EQ(p.slots, 2);
    EXPECT_EQ(p.layers[0], 0);
    EXPECT_EQ(p.layers[1], 4);

    in.vram_budget = 2 * GiB + 2 * GiB - 1;
    std::string e = error_of(in);
    EXPECT_NE(e.find("needs at least 4.00 GiB"), std::string::npos) << e;
    EXPECT_NE(e.find("two streaming slots"), std::string::npos) << e;

    in.vram_budget = 5 * GiB;
    in.slots = 4;  // asked for explicitly: no silent reduction
    e = error_of(in);
    EXPECT_NE(e.find("4 streaming slots"), std::string::npos) << e;
    EXPECT_NE(e.find("at least 6.00 GiB"), std::string::npos) << e;
}

TEST(MemoryPlanner, RamBudgetSendsLayersToDiskWithStaging) {
    PlanInput in = uniform(12, 256 * MiB, 256 * MiB);
    in.vram_budget = 2 * GiB + 3 * 256 * MiB + 2 * 256 * MiB;  // 2 resident, 10 streamed
    in.ram_budget = 3 * 256 * MiB + 4 * 256 * MiB;            // staging + 4 pinned
    TierPlan p = plan_tiers(in);
    EXPECT_EQ(p.layers[0], 2);
    EXPECT_EQ(p.layers[1], 4);
    EXPECT_EQ(p.layers[2], 6);
    EXPECT_EQ(p.staging, kDefaultStaging);
    EXPECT_EQ(p.staging_bytes, 256 * MiB);
    EXPECT_LE(p.ram_used, in.ram_budget);
    EXPECT_EQ(p.disk_per_step, 6 * 256 * MiB);
    EXPECT_EQ(p.h2d_per_step, 10 * 256 * MiB);
    const double t_disk = double(6 * 256 * MiB) / 2e9;
    EXPECT_NEAR(p.t_disk, t_disk, 1e-12);
    EXPECT_NEAR(p.roofline_tok_s, 1.0 / t_disk, 1e-9);  // disk-bound

    in.ram_budget = 3 * 256 * MiB - 1;
    const std::string e = error_of(in);
    EXPECT_NE(e.find("3 disk staging buffers"), std::string::npos) << e;
    EXPECT_NE(e.find("at least 0.75 GiB"), std::string::npos) << e;
}

TEST(MemoryPlanner, BudgetsBeyondWhatExistsAreErrors) {
    PlanInput in = uniform(4, GiB, GiB);
    in.vram_avail = 8 * GiB;
    in.vram_budget = 9 * GiB;
    EXPECT_NE(error_of(in).find("--vram-budget 9.00 GiB is more than this GPU can give"), std::string::npos);
    in.vram_budget = kAuto;
    in.ram_avail = 2 * GiB;
    in.ram_budget = 3 * GiB;
    in.vram_avail = 4 * GiB + GiB / 2;  // forces streaming so the RAM budget matters
    EXPECT_NE(error_of(in).find("--ram-budget 3.00 GiB is more than"), std::string::npos) << error_of(in);
}

TEST(MemoryPlanner, ForceStreamStreamsAtLeastOneLayer) {
    PlanInput in = uniform(3, MiB, MiB);
    in.force_stream = true;
    TierPlan p = plan_tiers(in);
    EXPECT_EQ(p.layers[1], 1);
    EXPECT_EQ(p.tier[1], Tier::Pinned);
    EXPECT_EQ(p.slots, kDefaultSlots);
}

TEST(MemoryPlanner, SpreadIsDistinctSortedAndEven) {
    for (int count = 1; count <= 100; count++)
        for (int n = 1; n <= count; n++) {
            std::vector<int> s = spread(n, count);
            ASSERT_EQ(int(s.size()), n);
            for (int i = 0; i < n; i++) {
                ASSERT_GE(s[size_t(i)], 0);
                ASSERT_LT(s[size_t(i)], count);
                if (i) {
                    ASSERT_GT(s[size_t(i)], s[size_t(i - 1)]) << n << " of " << count;
                }
                // Element i lies in the i-th of n equal parts.
                ASSERT_GE(int64_t(s[size_t(i)]) * n, int64_t(i) * count - n);
                ASSERT_LT(int64_t(s[size_t(i)]) * n, int64_t(i + 1) * count);
            }
        }
}

TEST(MemoryPlanner, RandomInputsRespectBudgetsAndStreamTheFewest) {
    std::mt19937 rng(3);
    for (int iter = 0; iter < 2000; iter++) {
        const int L = 1 + int(rng() % 40);
        PlanInput in;
        for (int i = 0; i < L; i++) {
            const uint64_t r = MiB * (1 + rng() % 300);
            in.resident_bytes.push_back(r);
            in.blob_bytes.push_back((r + 4095) / 4096 * 4096 + 4096 * (rng() % 3));
        }
        in.vram_backend = MiB * (rng() % 500);
        in.vram_fixed_weights = MiB * (rng() % 500);
        in.vram_avail = 64 * GiB;
        in.vram_budget = MiB * (rng() % 8000);
        in.ram_avail = 64 * GiB;
        in.ram_budget = MiB * (rng() % 8000);
        in.h2d_gbs = 10;
        TierPlan p;
        try {
            p = plan_tiers(in);
        } catch (const Error& e) {
            // Errors only when even the minimum does not fit; they name "at least".
            EXPECT_NE(std::string(e.what()).find("at least"), std::string::npos) << e.what();
            continue;
        }
        ASSERT_EQ(p.tier.size(), size_t(L));
        EXPECT_LE(p.vram_used, p.vram_budget);
        EXPECT_LE(p.ram_used, p.ram_budget);
        EXPECT_EQ(p.layers[0] + p.layers[1] + p.layers[2], L);
        uint64_t res = 0, streamed = 0, disk = 0;
        for (int i = 0; i < L; i++) {
            if (p.tier[size_t(i)] == Tier::Vram) res += in.resident_bytes[size_t(i)];
            else streamed += in.blob_bytes[size_t(i)];
            if (p.tier[size_t(i)] == Tier::Disk) disk += in.blob_bytes[size_t(i)];
        }
        EXPECT_EQ(p.bytes[0], res);
        EXPECT_EQ(p.h2d_per_step, streamed);
        EXPECT_EQ(p.disk_per_step, disk);
        if (p.streams()) {
            // One more streamed layer than needed would be waste: with one fewer (the spread of
            // n - 1), the resident set must not fit.
            const int n = p.layers[1] + p.layers[2];
            if (n > 1) {
                std::vector<int> fewer = spread(n - 1, L);
                std::vector<bool> s(size_t(L), false);
                for (int i : fewer) s[size_t(i)] = true;
                uint64_t r2 = 0;
                for (int i = 0; i < L; i++)
                    if (!s[size_t(i)]) r2 += in.resident_bytes[size_t(i)];
                EXPECT_GT(in.vram_backend + in.vram_fixed_weights + uint64_t(p.slots) * p.slot_bytes + r2,
                          p.vram_budget);
            }
        }
    }
}

TEST(MemoryPlanner, DescriptionShowsTiersStepBytesAndRoofline) {
    PlanInput in = uniform(8, 256 * MiB, 256 * MiB);
    in.vram_budget = 2 * GiB + 3 * 256 * MiB + 2 * 256 * MiB;  // 2 resident, 6 streamed
    in.ram_budget = 3 * 256 * MiB + 2 * 256 * MiB;             // staging + 2 pinned
    TierPlan p = plan_tiers(in);
    const std::string s = describe_plan(p, in);
    EXPECT_NE(s.find("VRAM      2 layers"), std::string::npos) << s;
    EXPECT_NE(s.find("pinned    2 layers"), std::string::npos) << s;
    EXPECT_NE(s.find("disk      4 layers"), std::string::npos) << s;
    EXPECT_NE(s.find("3 staging buffers x 0.25 GiB"), std::string::npos) << s;
    EXPECT_NE(s.find("layers  "), std::string::npos) << s;
    EXPECT_NE(s.find("roofline:"), std::string::npos) << s;
    EXPECT_NE(s.find("disk-bound"), std::string::npos) << s;
    EXPECT_NE(s.find("3 slots x 0.25 GiB"), std::string::npos) << s;
}

}  // namespace
}  // namespace nt::mem

namespace nt::mem {
namespace {

TEST(MemoryPlanner, FixedTiersDeriveSlotsStagingAndStepBytes) {
    PlanInput in = uniform(4, 100 * MiB, 128 * MiB);
    in.blob_bytes[2] = 130 * MiB;
    TierPlan p = plan_fixed(in, {Tier::Vram, Tier::Pinned, Tier::Disk, Tier::Vram});
    EXPECT_EQ(p.layers[0], 2);
    EXPECT_EQ(p.layers[1], 1);
    EXPECT_EQ(p.layers[2], 1);
    EXPECT_EQ(p.slots, kDefaultSlots);
    EXPECT_EQ(p.slot_bytes, 130 * MiB);
    EXPECT_EQ(p.staging, kDefaultStaging);
    EXPECT_EQ(p.h2d_per_step, 258 * MiB);
    EXPECT_EQ(p.disk_per_step, 130 * MiB);
    EXPECT_EQ(p.vram_used, 2 * GiB + 200 * MiB + 3 * 130 * MiB);
    EXPECT_TRUE(plan_fixed(in, {Tier::Vram, Tier::Vram, Tier::Vram, Tier::Vram}).all_resident());
    EXPECT_EQ(plan_fixed(in, {Tier::Vram, Tier::Vram, Tier::Vram, Tier::Vram}).slots, 0);
}

}  // namespace
}  // namespace nt::mem
