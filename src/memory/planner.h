// The tier planner: given budgets, layer sizes and measured bandwidths, decides where each
// layer lives (VRAM, pinned RAM or disk) and what one step will cost. A pure function, so every
// budget corner is tested on the CPU; the engine feeds it what the device reports.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace nt::mem {

enum class Tier : uint8_t { Vram = 0, Pinned = 1, Disk = 2 };
const char* tier_name(Tier t);

constexpr uint64_t kAuto = std::numeric_limits<uint64_t>::max();  // budget: size it from what is free
constexpr int kDefaultSlots = 3;    // VRAM ring: one computing, two arriving
constexpr int kDefaultStaging = 3;  // pinned staging buffers the disk reader fills ahead

struct PlanInput {
    // Per layer: device bytes when resident (tensor footprints) and the streamed blob's size.
    std::vector<uint64_t> resident_bytes;
    std::vector<uint64_t> blob_bytes;

    uint64_t vram_budget = kAuto;     // everything the engine may hold on the GPU
    uint64_t vram_avail = 0;          // the most it can hold: already allocated + free - headroom
    uint64_t vram_backend = 0;        // KV cache, activations and scratch (already allocated)
    uint64_t vram_fixed_weights = 0;  // embeddings, output norm and matrix: always resident
    uint64_t ram_budget = kAuto;      // pinned host memory for streamed layers and staging
    uint64_t ram_avail = 0;           // MemAvailable minus a margin
    int slots = 0;                    // VRAM ring slots (0: default, fewer if the budget is tight)
    int staging = 0;                  // disk staging buffers (0: default)
    bool force_stream = false;        // stream even when everything fits (tests, measurements)

    // Measured ceilings in GB/s for the roofline; 0 when unknown (the term is left out).
    double h2d_gbs = 0, disk_gbs = 0, hbm_gbs = 0;
};

struct TierPlan {
    std::vector<Tier> tier;  // per layer
    int layers[3] = {0, 0, 0};
    uint64_t bytes[3] = {0, 0, 0};  // VRAM: resident footprints; pinned and disk: blob bytes
    int slots = 0, staging = 0;
    uint64_t slot_bytes = 0, staging_bytes = 0;  // per slot / buffer
    uint64_t vram_budget = 0, ram_budget = 0;
    uint64_t vram_used = 0, ram_used = 0;
    std::string disk_path;  // how disk-tier layers are read (set by the streamer), for the printout

    // One step (any batch size): bytes per link and the lower bound they set.
    uint64_t h2d_per_step = 0, disk_per_step = 0, hbm_per_step = 0;
    double t_h2d = 0, t_disk = 0, t_hbm = 0;  // seconds; 0 when the bandwidth is unknown
    double roofline_tok_s = 0;                // batch-1 decode: 1 / max(t_*)

    bool all_resident() const { return layers[1] + layers[2] == 0; }
    bool streams() const { return !all_resident(); }
};

// Throws nt::Error with one sentence naming the budget and the minimum it needs when a budget
// cannot hold the working set.
TierPlan plan_tiers(const PlanInput& in);

// A plan with the tiers given (tests, experiments): slots, staging and the per-step figures as
// plan_tiers would derive them, without budget checks.
TierPlan plan_fixed(const PlanInput& in, const std::vector<Tier>& tiers);

// The plan for people: layers and bytes per tier, bytes per step and the roofline.
std::string describe_plan(const TierPlan& p, const PlanInput& in);

// "24.00 GiB"
std::string format_gib(uint64_t bytes);
// "12.3 MiB" below a GiB, else format_gib's "24.00 GiB"
std::string format_size(uint64_t bytes);

// Indices of `n` of `count` positions spread evenly (n <= count), in increasing order.
std::vector<int> spread(int n, int count);

}  // namespace nt::mem
