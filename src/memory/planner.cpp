#include "memory/planner.h"

#include <algorithm>

#include "core/error.h"

namespace nt::mem {

const char* tier_name(Tier t) {
    switch (t) {
        case Tier::Vram: return "VRAM";
        case Tier::Pinned: return "pinned RAM";
        case Tier::Disk: return "disk";
    }
    return "?";
}

std::string format_gib(uint64_t bytes) {
    return strfmt("%.2f GiB", double(bytes) / double(uint64_t(1) << 30));
}

std::string format_size(uint64_t bytes) {
    if (bytes >= uint64_t(1) << 30) return format_gib(bytes);
    return strfmt("%.1f MiB", double(bytes) / double(1 << 20));
}

std::vector<int> spread(int n, int count) {
    std::vector<int> out;
    if (n <= 0 || count <= 0) return out;
    n = std::min(n, count);
    // The middle of each of n equal parts: distinct because the parts are at least one wide.
    for (int k = 0; k < n; k++) out.push_back(int((int64_t(2 * k + 1) * count) / (2 * int64_t(n))));
    return out;
}

namespace {

// Layers and bytes per tier, memory used and the roofline, from the tiers chosen.
void finish(TierPlan& p, const PlanInput& in) {
    const int L = int(p.tier.size());
    for (int i = 0; i < L; i++) {
        const int t = int(p.tier[size_t(i)]);
        p.layers[t]++;
        p.bytes[t] += t == 0 ? in.resident_bytes[size_t(i)] : in.blob_bytes[size_t(i)];
    }
    p.vram_used = in.vram_backend + in.vram_fixed_weights + p.bytes[0] + uint64_t(p.slots) * p.slot_bytes;
    p.ram_used = p.bytes[1] + uint64_t(p.staging) * p.staging_bytes;
    p.h2d_per_step = p.bytes[1] + p.bytes[2];
    p.disk_per_step = p.bytes[2];
    p.hbm_per_step = in.vram_fixed_weights + p.bytes[0] + p.h2d_per_step;
    p.t_h2d = in.h2d_gbs > 0 ? double(p.h2d_per_step) / (in.h2d_gbs * 1e9) : 0;
    p.t_disk = in.disk_gbs > 0 ? double(p.disk_per_step) / (in.disk_gbs * 1e9) : 0;
    p.t_hbm = in.hbm_gbs > 0 ? double(p.hbm_per_step) / (in.hbm_gbs * 1e9) : 0;
    const double t = std::max({p.t_h2d, p.t_disk, p.t_hbm});
    p.roofline_tok_s = t > 0 ? 1.0 / t : 0;
}

uint64_t sum(const std::vector<uint64_t>& v) {
    uint64_t s = 0;
    for (uint64_t x : v) s += x;
    return s;
}

}  // namespace

TierPlan plan_tiers(const PlanInput& in) {
    const int L = int(in.resident_bytes.size());
    if (L == 0 || in.blob_bytes.size() != in.resident_bytes.size())
        fail("memory planner: %d layers with %zu blob sizes.", L, in.blob_bytes.size());
    TierPlan p;
    p.tier.assign(size_t(L), Tier::Vram);

    // ---- VRAM
    if (in.vram_budget != kAuto && in.vram_budget > in.vram_avail)
        fail("--vram-budget %s is more than this GPU can give (%s, counting what the engine already "
             "holds); lower it.",
             format_gib(in.vram_budget).c_str(), format_gib(in.vram_avail).c_str());
    p.vram_budget = in.vram_budget == kAuto ? in.vram_avail : in.vram_budget;
    const uint64_t base = in.vram_backend + in.vram_fixed_weights;
    const uint64_t all_layers = sum(in.resident_bytes);
    if (!in.force_stream && base + all_layers <= p.vram_budget) {
        p.layers[0] = L;
        p.bytes[0] = all_layers;
        p.vram_used = base + all_layers;
        p.ram_budget = in.ram_budget == kAuto ? in.ram_avail : in.ram_budget;
        p.hbm_per_step = in.vram_fixed_weights + all_layers;
        p.t_hbm = in.hbm_gbs > 0 ? double(p.hbm_per_step) / (in.hbm_gbs * 1e9) : 0;
        p.roofline_tok_s = p.t_hbm > 0 ? 1.0 / p.t_hbm : 0;
        return p;
    }
    p.slot_bytes = *std::max_element(in.blob_bytes.begin(), in.blob_bytes.end());
    const std::string what = strfmt("the KV cache and scratch (%s) and the embeddings and output (%s)",
                                    format_gib(in.vram_backend).c_str(),
                                    format_gib(in.vram_fixed_weights).c_str());
    if (in.slots < 0) fail("--slots must be at least 1.");
    if (in.slots > 0) {
        p.slots = in.slots;
        const uint64_t need = base + uint64_t(p.slots) * p.slot_bytes;
        if (need > p.vram_budget)
            fail("the VRAM budget of %s cannot hold %s plus %d streaming slots of %s; it needs at "
                 "least %s (raise --vram-budget, lower --slots, or shorten the context with -c).",
                 format_gib(p.vram_budget).c_str(), what.c_str(), p.slots,
                 format_gib(p.slot_bytes).c_str(), format_gib(need).c_str());
    } else {
        p.slots = kDefaultSlots;
        while (p.slots > 2 && base + uint64_t(p.slots) * p.slot_bytes > p.vram_budget) p.slots--;
        const uint64_t need = base + 2 * p.slot_bytes;
        if (need > p.vram_budget)
            fail("the VRAM budget of %s cannot hold %s plus two streaming slots of %s; it needs at "
                 "least %s (raise --vram-budget or shorten the context with -c).",
                 format_gib(p.vram_budget).c_str(), what.c_str(), format_gib(p.slot_bytes).c_str(),
                 format_gib(need).c_str());
    }
    const uint64_t room = p.vram_budget - base - uint64_t(p.slots) * p.slot_bytes;
    // The fewest streamed layers that leave the rest within the room, spread evenly through the
    // model: each streamed layer's copy then overlaps the compute of resident layers before it
    // (prefill), and at batch 1 the order does not matter.
    std::vector<int> streamed;
    for (int n = 1; n <= L; n++) {
        streamed = spread(n, L);
        std::vector<bool> is_s(size_t(L), false);
        for (int i : streamed) is_s[size_t(i)] = true;
        uint64_t res = 0;
        for (int i = 0; i < L; i++)
            if (!is_s[size_t(i)]) res += in.resident_bytes[size_t(i)];
        if (res <= room) break;
    }
    for (int i : streamed) p.tier[size_t(i)] = Tier::Pinned;

    // ---- pinned RAM, then disk
    if (in.ram_budget != kAuto && in.ram_budget > in.ram_avail)
        fail("--ram-budget %s is more than the %s of memory available; lower it.",
             format_gib(in.ram_budget).c_str(), format_gib(in.ram_avail).c_str());
    p.ram_budget = in.ram_budget == kAuto ? in.ram_avail : in.ram_budget;
    uint64_t streamed_bytes = 0;
    for (int i : streamed) streamed_bytes += in.blob_bytes[size_t(i)];
    if (streamed_bytes > p.ram_budget) {
        if (in.staging < 0) fail("--prefetch must be at least 1.");
        p.staging = in.staging > 0 ? in.staging : kDefaultStaging;
        p.staging_bytes = p.slot_bytes;
        const uint64_t need = uint64_t(p.staging) * p.staging_bytes;
        if (need > p.ram_budget)
            fail("the RAM budget of %s cannot hold %d disk staging buffers of %s; it needs at least "
                 "%s (raise --ram-budget or lower --prefetch).",
                 format_gib(p.ram_budget).c_str(), p.staging, format_gib(p.staging_bytes).c_str(),
                 format_gib(need).c_str());
        const uint64_t cap = p.ram_budget - need;
        const int N = int(streamed.size());
        for (int d = 1; d <= N; d++) {
            std::vector<int> disk = spread(d, N);
            std::vector<bool> on_disk(size_t(N), false);
            for (int k : disk) on_disk[size_t(k)] = true;
            uint64_t pinned = 0;
            for (int k = 0; k < N; k++)
                if (!on_disk[size_t(k)]) pinned += in.blob_bytes[size_t(streamed[size_t(k)])];
            if (pinned <= cap) {
                for (int k : disk) p.tier[size_t(streamed[size_t(k)])] = Tier::Disk;
                break;
            }
        }
    }

    finish(p, in);
    return p;
}

TierPlan plan_fixed(const PlanInput& in, const std::vector<Tier>& tiers) {
    if (tiers.size() != in.resident_bytes.size() || tiers.size() != in.blob_bytes.size())
        fail("memory planner: %zu forced tiers for %zu layers.", tiers.size(), in.resident_bytes.size());
    TierPlan p;
    p.tier = tiers;
    p.vram_budget = in.vram_budget == kAuto ? in.vram_avail : in.vram_budget;
    p.ram_budget = in.ram_budget == kAuto ? in.ram_avail : in.ram_budget;
    bool streams = false, disk = false;
    for (size_t i = 0; i < tiers.size(); i++) {
        if (tiers[i] != Tier::Vram) {
            streams = true;
            p.slot_bytes = std::max(p.slot_bytes, in.blob_bytes[i]);
        }
        disk = disk || tiers[i] == Tier::Disk;
    }
    if (streams) p.slots = in.slots > 0 ? in.slots : kDefaultSlots;
    if (disk) {
        p.staging = in.staging > 0 ? in.staging : kDefaultStaging;
        p.staging_bytes = p.slot_bytes;
    }
    finish(p, in);
    return p;
}

std::string describe_plan(const TierPlan& p, const PlanInput& in) {
    std::string s = strfmt("memory plan: %zu layers; VRAM budget %s, RAM budget %s\n", p.tier.size(),
                           format_gib(p.vram_budget).c_str(), format_gib(p.ram_budget).c_str());
    s += strfmt("  VRAM    %3d layers %10s  + KV cache and scratch %s, embeddings and output %s",
                p.layers[0], format_gib(p.bytes[0]).c_str(), format_gib(in.vram_backend).c_str(),
                format_gib(in.vram_fixed_weights).c_str());
    if (p.slots) s += strfmt(", %d slots x %s", p.slots, format_gib(p.slot_bytes).c_str());
    s += strfmt(" = %s\n", format_gib(p.vram_used).c_str());
    s += strfmt("  pinned  %3d layers %10s", p.layers[1], format_gib(p.bytes[1]).c_str());
    if (p.staging) s += strfmt("  + %d staging buffers x %s", p.staging, format_gib(p.staging_bytes).c_str());
    s += "\n";
    s += strfmt("  disk    %3d layers %10s", p.layers[2], format_gib(p.bytes[2]).c_str());
    if (p.layers[2] && !p.disk_path.empty()) s += "  read by " + p.disk_path;
    s += "\n";
    if (p.streams()) {
        std::string map;
        for (Tier t : p.tier) map += t == Tier::Vram ? 'V' : t == Tier::Pinned ? 'P' : 'D';
        s += "  layers  " + map + "  (V VRAM, P pinned RAM, D disk)\n";
    }
    s += strfmt("  per step: %s over PCIe", format_gib(p.h2d_per_step).c_str());
    if (p.t_h2d > 0) s += strfmt(" (%.3f s at %.1f GB/s)", p.t_h2d, in.h2d_gbs);
    s += strfmt(", %s from disk", format_gib(p.disk_per_step).c_str());
    if (p.t_disk > 0) s += strfmt(" (%.3f s at %.2f GB/s)", p.t_disk, in.disk_gbs);
    s += strfmt(", %s from HBM", format_gib(p.hbm_per_step).c_str());
    if (p.t_hbm > 0) s += strfmt(" (%.4f s at %.0f GB/s)", p.t_hbm, in.hbm_gbs);
    if (p.roofline_tok_s > 0) {
        const char* bound = p.t_disk >= p.t_h2d && p.t_disk >= p.t_hbm ? "disk"
                            : p.t_h2d >= p.t_hbm                        ? "PCIe"
                                                                        : "HBM";
        s += strfmt("\n  roofline: %.2f tok/s at batch 1 (%s-bound); a batch of B tokens moves the "
                    "same bytes",
                    p.roofline_tok_s, bound);
    }
    s += "\n";
    return s;
}

}  // namespace nt::mem
