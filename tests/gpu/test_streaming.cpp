// Tiered memory on the GPU: the same model run resident on the GPU, streamed through all three
// tiers (VRAM, pinned RAM, disk) and on the CPU gives the same logits, for every weight type;
// budgets that force streaming plan all three tiers; budgets that hold everything keep the
// resident path (CUDA graphs); on a model with large layers the copy stream runs near the
// measured PCIe ceiling while compute overlaps it; and with GPUDirect Storage the disk tier is
// read by cuFile straight into VRAM with the same logits. Every test skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../unit/test_memory_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/stream_device.h"
#include "core/error.h"
#include "engine/engine.h"
#include "memory/cufile.h"
#include "memory/gds_probe.h"
#include "memory/streamer.h"

namespace nt {
namespace {

using mem::Tier;
using testing_mem::SynthSpec;
using testing_mem::TempPath;

#define NT_REQUIRE_GPU()                                                           \
    do {                                                                           \
        if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA GPU"; \
    } while (0)

// A 7-token prompt (logits of every row), then 5 decode steps.
std::vector<std::vector<float>> run(Engine& eng) {
    std::vector<std::vector<float>> out;
    std::vector<float> lg;
    Batch b;
    for (int i = 0; i < 7; i++) b.add(int32_t(3 + 37 * i % 290), i, 0, true);
    eng.eval(b, lg);
    out.push_back(lg);
    for (int i = 0; i < 5; i++) {
        b.clear();
        b.add(int32_t(11 + 53 * i % 290), 7 + i, 0, true);
        eng.eval(b, lg);
        out.push_back(lg);
    }
    return out;
}

std::vector<float> flat(const std::vector<std::vector<float>>& v) {
    std::vector<float> f;
    for (const auto& x : v) f.insert(f.end(), x.begin(), x.end());
    return f;
}

// max |got - want| / std(want)
double rel_max(const std::vector<float>& got, const std::vector<float>& want) {
    double mean = 0, var = 0, worst = 0;
    for (float x : want) mean += x;
    mean /= double(want.size());
    for (float x : want) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / double(want.size()));
    for (size_t i = 0; i < got.size(); i++) {
        const double d = std::fabs(double(got[i]) - double(want[i]));
        if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
    }
    return worst / std::max(sd, 1e-30);
}

EngineOptions cuda_opts() {
    EngineOptions o;
    o.n_ctx = 64;
    o.max_batch = 16;
    o.stream_device = make_cuda_stream_device;
    return o;
}

TEST(Streaming, ResidentStreamedAndCpuAgreeForEveryType) {
    NT_REQUIRE_GPU();
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                       GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                       GgmlType::Q6_K}) {
        SCOPED_TRACE(type_name(t));
        SynthSpec spec;
        spec.type = t;
        spec.n_layer = 6;
        spec.n_embd = 512;
        spec.n_ff = 1024;
        spec.n_head = 8;
        spec.n_head_kv = 2;
        spec.tied = t == GgmlType::Q8_0;
        TempPath tp("synth.gguf");
        testing_mem::write_synth_model(tp.path, spec);
        auto model = Model::load(tp.path);

        EngineOptions co;
        co.n_ctx = 64;
        co.max_batch = 16;
        Engine cpu(*model, std::make_unique<CpuBackend>(0), co);
        const auto want = flat(run(cpu));

        Engine resident(*model, std::make_unique<CudaBackend>(), cuda_opts());
        ASSERT_TRUE(resident.memory().planned);
        ASSERT_TRUE(resident.memory().plan.all_resident());
        ASSERT_EQ(resident.streamer(), nullptr);
        const auto res = flat(run(resident));

        EngineOptions so = cuda_opts();
        so.memory.forced_tiers = {Tier::Vram, Tier::Pinned, Tier::Disk, Tier::Pinned, Tier::Disk, Tier::Vram};
        so.memory.slots = 2;
        so.memory.prefetch = 2;
        Engine streamed(*model, std::make_unique<CudaBackend>(), so);
        ASSERT_NE(streamed.streamer(), nullptr);
        EXPECT_EQ(streamed.memory().plan.layers[0], 2);
        EXPECT_EQ(streamed.memory().plan.layers[1], 2);
        EXPECT_EQ(streamed.memory().plan.layers[2], 2);
        const auto str = flat(run(streamed));

        // Same kernels on the same bytes: streamed equals resident (graphs or not).
        size_t differ = 0;
        for (size_t i = 0; i < res.size(); i++) differ += std::memcmp(&res[i], &str[i], 4) != 0;
        EXPECT_LE(rel_max(str, res), 1e-5) << differ << " of " << res.size() << " logits differ";
        if (differ) std::printf("[ note ] %s: %zu of %zu logits not bit-identical, max %.2g x std\n", type_name(t),
                                differ, res.size(), rel_max(str, res));
        // And both agree with the CPU reference.
        EXPECT_LE(rel_max(res, want), 0.1) << "resident GPU vs CPU";
        EXPECT_LE(rel_max(str, want), 0.1) << "streamed GPU vs CPU";
        const mem::StreamStats st = streamed.streamer()->stats();
        EXPECT_EQ(st.steps, 6);
        EXPECT_GE(st.copies, 6 * 4);
        EXPECT_LE(st.copies, 6 * 4 + 2);
    }
}

