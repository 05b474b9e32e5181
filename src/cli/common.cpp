#include "cli/common.h"

#include <algorithm>
#include <cstdio>

#include "backend/select/select.h"
#include "core/error.h"
#include "memory/streamer.h"
#ifdef NT_HAVE_CUDA
#include "backend/cuda/stream_device.h"
#endif

namespace nt::cli {

std::string require_model_path(const Args& a) {
    if (!a.has("--model")) fail("no model given; pass one with -m FILE (e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf).");
    return a.str("--model");
}

Loaded load_model(const Args& a, int n_seq, int n_ctx) {
    Loaded l;
    l.model = Model::load(require_model_path(a));
    EngineOptions opt;
    opt.n_ctx = n_ctx >= 0 ? n_ctx : a.integer("--ctx-size", 0);
    if (opt.n_ctx < 0) fail("--ctx-size must be 0 or more.");
    opt.max_batch = a.integer("--batch-size", 512);
    if (opt.max_batch < 1) fail("--batch-size must be at least 1.");
    opt.n_seq = n_seq;
    const int threads = a.integer("--threads", 0);
    if (threads < 0) fail("--threads must be 0 or more.");
    opt.memory = memory_options(a);
#ifdef NT_HAVE_CUDA
    opt.stream_device = make_cuda_stream_device;
#endif
    l.engine = std::make_unique<Engine>(
        *l.model, make_backend(a.str("--device", "auto"), threads, a.has("--exact")), opt);
    const MemoryReport& m = l.engine->memory();
    const bool asked = a.has("--vram-budget") || a.has("--ram-budget") || a.has("--stream");
    if (m.planned && (m.plan.streams() || asked)) std::fprintf(stderr, "%s", m.text.c_str());
    if (m.planned && a.has("--gds") && m.plan.layers[2] == 0)
        std::fprintf(stderr, "note: --gds: no layer is on the disk tier, so nothing is read with GPUDirect Storage "
                             "(lower --ram-budget to put layers there).\n");
    if (!m.planned && asked)
        std::fprintf(stderr, "note: the %s backend keeps every weight where it is; the memory budgets "
                             "apply to GPU backends.\n",
                     l.engine->backend().name().c_str());
    return l;
}

MemoryOptions memory_options(const Args& a) {
    MemoryOptions m;
    if (a.has("--vram-budget")) m.vram_budget = a.bytes("--vram-budget", 0);
    if (a.has("--ram-budget")) m.ram_budget = a.bytes("--ram-budget", 0);
    m.slots = a.integer("--slots", 0);
    m.prefetch = a.integer("--prefetch", 0);
    m.io_threads = a.integer("--io-threads", 8);
    if (m.slots < 0 || m.prefetch < 0 || m.io_threads < 1)
        fail("--slots and --prefetch must be 1 or more, --io-threads at least 1.");
    m.direct_io = !a.has("--no-direct-io");
    m.force_stream = a.has("--stream");
    m.trace = a.has("--trace");
    // Whether cuFile works here is decided (and said, with the plan) once the disk tier exists.
    m.gds = a.has("--gds");
    m.notify = [](const std::string& s) { std::fprintf(stderr, "note: %s.\n", s.c_str()); };
    return m;
}

std::string stream_report(Engine& eng, const mem::StreamStats& st, const char* what) {
    const MemoryReport& m = eng.memory();
    if (!eng.streamer() || st.steps == 0) return "";
    const double steps = double(st.steps);
    const double step_s = st.wall / steps;
    const double gib = double(uint64_t(1) << 30);
    std::string s = strfmt("streaming (%s): %d steps in %.3f s, %.4f s per step\n", what, st.steps, st.wall, step_s);
    // cuFile reads cross PCIe too (NVMe to GPU) but are not copies: they count in the total only.
    const uint64_t pcie = st.h2d_bytes + (st.gds ? st.disk_bytes : 0);
    s += strfmt("  per step: %.2f GiB over PCIe (%.2f GiB of it read from disk%s); plan: %.2f GiB, %.2f GiB\n",
                double(pcie) / steps / gib, double(st.disk_bytes) / steps / gib,
                st.gds ? " by GPUDirect Storage straight into VRAM" : "", double(m.plan.h2d_per_step) / gib,
                double(m.plan.disk_per_step) / gib);
    auto link = [&](const char* name, uint64_t bytes, double busy, double ceiling, const char* ceiling_name) {
        if (!bytes) return;
        const double eff = double(bytes) / st.wall / 1e9;
        s += strfmt("  %-9s busy %.4f s/step (%.0f%% of the step), %.2f GB/s while busy, %.2f GB/s overall",
                    name, busy / steps, 100.0 * busy / st.wall, busy > 0 ? double(bytes) / busy / 1e9 : 0.0, eff);
        if (ceiling > 0)
            s += strfmt(" = %.1f%% of the %.2f GB/s %s", 100.0 * eff / ceiling, ceiling, ceiling_name);
        s += "\n";
    };
    link("H2D copy", st.h2d_bytes, st.h2d_busy, m.input.h2d_gbs, "pinned H2D measured at load");
    if (st.gds) link("gds read", st.disk_bytes, st.disk_busy, m.input.disk_gbs, "cuFile read measured at load");
    else link("disk read", st.disk_bytes, st.disk_busy, m.input.disk_gbs, "O_DIRECT read measured at load");
    s += strfmt("  compute   busy %.4f s/step in layers (%.0f%% of the step); host blocked on disk %.4f s/step\n",
                st.compute_busy / steps, 100.0 * st.compute_busy / st.wall, st.host_wait / steps);
    const double slowest = std::max({st.h2d_busy, st.disk_busy, st.compute_busy});
    s += strfmt("  overlap efficiency %.1f%% (slowest stage's busy time / step time)\n", 100.0 * slowest / st.wall);
    const double t_h2d = m.input.h2d_gbs > 0 ? double(m.plan.h2d_per_step) / (m.input.h2d_gbs * 1e9) : 0;
    const double t_disk = m.input.disk_gbs > 0 ? double(m.plan.disk_per_step) / (m.input.disk_gbs * 1e9) : 0;
    const double roof = std::max(t_h2d, t_disk);
    if (roof > 0)
        s += strfmt("  step time / streaming roofline (%s-bound, %.4f s): %.3f\n", t_disk > t_h2d ? "disk" : "PCIe",
                    roof, step_s / roof);
    return s;
}

void write_trace_if_asked(const Args& a, Engine& eng) {
    if (!a.has("--trace")) return;
    const std::string path = a.str("--trace");
    if (!eng.streamer()) {
        std::fprintf(stderr, "note: no trace written to %s: every layer is resident, nothing streamed (force "
                             "streaming with --stream or lower --vram-budget).\n",
                     path.c_str());
        return;
    }
    eng.streamer()->write_trace(path);
    std::fprintf(stderr, "trace written to %s (open in ui.perfetto.dev or chrome://tracing)\n", path.c_str());
}

}  // namespace nt::cli
