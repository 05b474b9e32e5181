// GPUDirect Storage's host side, without a GPU: the streamer's cuFile path run against a fake
// cuFile (host memory as "VRAM", pread under the hood) that poisons each destination and reads it
// slowly, so a read started before its slot was released, or compute that did not wait for the
// read, shows as wrong logits. Logits must be bit-identical to the resident run; disk layers
// must cost no copy; every fallback (library, driver, file system, buffer registration, a read
// cuFile cannot do) must keep the answers right and say why in one sentence; disk errors must
// stay errors.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "memory/cufile.h"
#include "memory/streamer.h"
#include "model/llama.h"
#include "test_memory_util.h"

namespace nt::mem {
namespace {

using testing_mem::HostStreamDevice;
using testing_mem::SynthSpec;
using testing_mem::TempPath;
using testing_mem::tier_plan;

// ---- a fake libcufile ------------------------------------------------------------------------

struct Fake {
    std::mutex mu;
    std::vector<std::pair<char*, size_t>> regions;
    int driver_err = 0, handle_err = 0, buf_err = 0;
    std::atomic<int> reads{0}, registered_reads{0}, unregistered_reads{0}, bad_reads{0};
    std::atomic<int> fail_from{-1};  // reads from this one on fail (-1: none)
    ssize_t fail_ret = -1;
    int fail_errno = 0;
    int delay_us = 100;
};
Fake* g_fake = nullptr;

struct FakeHandle {
    int fd;  // a buffered descriptor of the same file: reads at the end need no alignment
};

CuFileStatus fake_driver_open() { return {g_fake->driver_err, 0}; }
CuFileStatus fake_handle_register(void** fh, CuFileDescr* d) {
    if (g_fake->handle_err) return {g_fake->handle_err, 0};
    if (d->type != 1 || d->fs_ops != nullptr) return {5022, 0};
    // cuFile wants O_DIRECT descriptors.
    if (!(fcntl(d->handle.fd, F_GETFL) & O_DIRECT)) return {5020, 0};
    const std::string self = "/proc/self/fd/" + std::to_string(d->handle.fd);
    *fh = new FakeHandle{::open(self.c_str(), O_RDONLY | O_CLOEXEC)};
    return {0, 0};
}
void fake_handle_deregister(void* fh) {
    ::close(static_cast<FakeHandle*>(fh)->fd);
    delete static_cast<FakeHandle*>(fh);
}
CuFileStatus fake_buf_register(const void* base, size_t n, int flags) {
    if (g_fake->buf_err) return {g_fake->buf_err, 0};
    if (flags != 0) return {5022, 0};
    std::lock_guard<std::mutex> lk(g_fake->mu);
    g_fake->regions.push_back({static_cast<char*>(const_cast<void*>(base)), n});
    return {0, 0};
}
CuFileStatus fake_buf_deregister(const void* base) {
    std::lock_guard<std::mutex> lk(g_fake->mu);
    for (size_t i = 0; i < g_fake->regions.size(); i++)
        if (g_fake->regions[i].first == base) {
            g_fake->regions.erase(g_fake->regions.begin() + long(i));
            return {0, 0};
        }
    return {5024, 0};
}
ssize_t fake_read(void* fh, void* base, size_t size, off_t off, off_t boff) {
    Fake& f = *g_fake;
    const int k = f.reads++;
    if (f.fail_from >= 0 && k >= f.fail_from) {
        errno = f.fail_errno;
        return f.fail_ret;
    }
    char* b = static_cast<char*>(base);
    bool registered = false;
    {
        std::lock_guard<std::mutex> lk(f.mu);
        for (auto& [p, n] : f.regions)
            if (p == b) registered = size_t(boff) + size <= n;
    }
    // cuFile's rule: an offset only into a registered buffer, named by its base.
    if (boff != 0 && !registered) f.bad_reads++;
    (registered ? f.registered_reads : f.unregistered_reads)++;
    std::memset(b + boff, 0xFF, size);  // compute that did not wait sees NaN scales
    if (f.delay_us) std::this_thread::sleep_for(std::chrono::microseconds(f.delay_us));
    return ::pread(static_cast<FakeHandle*>(fh)->fd, b + boff, size, off);
}

// Distinct tables: the driver opens once per table.
const CuFileApi kFake{fake_driver_open,  fake_handle_register, fake_handle_deregister,
                      fake_buf_register, fake_buf_deregister,  fake_read};
const CuFileApi kFakeNoDriver = kFake;

// ---- the model and the runs ------------------------------------------------------------------

using Logits = std::vector<std::vector<float>>;

Logits run_steps(const LlamaHParams& hp, const ModelWeights& w, WeightSource& src, CpuBackend& be, int n_decode) {
    Logits r;
    be.kv_truncate(0, 0);
    const int V = hp.shape.n_vocab;
    auto step = [&](const Batch& b) {
        llama_forward(hp, w, src, be, b);
        std::vector<float> out(size_t(b.n_logits()) * size_t(V));
        be.download(be.acts().logits, out.data(), out.size());
        r.push_back(out);
    };
    Batch b;
    for (int i = 0; i < 5; i++) b.add(int32_t((17 * i + 3) % V), i, 0, true);
    step(b);
    for (int i = 0; i < n_decode; i++) {
        b.clear();
        b.add(int32_t((31 * i + 7) % V), 5 + i, 0, true);
        step(b);
    }
    return r;
}

void expect_same(const Logits& got, const Logits& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t s = 0; s < want.size(); s++) {
        ASSERT_EQ(got[s].size(), want[s].size()) << what;
        for (size_t i = 0; i < want[s].size(); i++) {
            ASSERT_TRUE(std::isfinite(want[s][i]));
            ASSERT_EQ(std::memcmp(&got[s][i], &want[s][i], 4), 0)
                << what << ": step " << s << " logit " << i << " got " << got[s][i] << " want " << want[s][i];
        }
    }
}

class Gds : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        SynthSpec spec;
        tp_ = new TempPath("synth.gguf");
        testing_mem::write_synth_model(tp_->path, spec);
        file_ = GgufFile::open(tp_->path).release();
        hp_ = read_llama_hparams(*file_);
        w_ = map_llama_weights(*file_, hp_);
        be_ = new CpuBackend(2);
        be_->init(hp_.shape, 8, 1, 64);
        ResidentWeights res(w_);
        reference_ = run_steps(hp_, w_, res, *be_, 4);
    }
    static void TearDownTestSuite() {
        delete be_;
        delete file_;
        delete tp_;
    }
    void SetUp() override {
        fake_ = std::make_unique<Fake>();
        g_fake = fake_.get();
        if (!FileReader(tp_->path).direct())
            GTEST_SKIP() << "the temporary directory's file system refuses O_DIRECT, which cuFile needs";
    }
    void TearDown() override { g_fake = nullptr; }

    StreamOptions options(const CuFileApi* api = &kFake) {
        StreamOptions so;
        so.io.threads = 3;
        so.io.chunk_bytes = 64 * 1024;  // several reads per layer
        so.gds = true;
        so.gds_api = api;
        so.notify = [this](const std::string& s) { told_.push_back(s); };
        return so;
    }
    std::unique_ptr<WeightStreamer> streamer(HostStreamDevice& dev, const std::string& tiers, int slots,
                                             const StreamOptions& so) {
        return std::make_unique<WeightStreamer>(dev, tp_->path, file_->base(), w_.layers, tier_plan(tiers, slots, 2), so);
    }
    Logits run(WeightStreamer& ws, int n_decode = 4) { return run_steps(hp_, w_, ws, *be_, n_decode); }
    uint64_t bytes_of(WeightStreamer& ws, const std::string& tiers, char tier) const {
        uint64_t b = 0;
        for (size_t i = 0; i < tiers.size(); i++)
            if (tiers[i] == tier) b += ws.blobs()[i].bytes;
        return b;
    }

    static TempPath* tp_;
    static GgufFile* file_;
    static LlamaHParams hp_;
    static ModelWeights w_;
    static CpuBackend* be_;
    static Logits reference_;
    std::unique_ptr<Fake> fake_;
    std::vector<std::string> told_;
};
TempPath* Gds::tp_ = nullptr;
GgufFile* Gds::file_ = nullptr;
LlamaHParams Gds::hp_;
ModelWeights Gds::w_;
CpuBackend* Gds::be_ = nullptr;
Logits Gds::reference_;