TEST(Streaming, SmallBudgetsPlanAllThreeTiersAndMatchResident) {
    NT_REQUIRE_GPU();
    SynthSpec spec;
    spec.type = GgmlType::Q8_0;
    spec.n_layer = 10;
    spec.n_embd = 1024;
    spec.n_ff = 4096;
    spec.n_head = 16;
    spec.n_head_kv = 4;
    TempPath tp("synth.gguf");
    testing_mem::write_synth_model(tp.path, spec);
    auto model = Model::load(tp.path);
    Engine resident(*model, std::make_unique<CudaBackend>(), cuda_opts());
    const auto want = flat(run(resident));
    const mem::PlanInput& in = resident.memory().input;
    const uint64_t slot = *std::max_element(in.blob_bytes.begin(), in.blob_bytes.end());
    const uint64_t res = *std::max_element(in.resident_bytes.begin(), in.resident_bytes.end());

    EngineOptions o = cuda_opts();
    // Room for the backend, 3 slots and about 4 resident layers. RAM for 5.5 layers: the 6 left
    // over do not fit, so some go to disk, which costs 3 staging buffers and leaves room for 2
    // pinned layers; the other 4 stream from disk. (With RAM for all 6 the planner rightly
    // pins them all and needs no staging.)
    o.memory.vram_budget = in.vram_backend + in.vram_fixed_weights + 3 * slot + 4 * res + res / 2;
    o.memory.ram_budget = 3 * slot + 2 * slot + slot / 2;
    o.memory.trace = true;
    Engine streamed(*model, std::make_unique<CudaBackend>(), o);
    const mem::TierPlan& p = streamed.memory().plan;
    std::printf("%s", streamed.memory().text.c_str());
    ASSERT_NE(streamed.streamer(), nullptr);
    EXPECT_GE(p.layers[0], 3);
    EXPECT_LE(p.layers[0], 5);
    EXPECT_GE(p.layers[1], 2);
    EXPECT_GE(p.layers[2], 2);
    EXPECT_LE(p.vram_used, o.memory.vram_budget);
    EXPECT_LE(p.ram_used, o.memory.ram_budget);
    const auto got = flat(run(streamed));
    EXPECT_LE(rel_max(got, want), 1e-5);
    TempPath trace("trace.json");
    streamed.streamer()->write_trace(trace.path);
    if (std::system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        const std::string check = "python3 -c \"import json; d=json.load(open('" + trace.path +
                                  "')); c=set(e.get('cat') for e in d['traceEvents'] if e['ph']=='X'); "
                                  "assert {'compute','h2d','disk'} <= c, c\"";
        EXPECT_EQ(std::system(check.c_str()), 0);
    }

    // A VRAM budget below KV + scratch + two slots: one sentence naming the minimum.
    EngineOptions tiny = cuda_opts();
    tiny.memory.vram_budget = in.vram_backend + slot;
    try {
        Engine e(*model, std::make_unique<CudaBackend>(), tiny);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs at least"), std::string::npos) << e.what();
    }
}

TEST(Streaming, BudgetsThatHoldEverythingKeepGraphs) {
    NT_REQUIRE_GPU();
    SynthSpec spec;
    TempPath tp("synth.gguf");
    testing_mem::write_synth_model(tp.path, spec);
    auto model = Model::load(tp.path);
    EngineOptions o = cuda_opts();
    o.memory.vram_budget = uint64_t(4) << 30;
    o.memory.ram_budget = uint64_t(1) << 30;
    Engine eng(*model, std::make_unique<CudaBackend>(), o);
    EXPECT_TRUE(eng.memory().plan.all_resident());
    EXPECT_EQ(eng.streamer(), nullptr);
    run(eng);
    auto& cb = dynamic_cast<CudaBackend&>(eng.backend());
    EXPECT_TRUE(cb.graphs());
    EXPECT_GT(cb.graph_stats().replays, 0);
}

