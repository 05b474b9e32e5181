// Layer blobs and the file reader: layouts that keep tensors' alignment, O_DIRECT reads with
// several requests in flight, the buffered fallback (tmpfs refuses O_DIRECT), and every way a
// read can go wrong (short reads, EIO, a truncated file, a file changed underneath) ending in a
// clear error instead of garbage. Also the Chrome trace, validated by Python's json module.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <random>

#include "core/error.h"
#include "memory/io_reader.h"
#include "memory/layer_blob.h"
#include "memory/sysinfo.h"
#include "memory/trace.h"
#include "test_memory_util.h"

namespace nt::mem {
namespace {

using testing_mem::TempPath;

std::vector<uint8_t> write_random_file(const std::string& path, size_t n, uint32_t seed) {
    std::vector<uint8_t> data(n);
    std::mt19937 rng(seed);
    for (auto& b : data) b = uint8_t(rng());
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), std::streamsize(n));
    return data;
}

struct Aligned {
    uint8_t* p;
    explicit Aligned(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, align_up(n, 4096)))) {}
    Aligned(Aligned&& o) noexcept : p(o.p) { o.p = nullptr; }
    Aligned(const Aligned&) = delete;
    ~Aligned() { std::free(p); }
};

std::string error_of(FileReader& r, FileReader::Ticket t) {
    try {
        r.wait(t);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// ---- layouts

TEST(MemoryLayerBlob, ContiguousTensorsMakeOneAlignedExtent) {
    std::array<TensorRange, kLayerTensors> t;
    uint64_t off = 1000 * 4096 + 96;  // 32-byte aligned, not 4 KiB
    for (int i = 0; i < kLayerTensors; i++) {
        t[size_t(i)] = {off, uint64_t(5000 + 64 * i)};
        off = align_up(off + t[size_t(i)].nbytes, 32);
    }
    LayerBlob b = layout_layer(t);
    ASSERT_EQ(b.extents.size(), 1u);
    EXPECT_EQ(b.extents[0].file_offset, 1000u * 4096);
    EXPECT_EQ(b.extents[0].blob_offset, 0u);
    EXPECT_EQ(b.bytes % kBlobAlign, 0u);
    EXPECT_EQ(b.bytes, align_up(off, 4096) - 1000 * 4096);
    for (int i = 0; i < kLayerTensors; i++) {
        // Same position as in the file, relative to the extent; alignment kept modulo 4 KiB.
        EXPECT_EQ(b.tensor_offset[size_t(i)], t[size_t(i)].file_offset - 1000 * 4096);
        EXPECT_EQ(b.tensor_offset[size_t(i)] % 32, 0u);
    }
}

TEST(MemoryLayerBlob, ScatteredTensorsMakeSeveralExtentsInFileOrder) {
    std::array<TensorRange, kLayerTensors> t;
    for (int i = 0; i < kLayerTensors; i++) t[size_t(i)] = {uint64_t(i) * 4096 + 32, 100};
    t[4] = {uint64_t(100) << 20, 8192};  // far away: its own extent
    LayerBlob b = layout_layer(t, /*merge_gap=*/4096);
    ASSERT_EQ(b.extents.size(), 2u);
    EXPECT_EQ(b.extents[0].file_offset, 0u);
    EXPECT_EQ(b.extents[1].file_offset, uint64_t(100) << 20);
    EXPECT_EQ(b.extents[1].blob_offset, b.extents[0].length);
    EXPECT_EQ(b.tensor_offset[4], b.extents[0].length);
    EXPECT_EQ(b.payload, 8u * 100 + 8192);
    EXPECT_EQ(b.bytes, b.extents[0].length + b.extents[1].length);
}

TEST(MemoryLayerBlob, MisalignedTensorIsAClearError) {
    std::array<TensorRange, kLayerTensors> t;
    for (int i = 0; i < kLayerTensors; i++) t[size_t(i)] = {uint64_t(i) * 256, 64};
    t[3].file_offset = 3 * 256 + 8;
    try {
        layout_layer(t);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not 16-byte aligned"), std::string::npos) << e.what();
    }
}

// ---- reader

// Extents over a file of `size` bytes, including one whose 4 KiB-rounded end passes EOF.
std::vector<FileExtent> sample_extents(uint64_t size) {
    std::vector<FileExtent> e;
    e.push_back({0, 3 * 4096, 0});
    e.push_back({20 * 4096, 64 * 4096, 3 * 4096});
    const uint64_t last = align_down(size - 1, 4096) - 4096;
    e.push_back({last, align_up(size, 4096) - last, 67 * 4096});
    return e;
}

void expect_extents_read(const uint8_t* got, const std::vector<uint8_t>& file, const std::vector<FileExtent>& ext) {
    for (const FileExtent& e : ext)
        for (uint64_t i = 0; i < e.length; i++) {
            const uint8_t want = e.file_offset + i < file.size() ? file[size_t(e.file_offset + i)] : 0;
            ASSERT_EQ(got[e.blob_offset + i], want) << "file offset " << e.file_offset + i;
        }
}

TEST(MemoryReader, DirectReadsManyInFlight) {
    TempPath tp("data.bin");
    const size_t size = 5 * 1000 * 1000 + 123;  // not a multiple of 4 KiB
    std::vector<uint8_t> file = write_random_file(tp.path, size, 1);
    ReaderOptions o;
    o.threads = 4;
    o.chunk_bytes = 16 * 1024;  // many chunks per extent
    FileReader r(tp.path, o);
    const std::string fs = filesystem_name(tp.dir);
    if (fs == "ext4" || fs == "xfs") {
        EXPECT_TRUE(r.direct()) << r.fallback_reason();
    }
    r.set_recording(true);
    const auto ext = sample_extents(size);
    std::vector<Aligned> bufs;
    std::vector<FileReader::Ticket> tickets;
    for (int i = 0; i < 6; i++) {
        bufs.emplace_back(68 * 4096 + align_up(size, 4096));
        std::memset(bufs.back().p, 0xAB, 68 * 4096 + 4096);
        tickets.push_back(r.submit(ext, bufs.back().p));
    }
    for (size_t i = 0; i < tickets.size(); i++) {
        r.wait(tickets[i]);
        expect_extents_read(bufs[i].p, file, ext);
    }
    const auto rec = r.take_records();
    EXPECT_EQ(rec.size(), 6u * (1 + 16 + 1));  // one pread per chunk, chunks per extent
    std::set<int> threads;
    for (const auto& x : rec) {
        EXPECT_LE(x.t0, x.t1);
        threads.insert(x.thread);
    }
    EXPECT_GT(threads.size(), 1u);  // several requests were in flight
}

TEST(MemoryReader, RefusedODirectFallsBackToBufferedReads) {
    TempPath tp("data.bin");
    const size_t size = 300 * 1000;
    std::vector<uint8_t> file = write_random_file(tp.path, size, 2);
    // What tmpfs before Linux 6.6 and many network file systems do: open(O_DIRECT) -> EINVAL.
    ReaderOptions o;
    o.open_for_testing = [](const char* p, int flags) -> int {
        if (flags & O_DIRECT) {
            errno = EINVAL;
            return -1;
        }
        return ::open(p, flags);
    };
    FileReader r(tp.path, o);
    EXPECT_FALSE(r.direct());
    EXPECT_NE(r.fallback_reason().find("refuses O_DIRECT (Invalid argument)"), std::string::npos) << r.fallback_reason();
    EXPECT_NE(r.fallback_reason().find(filesystem_name(tp.dir)), std::string::npos) << r.fallback_reason();
    const auto ext = sample_extents(size);
    Aligned buf(68 * 4096 + align_up(size, 4096));
    r.wait(r.submit(ext, buf.p));
    expect_extents_read(buf.p, file, ext);
}

TEST(MemoryReader, TmpfsReadsCorrectlyWhateverItsODirectSupport) {
    if (filesystem_name("/dev/shm") != "tmpfs") GTEST_SKIP() << "/dev/shm is not tmpfs here";
    TempPath tp("data.bin", "/dev/shm");
    const size_t size = 300 * 1000;
    std::vector<uint8_t> file = write_random_file(tp.path, size, 2);
    FileReader r(tp.path);
    // tmpfs takes O_DIRECT since Linux 6.6 and refuses it before; either way the bytes are right.
    if (!r.direct()) {
        EXPECT_NE(r.fallback_reason().find("tmpfs"), std::string::npos) << r.fallback_reason();
    }
    const auto ext = sample_extents(size);
    Aligned buf(68 * 4096 + align_up(size, 4096));
    r.wait(r.submit(ext, buf.p));
    expect_extents_read(buf.p, file, ext);
}

TEST(MemoryReader, EinvalOnDirectReadsSwitchesToBuffered) {
    TempPath tp("data.bin");
    const size_t size = 400 * 1000;
    std::vector<uint8_t> file = write_random_file(tp.path, size, 3);
    FileReader r(tp.path);
    if (!r.direct()) GTEST_SKIP() << "no O_DIRECT here: " << r.fallback_reason();
    std::atomic<int> calls{0};
    r.set_pread_for_testing([&](int fd, void* b, size_t n, off_t off) -> ssize_t {
        if (calls++ == 0) {
            errno = EINVAL;
            return -1;
        }
        return ::pread(fd, b, n, off);
    });
    const auto ext = sample_extents(size);
    Aligned buf(68 * 4096 + align_up(size, 4096));
    r.wait(r.submit(ext, buf.p));
    expect_extents_read(buf.p, file, ext);
    EXPECT_FALSE(r.direct());
    EXPECT_NE(r.fallback_reason().find("EINVAL"), std::string::npos) << r.fallback_reason();
}

TEST(MemoryReader, ShortReadsAreCompleted) {
    TempPath tp("data.bin");
    const size_t size = 700 * 1000;
    std::vector<uint8_t> file = write_random_file(tp.path, size, 4);
    ReaderOptions o;
    o.threads = 3;
    o.chunk_bytes = 64 * 1024;
    FileReader r(tp.path, o);
    // At most 1000 bytes per call: every chunk needs many calls, most at unaligned offsets.
    r.set_pread_for_testing([](int fd, void* b, size_t n, off_t off) { return ::pread(fd, b, std::min<size_t>(n, 1000), off); });
    const auto ext = sample_extents(size);
    Aligned buf(68 * 4096 + align_up(size, 4096));
    r.wait(r.submit(ext, buf.p));
    expect_extents_read(buf.p, file, ext);
}

TEST(MemoryReader, EioIsAClearErrorNamingFileAndOffset) {
    TempPath tp("model.gguf");
    const size_t size = 512 * 1024;
    write_random_file(tp.path, size, 5);
    ReaderOptions o;
    o.chunk_bytes = 64 * 1024;
    FileReader r(tp.path, o);
    r.set_pread_for_testing([](int fd, void* b, size_t n, off_t off) -> ssize_t {
        if (off <= 131072 && off + off_t(n) > 131072) {
            errno = EIO;
            return -1;
        }
        return ::pread(fd, b, n, off);
    });
    Aligned buf(size);
    const std::string e = error_of(r, r.submit({{0, size, 0}}, buf.p));
    EXPECT_NE(e.find("model.gguf"), std::string::npos) << e;
    EXPECT_NE(e.find("offset 131072"), std::string::npos) << e;
    EXPECT_NE(e.find("Input/output error"), std::string::npos) << e;
    // The reader stays usable for ranges that read fine.
    r.set_pread_for_testing([](int fd, void* b, size_t n, off_t off) { return ::pread(fd, b, n, off); });
    EXPECT_EQ(error_of(r, r.submit({{0, 65536, 0}}, buf.p)), "(no error)");
}

TEST(MemoryReader, EarlyEndOfFileIsATruncationError) {
    TempPath tp("model.gguf");
    const size_t size = 256 * 1024;
    write_random_file(tp.path, size, 6);
    FileReader r(tp.path);
    // The file shrinks after it was opened: reads past the new end return 0.
    ASSERT_EQ(::truncate(tp.path.c_str(), 100 * 1024), 0);
    Aligned buf(size);
    const std::string e = error_of(r, r.submit({{0, size, 0}}, buf.p));
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("changed") != std::string::npos) << e;
    // And a pread that reports EOF early without the file changing says truncated, with the offset.
    TempPath tp2("model2.gguf");
    write_random_file(tp2.path, size, 7);
    FileReader r2(tp2.path);
    r2.set_pread_for_testing([](int fd, void* b, size_t n, off_t off) -> ssize_t {
        return off >= 65536 ? 0 : ::pread(fd, b, std::min<size_t>(n, size_t(65536 - off)), off);
    });
    const std::string e2 = error_of(r2, r2.submit({{0, size, 0}}, buf.p));
    EXPECT_NE(e2.find("ended at byte 65536"), std::string::npos) << e2;
    EXPECT_NE(e2.find("truncated"), std::string::npos) << e2;
}

TEST(MemoryReader, FileChangedUnderneathIsDetected) {
    TempPath tp("model.gguf");
    const size_t size = 256 * 1024;
    write_random_file(tp.path, size, 8);
    FileReader r(tp.path);
    Aligned buf(size);
    r.wait(r.submit({{0, 65536, 0}}, buf.p));
    // Rewrite some bytes in place (same size), with a new modification time.
    {
        int fd = ::open(tp.path.c_str(), O_WRONLY);
        ASSERT_GE(fd, 0);
        const char junk[16] = "changed!";
        ASSERT_EQ(::pwrite(fd, junk, sizeof junk, 4096), ssize_t(sizeof junk));
        struct timespec ts[2] = {{0, UTIME_OMIT}, {1234567890, 0}};
        ASSERT_EQ(::futimens(fd, ts), 0);
        ::close(fd);
    }
    const std::string e = error_of(r, r.submit({{0, 65536, 0}}, buf.p));
    EXPECT_NE(e.find("changed while it was being read"), std::string::npos) << e;
}

TEST(MemoryReader, MissingFileIsAClearError) {
    try {
        FileReader r("/nonexistent/dir/model.gguf");
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot open '/nonexistent/dir/model.gguf'"), std::string::npos);
    }
}

// ---- sysinfo

TEST(MemorySysinfo, MeminfoAndPcieLinkFromFakeFiles) {
    TempPath tp("meminfo");
    std::ofstream(tp.path) << "MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:   120000000 kB\n";
    EXPECT_EQ(mem_available(tp.path), uint64_t(120000000) * 1024);
    EXPECT_EQ(mem_total(tp.path), uint64_t(131072000) * 1024);
    EXPECT_EQ(default_ram_budget(uint64_t(100) << 30), uint64_t(90) << 30);
    EXPECT_EQ(default_ram_budget(uint64_t(10) << 30), uint64_t(8) << 30);  // at least 2 GiB margin
    EXPECT_EQ(default_ram_budget(uint64_t(1) << 30), 0u);

    const std::string dev = tp.dir + "/0000:3b:00.0";
    std::filesystem::create_directories(dev);
    std::ofstream(dev + "/current_link_speed") << "16.0 GT/s PCIe\n";
    std::ofstream(dev + "/current_link_width") << "8\n";
    std::ofstream(dev + "/max_link_speed") << "32.0 GT/s PCIe\n";
    std::ofstream(dev + "/max_link_width") << "16\n";
    PcieLink l = read_pcie_link("00000000:3B:00.0", tp.dir);  // CUDA's 8-digit domain, upper case
    ASSERT_TRUE(l.known);
    EXPECT_EQ(l.gen(), 4);
    EXPECT_EQ(l.width, 8);
    EXPECT_EQ(l.max_gen(), 5);
    EXPECT_EQ(l.max_width, 16);
    EXPECT_NEAR(l.bandwidth_gbs(), 16.0 * 128 / 130 / 8 * 8, 1e-9);
    EXPECT_NEAR(l.max_bandwidth_gbs(), 63.015, 0.01);
    EXPECT_EQ(pcie_gen_of(2.5), 1);
    EXPECT_EQ(pcie_gen_of(8.0), 3);
    EXPECT_NEAR(pcie_lane_gbs(5.0), 0.5, 1e-12);
    EXPECT_FALSE(read_pcie_link("0000:ff:00.0", tp.dir).known);
}

// ---- trace

TEST(MemoryTrace, ChromeTraceIsValidJson) {
    TraceWriter t;
    t.name_lane(kLaneCompute, "compute \"stream\"");
    t.name_lane(kLaneDisk + 1, "disk reader 1");
    t.add("layer 3", "compute", kLaneCompute, 1.0, 1.0005);
    t.add("copy\tlayer \\4", "h2d", kLaneCopy, 1.0001, 1.01, {{"MiB", 512}, {"GB/s", 53.7}});
    t.add("read", "disk", kLaneDisk + 1, 0.5, 0.25);  // reversed: clamped to zero length
    TempPath tp("trace.json");
    t.write(tp.path);
    const std::string script =
        "import json,sys\n"
        "d=json.load(open(sys.argv[1]))\n"
        "ev=d['traceEvents']\n"
        "x=[e for e in ev if e['ph']=='X']\n"
        "assert len(x)==3, x\n"
        "assert all(e['dur']>=0 and 'ts' in e and 'tid' in e for e in x)\n"
        "c=[e for e in x if e['name']=='copy\\tlayer \\\\4'][0]\n"
        "assert c['args']['MiB']==512 and abs(c['args']['GB/s']-53.7)<1e-9\n"
        "assert abs(c['ts']-1000100.0)<1e-3 and abs(c['dur']-9900.0)<1e-3\n"
        "names=[e['args']['name'] for e in ev if e['name']=='thread_name']\n"
        "assert 'compute \"stream\"' in names, names\n";
    TempPath sp("check.py");
    std::ofstream(sp.path) << script;
    if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    EXPECT_EQ(std::system(("python3 " + sp.path + " " + tp.path).c_str()), 0) << t.json();
}

}  // namespace
}  // namespace nt::mem