TEST(GdsLibrary, MissingLibrarySaysWhatToDo) {
    std::string why;
    EXPECT_EQ(load_cufile_library("libnt-absent-cufile.so.0", &why), nullptr);
    EXPECT_NE(why.find("libnt-absent-cufile.so.0"), std::string::npos) << why;
    EXPECT_NE(why.find("not installed"), std::string::npos) << why;
    EXPECT_NE(why.find("O_DIRECT"), std::string::npos) << why;
    // A library without cuFile's functions is not taken for one.
    EXPECT_EQ(load_cufile_library("libm.so.6", &why), nullptr);
    EXPECT_NE(why.find("has no cuFileDriverOpen"), std::string::npos) << why;
}

TEST(GdsLibrary, ClassifiesReadFailures) {
    EXPECT_EQ(classify_gds_read_failure(-1, EINTR), GdsReadFailure::Retry);
    EXPECT_EQ(classify_gds_read_failure(-1, EIO), GdsReadFailure::DiskError);
    EXPECT_EQ(classify_gds_read_failure(-1, ENODATA), GdsReadFailure::DiskError);
    EXPECT_EQ(classify_gds_read_failure(-1, EINVAL), GdsReadFailure::FallBack);
    EXPECT_EQ(classify_gds_read_failure(-1, EFAULT), GdsReadFailure::FallBack);
    EXPECT_EQ(classify_gds_read_failure(-5008, 0), GdsReadFailure::FallBack);
    EXPECT_EQ(classify_gds_read_failure(-5030, EIO), GdsReadFailure::FallBack);  // errno is stale there
    EXPECT_NE(describe_gds_read_failure(-5008, 0).find("cuFile error 5008, I/O not supported"), std::string::npos);
    EXPECT_EQ(describe_gds_read_failure(-1, EIO), std::strerror(EIO));
}