// Layers of ~120 MB (8B-like widths, Q4_K), all streamed from pinned RAM: decode is copy-bound,
// so the step should take about (bytes / measured H2D) and the copy stream should be busy most
// of it. Prints the figures; thresholds are loose enough for a shared machine.
TEST(Streaming, DecodeRunsNearThePcieRoofline) {
    NT_REQUIRE_GPU();
    SynthSpec spec;
    spec.type = GgmlType::Q4_K;
    spec.n_layer = 6;
    spec.n_embd = 4096;
    spec.n_ff = 14336;
    spec.n_head = 32;
    spec.n_head_kv = 8;
    TempPath tp("big.gguf");
    testing_mem::write_synth_model(tp.path, spec);
    auto model = Model::load(tp.path);
    EngineOptions o = cuda_opts();
    o.memory.forced_tiers.assign(6, Tier::Pinned);
    o.memory.slots = 3;
    Engine eng(*model, std::make_unique<CudaBackend>(), o);
    ASSERT_NE(eng.streamer(), nullptr);
    std::vector<float> lg;
    Batch b;
    b.add(5, 0, 0, true);
    eng.eval(b, lg);  // warm-up
    eng.streamer()->reset_stats();
    const int steps = 20;
    const double t0 = mem::now_seconds();
    for (int i = 1; i <= steps; i++) {
        b.clear();
        b.add(5 + i, i, 0, true);
        eng.eval(b, lg);
    }
    const double dt = (mem::now_seconds() - t0) / steps;
    const mem::StreamStats st = eng.streamer()->stats();
    const double h2d = eng.memory().input.h2d_gbs;
    const double roof = double(eng.memory().plan.h2d_per_step) / (h2d * 1e9);
    std::printf("[ perf ] %.1f MiB streamed per step; %.2f ms per step vs %.2f ms at the measured %.1f GB/s "
                "(ratio %.3f); copy busy %.0f%%, compute busy %.0f%%\n",
                double(eng.memory().plan.h2d_per_step) / (1 << 20), dt * 1e3, roof * 1e3, h2d, dt / roof,
                100 * st.h2d_busy / st.wall, 100 * st.compute_busy / st.wall);
    ASSERT_GT(h2d, 0);
    EXPECT_LT(dt / roof, 1.25) << "a decode step takes much longer than its bytes at the PCIe ceiling";
    EXPECT_GT(st.h2d_busy / st.wall, 0.75) << "the copy stream idles: copies are not kept back to back";
}

// The real libcufile, except that reads from g_fail_from on fail as cuFile's internal error: the
// fallback to O_DIRECT mid-run on the device.
const mem::CuFileApi* g_real_cufile = nullptr;
std::atomic<int> g_cufile_reads{0}, g_fail_from{1 << 30};
ssize_t failing_read(void* fh, void* base, size_t n, off_t off, off_t boff) {
    if (g_cufile_reads++ >= g_fail_from) return -5030;
    return g_real_cufile->read(fh, base, n, off, boff);
}

