// The weight streamer on the CPU: the real forward pass on the CPU backend, weights served by
// WeightStreamer through HostStreamDevice (a copy thread that poisons and slowly fills each
// slot), against the same model with every weight resident. Logits must be bit-identical for
// every mix of tiers, slot count and staging depth; one copy per streamed layer per step;
// nothing copied from unpinned memory; errors (EIO) surface and the pipeline recovers.
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "memory/streamer.h"
#include "memory/sysinfo.h"
#include "model/llama.h"
#include "test_memory_util.h"

namespace nt::mem {
namespace {

using testing_mem::HostStreamDevice;
using testing_mem::tier_plan;
using testing_mem::SynthSpec;
using testing_mem::TempPath;

// One prompt step of 5 tokens (every row's logits), then decode steps of one token.
struct StepLogits {
    std::vector<std::vector<float>> logits;
};

StepLogits run_steps(const LlamaHParams& hp, const ModelWeights& w, WeightSource& src, CpuBackend& be, int n_decode,
              int first_pos = 0) {
    StepLogits r;
    be.kv_truncate(0, first_pos);
    const int V = hp.shape.n_vocab;
    auto step = [&](const Batch& b) {
        llama_forward(hp, w, src, be, b);
        std::vector<float> out(size_t(b.n_logits()) * size_t(V));
        be.download(be.acts().logits, out.data(), out.size());
        r.logits.push_back(out);
    };
    Batch b;
    for (int i = 0; i < 5; i++) b.add(int32_t((17 * i + 3) % V), first_pos + i, 0, true);
    step(b);
    for (int i = 0; i < n_decode; i++) {
        b.clear();
        b.add(int32_t((31 * i + 7) % V), first_pos + 5 + i, 0, true);
        step(b);
    }
    return r;
}

void expect_same(const StepLogits& got, const StepLogits& want, const std::string& what) {
    ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
    for (size_t s = 0; s < want.logits.size(); s++) {
        ASSERT_EQ(got.logits[s].size(), want.logits[s].size());
        for (size_t i = 0; i < want.logits[s].size(); i++) {
            ASSERT_TRUE(std::isfinite(want.logits[s][i]));
            ASSERT_EQ(std::memcmp(&got.logits[s][i], &want.logits[s][i], 4), 0)
                << what << ": step " << s << " logit " << i << " got " << got.logits[s][i] << " want "
                << want.logits[s][i];
        }
    }
}

struct Fixture {
    std::unique_ptr<TempPath> tp;
    std::unique_ptr<GgufFile> file;
    LlamaHParams hp;
    ModelWeights w;
    CpuBackend be{2};
    StepLogits reference;
    explicit Fixture(const SynthSpec& spec, const std::string& dir = "", int n_decode = 4) {
        tp = std::make_unique<TempPath>("synth.gguf", dir);
        testing_mem::write_synth_model(tp->path, spec);
        file = GgufFile::open(tp->path);
        hp = read_llama_hparams(*file);
        w = map_llama_weights(*file, hp);
        be.init(hp.shape, 8, 1, 64);
        ResidentWeights res(w);
        reference = run_steps(hp, w, res, be, n_decode);
    }
};

struct Config {
    std::string tiers;  // one letter per layer: V, P, D
    int slots, staging;
    bool trace;
};

class MemoryStreamerMix : public ::testing::TestWithParam<Config> {};

TEST_P(MemoryStreamerMix, LogitsEqualResidentAndOneCopyPerLayerPerStep) {
    const Config c = GetParam();
    SynthSpec spec;
    spec.n_layer = int(c.tiers.size());
    static Fixture* fx = nullptr;  // one model for every configuration of 6 layers
    static std::unique_ptr<Fixture> keep;
    if (!fx || fx->hp.shape.n_layer != spec.n_layer) {
        keep = std::make_unique<Fixture>(spec);
        fx = keep.get();
    }
    HostStreamDevice dev(150);
    StreamOptions so;
    so.io.threads = 3;
    so.io.chunk_bytes = 64 * 1024;
    so.trace = c.trace;
    WeightStreamer ws(dev, fx->tp->path, fx->file->base(), fx->w.layers, tier_plan(c.tiers, c.slots, c.staging), so);
    const StepLogits got = run_steps(fx->hp, fx->w, ws, fx->be, 4);
    expect_same(got, fx->reference, c.tiers);

    const StreamStats st = ws.stats();
    int N = 0, ND = 0;
    uint64_t step_bytes = 0, disk_step = 0;
    for (size_t i = 0; i < c.tiers.size(); i++) {
        if (c.tiers[i] == 'V') continue;
        N++;
        step_bytes += ws.blobs()[i].bytes;
        if (c.tiers[i] == 'D') ND++, disk_step += ws.blobs()[i].bytes;
    }
    const int steps = 5;
    EXPECT_EQ(st.steps, steps);
    // Every step copies each streamed layer once; at most K copies of the next step are ahead.
    EXPECT_GE(dev.copies(), steps * N);
    EXPECT_LE(dev.copies(), steps * N + c.slots);
    EXPECT_EQ(st.copies, dev.copies());
    EXPECT_EQ(st.h2d_bytes, dev.copied_bytes());
    EXPECT_GE(st.h2d_bytes, steps * step_bytes);
    EXPECT_GE(st.disk_bytes, steps * disk_step);
    if (ND == 0) {
        EXPECT_EQ(st.disk_bytes, 0u);
    }
    EXPECT_FALSE(dev.bad_source()) << "a copy came from memory that was not pinned";
    EXPECT_GT(st.compute_busy, 0);
    if (N) {
        EXPECT_GT(st.h2d_busy, 0);
    }
    if (ND) {
        EXPECT_GT(st.disk_busy, 0);
    }
    EXPECT_GT(st.wall, 0);
    if (c.trace) {
        TempPath tp("trace.json");
        ws.write_trace(tp.path);
        const std::string check = std::string("python3 -c \"import json,sys; d=json.load(open('") + tp.path +
                                  "')); x=[e for e in d['traceEvents'] if e['ph']=='X']; "
                                  "cats=set(e['cat'] for e in x); "
                                  "sys.exit(0 if 'compute' in cats and ('h2d' in cats) == " +
                                  (N ? "True" : "False") + " and ('disk' in cats) == " + (ND ? "True" : "False") +
                                  " else 1)\"";
        if (std::system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
            EXPECT_EQ(std::system(check.c_str()), 0) << check;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, MemoryStreamerMix,
    ::testing::Values(Config{"PPPPPP", 2, 0, false}, Config{"PPPPPP", 1, 0, false}, Config{"VPVPVP", 3, 0, false},
                      Config{"VPDVDP", 2, 2, true}, Config{"DDDDDD", 2, 1, false}, Config{"DDDDDD", 3, 3, false},
                      Config{"PDPDPD", 4, 2, true}, Config{"VVVVVD", 2, 2, false}, Config{"DVVVVV", 3, 1, false},
                      Config{"VVVVVV", 2, 0, true}));

TEST(MemoryStreamer, DiskTierOnTmpfsAndEveryQuantType) {
    // Types the CPU backend runs; each with a disk tier read from /dev/shm (buffered or direct,
    // whatever this kernel's tmpfs does) and a pinned tier.
    for (GgmlType t : {GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                       GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                       GgmlType::Q6_K, GgmlType::BF16, GgmlType::F32}) {
        SynthSpec spec;
        spec.type = t;
        spec.n_layer = 4;
        spec.tied = t == GgmlType::Q8_0;
        Fixture fx(spec, filesystem_name("/dev/shm") == "tmpfs" ? "/dev/shm" : "", 2);
        HostStreamDevice dev(50);
        WeightStreamer ws(dev, fx.tp->path, fx.file->base(), fx.w.layers, tier_plan("DPVD", 2, 2), {});
        expect_same(run_steps(fx.hp, fx.w, ws, fx.be, 2), fx.reference, type_name(t));
    }
}

TEST(MemoryStreamer, RefusedPinningMovesLayersToDisk) {
    SynthSpec spec;
    Fixture fx(spec);
    HostStreamDevice dev(50);
    // Room for one layer blob and the staging buffers only.
    uint64_t blob = 0;
    for (const LayerWeights& l : fx.w.layers) blob = std::max(blob, layout_layer(layer_ranges(l, fx.file->base())).bytes);
    dev.pin_limit_ = 3 * blob;
    WeightStreamer ws(dev, fx.tp->path, fx.file->base(), fx.w.layers, tier_plan("PPPPVV", 2, 2), {});
    EXPECT_NE(ws.notices().find("could not pin"), std::string::npos) << ws.notices();
    EXPECT_EQ(ws.plan().layers[1], 1);
    EXPECT_EQ(ws.plan().layers[2], 3);
    EXPECT_LE(ws.plan().disk_per_step, 3 * blob);
    EXPECT_GE(ws.plan().disk_per_step, 3 * blob - 3 * 4096);
    expect_same(run_steps(fx.hp, fx.w, ws, fx.be, 4), fx.reference, "demoted");
    // Not even the staging buffers: a clear error naming what to do.
    HostStreamDevice dev2(0);
    dev2.pin_limit_ = blob / 2;
    try {
        WeightStreamer ws2(dev2, fx.tp->path, fx.file->base(), fx.w.layers, tier_plan("PPPPVV", 2, 2), {});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("could not pin 2 staging buffers"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("ulimit -l"), std::string::npos) << e.what();
    }
    EXPECT_EQ(dev2.pinned_bytes(), 0u);  // nothing leaked on the way out
}

TEST(MemoryStreamer, RecoversFromAnAbandonedStepAndFromReadErrors) {
    SynthSpec spec;
    Fixture fx(spec);
    HostStreamDevice dev(100);
    StreamOptions so;
    so.io.chunk_bytes = 32 * 1024;
    WeightStreamer ws(dev, fx.tp->path, fx.file->base(), fx.w.layers, tier_plan("PDVDPD", 2, 2), so);
    expect_same(run_steps(fx.hp, fx.w, ws, fx.be, 4), fx.reference, "first");
    // A step that stopped half-way (an exception between acquire and release).
    ws.acquire(0);
    ws.release(0);
    ws.acquire(1);
    expect_same(run_steps(fx.hp, fx.w, ws, fx.be, 4), fx.reference, "after an abandoned step");

    // The disk fails: the step ends in the read's error, never in garbage logits.
    ws.reader_for_testing()->set_pread_for_testing([](int, void*, size_t, off_t) -> ssize_t {
        errno = EIO;
        return -1;
    });
    try {
        run_steps(fx.hp, fx.w, ws, fx.be, 4);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("synth.gguf"), std::string::npos) << e.what();
    }
    // The disk heals: the next steps are right again.
    ws.reader_for_testing()->set_pread_for_testing([](int fd, void* b, size_t n, off_t off) { return ::pread(fd, b, n, off); });
    expect_same(run_steps(fx.hp, fx.w, ws, fx.be, 4), fx.reference, "after the read error");
}

TEST(MemoryStreamer, MeasuresDiskBandwidth) {
    SynthSpec spec;
    Fixture fx(spec);
    HostStreamDevice dev(0);
    WeightStreamer ws(dev, fx.tp->path, fx.file->base(), fx.w.layers, tier_plan("DDDPPV", 2, 2), {});
    EXPECT_GT(ws.measure_disk_gbs(4 << 20), 0.0);
    expect_same(run_steps(fx.hp, fx.w, ws, fx.be, 4), fx.reference, "after measuring");
    EXPECT_EQ(ws.measure_disk_gbs(), 0.0);  // not once the pipeline runs
}

// ---- the engine hook: plan from budgets, then the same logits as without a planner

TEST(MemoryEngine, BudgetsForceStreamingWithIdenticalLogits) {
    SynthSpec spec;
    spec.n_layer = 8;
    TempPath tp("engine.gguf");
    testing_mem::write_synth_model(tp.path, spec);
    auto model = Model::load(tp.path);
    EngineOptions base;
    base.n_ctx = 64;
    base.max_batch = 8;
    std::vector<int32_t> prompt{1, 40, 41, 42, 43, 44};
    auto run = [&](Engine& eng) {
        std::vector<std::vector<float>> out;
        out.push_back(eng.prefill(0, 0, prompt));
        std::vector<float> lg;
        Batch b;
        for (int i = 0; i < 4; i++) {
            b.clear();
            b.add(50 + i, int(prompt.size()) + i, 0, true);
            eng.eval(b, lg);
            out.push_back(lg);
        }
        return out;
    };
    Engine plain(*model, std::make_unique<CpuBackend>(2), base);
    EXPECT_FALSE(plain.memory().planned);
    const auto want = run(plain);

    uint64_t layer_res = 0;
    for (const WeightView* v : layer_views(model->weights.layers[0])) layer_res += (v->nbytes + 255) / 256 * 256;
    uint64_t blob = 0;
    for (const LayerWeights& l : model->weights.layers)
        blob = std::max(blob, layout_layer(layer_ranges(l, model->file->base())).bytes);
    const uint64_t fixed = (model->weights.tok_embd.nbytes + 255) / 256 * 256 +
                           (model->weights.output.nbytes + 255) / 256 * 256 +
                           (model->weights.output_norm.nbytes + 255) / 256 * 256 + (64 << 10);  // + backend

    EngineOptions o = base;
    HostStreamDevice* devp = nullptr;
    o.stream_device = [&](Backend&) {
        auto d = std::make_unique<HostStreamDevice>(50);
        devp = d.get();
        return d;
    };
    // Room for 3 slots and 3 resident layers: 5 of 8 stream; 2 of them pinned, 3 from disk.
    o.memory.vram_budget = fixed + 3 * blob + 3 * layer_res + 100;
    o.memory.ram_budget = 2 * blob + 2 * blob + 100;  // 2 staging buffers + 2 pinned layers
    o.memory.prefetch = 2;
    o.memory.trace = true;
    Engine streamed(*model, std::make_unique<CpuBackend>(2), o);
    ASSERT_TRUE(streamed.memory().planned);
    const TierPlan& p = streamed.memory().plan;
    EXPECT_EQ(p.layers[0], 3);
    EXPECT_EQ(p.layers[1], 2);
    EXPECT_EQ(p.layers[2], 3);
    EXPECT_NE(streamed.memory().text.find("memory plan"), std::string::npos);
    ASSERT_NE(streamed.streamer(), nullptr);
    ASSERT_TRUE(devp && devp->streaming_);
    const auto got = run(streamed);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); s++) ASSERT_EQ(got[s], want[s]) << "step " << s;

    // Budgets that hold everything: resident, no streamer, same numbers.
    EngineOptions roomy = o;
    roomy.memory.vram_budget = kAuto;
    Engine resident(*model, std::make_unique<CpuBackend>(2), roomy);
    EXPECT_TRUE(resident.memory().planned);
    EXPECT_TRUE(resident.memory().plan.all_resident());
    EXPECT_EQ(resident.streamer(), nullptr);
    EXPECT_EQ(run(resident), want);

    // A VRAM budget below the working set: one sentence naming the minimum.
    EngineOptions tiny = o;
    tiny.memory.vram_budget = fixed + blob;
    try {
        Engine e(*model, std::make_unique<CpuBackend>(2), tiny);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs at least " + format_gib(fixed + 2 * blob)), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace nt::mem