TEST_F(Gds, DiskLayersGoStraightIntoTheSlotsWithIdenticalLogits) {
    struct Case {
        std::string tiers;
        int slots;
    };
    for (const Case& c : {Case{"VDPDDP", 2}, Case{"DDDDDD", 3}, Case{"DDDDDD", 1}, Case{"PDVVDP", 4}}) {
        SCOPED_TRACE(c.tiers + " slots " + std::to_string(c.slots));
        fake_ = std::make_unique<Fake>();
        g_fake = fake_.get();
        HostStreamDevice dev(100);
        StreamOptions so = options();
        so.trace = true;
        auto ws = streamer(dev, c.tiers, c.slots, so);
        ASSERT_TRUE(ws->gds()) << ws->notices();
        EXPECT_EQ(ws->notices(), "");
        EXPECT_NE(describe_plan(ws->plan(), PlanInput{}).find("read by GPUDirect Storage (cuFile)"), std::string::npos)
            << describe_plan(ws->plan(), PlanInput{});
        expect_same(run(*ws), reference_, "cuFile");

        const StreamStats st = ws->stats();
        const int steps = 5;
        const uint64_t pinned = bytes_of(*ws, c.tiers, 'P'), disk = bytes_of(*ws, c.tiers, 'D');
        EXPECT_TRUE(st.gds);
        // Only pinned layers are copied; disk layers arrive by cuFile, once per step each.
        EXPECT_EQ(st.h2d_bytes, dev.copied_bytes());
        EXPECT_GE(st.h2d_bytes, steps * pinned);
        EXPECT_LE(st.h2d_bytes, steps * pinned + uint64_t(c.slots) * ws->plan().slot_bytes);
        EXPECT_GE(st.disk_bytes, steps * disk);
        EXPECT_LE(st.disk_bytes, steps * disk + uint64_t(c.slots) * ws->plan().slot_bytes);
        EXPECT_GT(st.disk_busy, 0);
        EXPECT_FALSE(dev.bad_source());
        EXPECT_GT(fake_->registered_reads.load(), 0);
        EXPECT_EQ(fake_->unregistered_reads.load(), 0);
        EXPECT_EQ(fake_->bad_reads.load(), 0);
        EXPECT_TRUE(told_.empty());

        TempPath trace("trace.json");
        ws->write_trace(trace.path);
        std::ifstream in(trace.path);
        const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        EXPECT_NE(json.find("\"gds read\""), std::string::npos);
        EXPECT_NE(json.find("cuFile into VRAM"), std::string::npos);
        // Measured before any step: cuFile into the slots.
        HostStreamDevice dev2(0);
        auto fresh = streamer(dev2, c.tiers, c.slots, options());
        const int before = fake_->reads;
        EXPECT_GT(fresh->measure_disk_gbs(1 << 20), 0.0);
        EXPECT_GT(fake_->reads.load(), before);
        expect_same(run(*fresh, 1), Logits(reference_.begin(), reference_.begin() + 2), "after measuring");
        ws.reset();
        fresh.reset();
        EXPECT_TRUE(fake_->regions.empty()) << "the slots stayed registered";
    }
}