// GPUDirect Storage: disk-tier layers read by cuFile straight into the VRAM slots give the
// resident run's logits, bit for bit the O_DIRECT run's, and cost no H2D copy; a read cuFile
// fails mid-run falls back to O_DIRECT with one sentence and the same logits. Skips (saying why)
// where libcufile or its driver is absent. The model goes to $NT_GDS_TEST_DIR when set (a file
// system GDS supports), the temp directory otherwise.
TEST(Streaming, GdsDiskTierMatchesResidentAndODirect) {
    NT_REQUIRE_GPU();
    SynthSpec spec;
    spec.type = GgmlType::Q4_K;
    spec.n_layer = 6;
    spec.n_embd = 1024;
    spec.n_ff = 2816;
    spec.n_head = 16;
    spec.n_head_kv = 4;
    const char* dir = std::getenv("NT_GDS_TEST_DIR");
    TempPath tp("synth.gguf", dir ? dir : "");
    testing_mem::write_synth_model(tp.path, spec);
    auto model = Model::load(tp.path);
    Engine resident(*model, std::make_unique<CudaBackend>(), cuda_opts());
    const auto want = flat(run(resident));
    // After CUDA is up: cuFileDriverOpen wants a context.
    const mem::GdsProbe probe = mem::probe_gds();
    if (!probe.driver) GTEST_SKIP() << probe.detail;

    const std::string tiers = "DDPDVD";
    EngineOptions o = cuda_opts();
    for (char c : tiers) o.memory.forced_tiers.push_back(c == 'V' ? Tier::Vram : c == 'P' ? Tier::Pinned : Tier::Disk);
    o.memory.slots = 2;
    o.memory.prefetch = 2;
    std::vector<std::string> told;
    o.memory.notify = [&](const std::string& m) { told.push_back(m); };
    Engine odirect(*model, std::make_unique<CudaBackend>(), o);
    ASSERT_NE(odirect.streamer(), nullptr);
    ASSERT_FALSE(odirect.streamer()->gds());
    const auto od = flat(run(odirect));

    o.memory.gds = true;
    o.memory.trace = true;
    Engine gds(*model, std::make_unique<CudaBackend>(), o);
    std::printf("%s", gds.memory().text.c_str());
    ASSERT_NE(gds.streamer(), nullptr);
    if (!gds.streamer()->gds()) {
        // The driver opens but cuFile refuses this file (a file system or container without
        // GPUDirect Storage support, e.g. cuFileHandleRegister error 5027): the run must have
        // said why in one sentence and read the disk tier with O_DIRECT, with the same logits.
        const std::string why = gds.streamer()->notices();
        ASSERT_FALSE(why.empty()) << "cuFile fell back without saying why";
        EXPECT_NE(why.find("O_DIRECT"), std::string::npos) << why;
        EXPECT_NE(gds.memory().text.find(why), std::string::npos) << "the plan printout omits the reason";
        const auto fell_back = flat(run(gds));
        EXPECT_EQ(fell_back, od) << "the O_DIRECT fallback read different bytes";
        GTEST_SKIP() << "GPUDirect Storage is not usable for " << tp.path << ": " << why
                     << " (set NT_GDS_TEST_DIR to a directory on a file system cuFile supports)";
    }
    EXPECT_NE(gds.memory().text.find("read by GPUDirect Storage"), std::string::npos) << gds.memory().text;
    EXPECT_GT(gds.memory().input.disk_gbs, 0);
    gds.streamer()->reset_stats();  // the load-time measurement is not a step
    const auto got = flat(run(gds));
    size_t differ = 0;
    for (size_t i = 0; i < od.size(); i++) differ += std::memcmp(&od[i], &got[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << "cuFile and O_DIRECT put different bytes in the slots";
    EXPECT_LE(rel_max(got, want), 1e-5) << "GDS vs resident";
    EXPECT_TRUE(told.empty()) << told[0];

    const mem::StreamStats st = gds.streamer()->stats();
    uint64_t pinned = 0, disk = 0;
    for (size_t i = 0; i < tiers.size(); i++) {
        if (tiers[i] == 'P') pinned += gds.streamer()->blobs()[i].bytes;
        if (tiers[i] == 'D') disk += gds.streamer()->blobs()[i].bytes;
    }
    const uint64_t slot = gds.memory().plan.slot_bytes;
    EXPECT_TRUE(st.gds);
    EXPECT_EQ(st.steps, 6);
    EXPECT_GE(st.h2d_bytes, 6 * pinned);
    EXPECT_LE(st.h2d_bytes, 6 * pinned + 2 * slot) << "disk layers were copied";
    EXPECT_GE(st.disk_bytes, 6 * disk);
    EXPECT_LE(st.disk_bytes, 6 * disk + 2 * slot);
    EXPECT_GT(st.disk_busy, 0);
    std::printf("[ perf ] cuFile: %.1f MiB per step in %.2f ms busy (%.2f GB/s while busy); measured at load %.2f GB/s\n",
                double(st.disk_bytes) / st.steps / (1 << 20), 1e3 * st.disk_busy / st.steps,
                st.disk_busy > 0 ? double(st.disk_bytes) / st.disk_busy / 1e9 : 0.0, gds.memory().input.disk_gbs);
    TempPath trace("trace.json");
    gds.streamer()->write_trace(trace.path);
    if (std::system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        const std::string check = "python3 -c \"import json; d=json.load(open('" + trace.path +
                                  "')); n=set(e['name'] for e in d['traceEvents'] if e['ph']=='X'); "
                                  "assert 'gds read' in n, n\"";
        EXPECT_EQ(std::system(check.c_str()), 0);
    }

    // cuFile fails mid-run: O_DIRECT takes over, says so once, same logits.
    std::string why;
    g_real_cufile = mem::cufile_api(&why);
    ASSERT_NE(g_real_cufile, nullptr) << why;
    static mem::CuFileApi failing;
    failing = *g_real_cufile;
    failing.read = failing_read;
    o.memory.gds_api_for_testing = &failing;
    o.memory.trace = false;
    Engine flaky(*model, std::make_unique<CudaBackend>(), o);
    ASSERT_NE(flaky.streamer(), nullptr);
    ASSERT_TRUE(flaky.streamer()->gds());
    g_fail_from = g_cufile_reads + 5;  // after the load-time measurement, inside the first steps
    const auto fb = flat(run(flaky));
    EXPECT_FALSE(flaky.streamer()->gds());
    ASSERT_EQ(told.size(), 1u);
    EXPECT_NE(told[0].find("cuFile error 5030"), std::string::npos) << told[0];
    EXPECT_NE(told[0].find("O_DIRECT"), std::string::npos) << told[0];
    differ = 0;
    for (size_t i = 0; i < od.size(); i++) differ += std::memcmp(&od[i], &fb[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << "logits changed across the fallback";
}

}  // namespace
}  // namespace nt