TEST_F(Gds, SetupFallbacksUseODirectAndSayWhy) {
    struct Case {
        const CuFileApi* api;
        int driver_err, handle_err;
        const char* says;
    };
    for (const Case& c : {Case{&kFakeNoDriver, 5001, 0, "cuFileDriverOpen failed (cuFile error 5001, driver not "
                                                        "initialized): load the nvidia-fs kernel module"},
                          Case{&kFake, 0, 5008, "cuFileHandleRegister: cuFile error 5008"}}) {
        SCOPED_TRACE(c.says);
        fake_->driver_err = c.driver_err;
        fake_->handle_err = c.handle_err;
        HostStreamDevice dev(100);
        auto ws = streamer(dev, "VDPDDP", 2, options(c.api));
        EXPECT_FALSE(ws->gds());
        EXPECT_NE(ws->notices().find(c.says), std::string::npos) << ws->notices();
        EXPECT_NE(ws->notices().find("O_DIRECT into pinned memory instead"), std::string::npos) << ws->notices();
        EXPECT_NE(describe_plan(ws->plan(), PlanInput{}).find("read by O_DIRECT into pinned staging"),
                  std::string::npos);
        expect_same(run(*ws), reference_, "O_DIRECT after a refusal");
        const StreamStats st = ws->stats();
        EXPECT_FALSE(st.gds);
        EXPECT_GE(st.h2d_bytes, 5 * (bytes_of(*ws, "VDPDDP", 'P') + bytes_of(*ws, "VDPDDP", 'D')));
        EXPECT_EQ(fake_->reads.load(), 0);
    }
}

TEST_F(Gds, UnregisteredSlotsStillRead) {
    fake_->buf_err = 5036;
    HostStreamDevice dev(100);
    auto ws = streamer(dev, "DDPDDV", 2, options());
    ASSERT_TRUE(ws->gds());
    EXPECT_NE(ws->notices().find("cuFileBufRegister refused"), std::string::npos) << ws->notices();
    expect_same(run(*ws), reference_, "unregistered");
    EXPECT_EQ(fake_->registered_reads.load(), 0);
    EXPECT_GT(fake_->unregistered_reads.load(), 0);
    EXPECT_EQ(fake_->bad_reads.load(), 0);
}

TEST_F(Gds, AReadCuFileCannotDoFallsBackMidRun) {
    HostStreamDevice dev(100);
    auto ws = streamer(dev, "VDPDDP", 2, options());
    ASSERT_TRUE(ws->gds());
    expect_same(run(*ws), reference_, "before");
    fake_->fail_ret = -5030;  // CU_FILE_INTERNAL_ERROR
    fake_->fail_from = fake_->reads.load() + 3;
    expect_same(run(*ws), reference_, "through the fallback");
    EXPECT_FALSE(ws->gds());
    ASSERT_EQ(told_.size(), 1u);
    EXPECT_NE(told_[0].find("GPUDirect Storage read of '" + tp_->path), std::string::npos) << told_[0];
    EXPECT_NE(told_[0].find("cuFile error 5030"), std::string::npos) << told_[0];
    EXPECT_NE(told_[0].find("O_DIRECT into pinned staging from now on"), std::string::npos) << told_[0];
    EXPECT_NE(ws->notices().find(told_[0]), std::string::npos);
    EXPECT_NE(describe_plan(ws->plan(), PlanInput{}).find("read by O_DIRECT"), std::string::npos);
    const int reads = fake_->reads;
    expect_same(run(*ws), reference_, "after");
    EXPECT_EQ(fake_->reads.load(), reads) << "cuFile was used after the fallback";

    // A failure while measuring at load: the measurement is O_DIRECT's.
    told_.clear();
    HostStreamDevice dev2(0);
    auto fresh = streamer(dev2, "DDDPPV", 2, options());
    ASSERT_TRUE(fresh->gds());
    fake_->fail_from = 0;
    EXPECT_GT(fresh->measure_disk_gbs(1 << 20), 0.0);
    EXPECT_FALSE(fresh->gds());
    EXPECT_EQ(told_.size(), 1u);
    expect_same(run(*fresh), reference_, "measured, then O_DIRECT");
}

TEST_F(Gds, DiskErrorsStayErrors) {
    HostStreamDevice dev(100);
    auto ws = streamer(dev, "PDVDPD", 2, options());
    ASSERT_TRUE(ws->gds());
    fake_->fail_errno = EIO;
    fake_->fail_ret = -1;
    fake_->fail_from = 0;
    try {
        run(*ws);
        FAIL() << "no error";
    } catch (const GdsReadError& e) {
        FAIL() << "an I/O error taken for a cuFile limitation: " << e.what();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(tp_->path), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("check the disk"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(ws->gds());
    EXPECT_TRUE(told_.empty());
    // The disk heals: cuFile again, right answers again.
    fake_->fail_from = -1;
    expect_same(run(*ws), reference_, "after the disk error");
    EXPECT_TRUE(ws->gds());
}

}  // namespace
}  // namespace nt::mem
