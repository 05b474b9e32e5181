// doctor: measures every link the tiered-memory engine depends on (GPU, PCIe generation and
// width, pinned and pageable copy bandwidth, O_DIRECT reads of the model's file system, how much
// memory can be pinned, GPUDirect Storage) and says what to change where something is slow.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/select/select.h"
#include "cli/common.h"
#include "core/error.h"
#include "memory/clock.h"
#include "memory/gds_probe.h"
#include "memory/io_reader.h"
#include "memory/planner.h"
#include "memory/sysinfo.h"
#ifdef NT_HAVE_CUDA
#include "backend/cuda/stream_device.h"
#endif

namespace nt::cli {

namespace {

std::string gib(uint64_t b) { return mem::format_gib(b); }

std::string limit_text(uint64_t b) {
    return b == ~uint64_t(0) ? std::string("unlimited") : strfmt("%.1f MiB", double(b) / double(1 << 20));
}

struct DiskResult {
    int in_flight = 0;
    size_t chunk = 0;
    double gbs = 0;
};

// Reads `bytes` of the file from `start` with `threads` reads of `chunk` bytes in flight.
DiskResult read_test(const std::string& path, uint64_t start, uint64_t bytes, int threads, size_t chunk, bool direct,
                     bool* is_direct, std::string* why) {
    mem::ReaderOptions o;
    o.threads = threads;
    o.chunk_bytes = chunk;
    o.direct = direct;
    mem::FileReader r(path, o);
    *is_direct = r.direct();
    *why = r.fallback_reason();
    const uint64_t per = mem::align_up(std::max<uint64_t>(bytes / uint64_t(threads), chunk), mem::kBlobAlign);
    std::vector<void*> bufs;
    std::vector<mem::FileReader::Ticket> t;
    const double t0 = mem::now_seconds();
    uint64_t total = 0;
    for (int i = 0; i < threads; i++) {
        const uint64_t off = mem::align_down(start + uint64_t(i) * per, mem::kBlobAlign);
        if (off >= r.size()) break;
        const uint64_t len = std::min<uint64_t>(per, mem::align_up(r.size() - off, mem::kBlobAlign));
        void* b = std::aligned_alloc(mem::kBlobAlign, len);
        if (!b) fail("out of host memory for the disk test.");
        bufs.push_back(b);
        t.push_back(r.submit({{off, len, 0}}, b));
        total += len;
    }
    std::string err;
    for (auto x : t) {
        try {
            r.wait(x);
        } catch (const Error& e) {
            if (err.empty()) err = e.what();
        }
    }
    const double dt = mem::now_seconds() - t0;
    for (void* b : bufs) std::free(b);
    if (!err.empty()) throw Error(err);
    return {threads, chunk, dt > 0 ? double(total) / dt / 1e9 : 0};
}

}  // namespace

int cmd_doctor(int argc, char** argv) {
    std::vector<Opt> opts = {
        {"-m,--model", "FILE", "model file whose file system to test (disk reads)", ""},
        {"--read", "SIZE", "bytes to read per disk test", "1G"},
        {"--pin", "SIZE", "host memory to try pinning", "4G"},
        {"--gpu", "N", "CUDA device to test", "0"},
    };
    Args a("doctor", opts);
    a.set_summary("Measures the links tiered memory depends on and says what to change where something is slow.");
    if (!a.parse(argc, argv, 2)) return 0;
    std::vector<std::string> advice;
    const uint64_t read_bytes = a.bytes("--read", uint64_t(1) << 30);

    // ---- host memory
    const uint64_t total = mem::mem_total(), avail = mem::mem_available(), memlock = mem::memlock_limit();
    std::printf("host memory: %s total, %s available; default --ram-budget %s\n", gib(total).c_str(),
                gib(avail).c_str(), gib(mem::default_ram_budget(avail)).c_str());
    std::printf("locked-memory limit (RLIMIT_MEMLOCK): %s\n", limit_text(memlock).c_str());

    // ---- GPU and PCIe
    double h2d = 0;
#ifdef NT_HAVE_CUDA
    if (cuda_available()) {
        const int dev = a.integer("--gpu", 0);
        const uint64_t pin_bytes = a.bytes("--pin", uint64_t(4) << 30);
        CudaLinkReport r = cuda_measure_links(dev, size_t(256) << 20);
        h2d = r.h2d_pinned_gbs;
        std::printf("GPU %d: %s, %s free, %d copy engines, PCI %s\n", dev, r.gpu.c_str(), gib(r.free_mem).c_str(),
                    r.async_engines, r.pci_bus_id.c_str());
        // Read after the copies: links train down when idle and up under load.
        const mem::PcieLink l = mem::read_pcie_link(r.pci_bus_id);
        if (l.known) {
            std::printf("PCIe link: Gen%d x%d (%.1f GB/s per direction); the GPU supports Gen%d x%d (%.1f GB/s)\n",
                        l.gen(), l.width, l.bandwidth_gbs(), l.max_gen(), l.max_width, l.max_bandwidth_gbs());
            if (l.gen() < l.max_gen() || l.width < l.max_width)
                advice.push_back(strfmt("the PCIe link runs at Gen%d x%d but the GPU supports Gen%d x%d: put the card "
                                        "in a x16 slot wired to the CPU, check risers and the BIOS PCIe setting "
                                        "(streamed layers move at the link's speed)",
                                        l.gen(), l.width, l.max_gen(), l.max_width));
        } else {
            std::printf("PCIe link: unknown (no /sys/bus/pci/devices entry for %s)\n", r.pci_bus_id.c_str());
        }
        std::printf("copies (256 MiB): pinned H2D %.1f GB/s, pinned D2H %.1f GB/s, both ways %.1f GB/s, pageable "
                    "H2D %.1f GB/s; 1 MiB pinned H2D %.1f GB/s\n",
                    r.h2d_pinned_gbs, r.d2h_pinned_gbs, r.both_ways_gbs, r.h2d_pageable_gbs, r.h2d_small_gbs);
        if (l.known && r.h2d_pinned_gbs < 0.7 * l.bandwidth_gbs())
            advice.push_back(strfmt("pinned H2D reaches %.0f%% of what a Gen%d x%d link carries: look for a PCIe "
                                    "switch or a slot on the other CPU socket (numactl --cpunodebind), and IOMMU "
                                    "settings",
                                    100.0 * r.h2d_pinned_gbs / l.bandwidth_gbs(), l.gen(), l.width));
        if (r.h2d_pageable_gbs < 0.5 * r.h2d_pinned_gbs)
            std::printf("  (pageable copies run at %.0f%% of pinned: the engine streams from pinned memory only)\n",
                        100.0 * r.h2d_pageable_gbs / std::max(r.h2d_pinned_gbs, 1e-9));
        const double pin_s = cuda_try_pin(dev, pin_bytes);
        if (pin_s < 0) {
            std::printf("pinning %s: refused\n", gib(pin_bytes).c_str());
            advice.push_back(strfmt("the system refused to pin %s: free memory, or raise the locked-memory limit "
                                    "(ulimit -l unlimited, or memlock in /etc/security/limits.conf); without "
                                    "pinned memory, streamed layers come from disk through small staging buffers",
                                    gib(pin_bytes).c_str()));
        } else {
            std::printf("pinning %s: %.2f s (%.1f GB/s; a --ram-budget of 48G takes about %.0f s to pin at load)\n",
                        gib(pin_bytes).c_str(), pin_s, double(pin_bytes) / pin_s / 1e9,
                        48.0 * double(1ull << 30) / (double(pin_bytes) / pin_s));
        }
    } else {
        std::printf("GPU: none usable (no driver, no GPU, or compute capability below 8.0)\n");
    }
#else
    std::printf("GPU: this build has no CUDA backend (rebuild with -DNT_CUDA=ON)\n");
#endif

    // ---- disk
    double best_disk = 0;
    uint64_t untouched = 0, disk_len = 0;  // a part of the file no disk test read
    if (a.has("--model")) {
        const std::string path = a.str("--model");
        bool direct = false;
        std::string why;
        mem::FileReader probe(path);
        const uint64_t size = probe.size();
        std::printf("model file system: %s (%s)\n", mem::filesystem_name(path).c_str(), path.c_str());
        // Different parts of the file per test, so no test reads what the drive just cached.
        const uint64_t part = size / 4;
        const uint64_t len = std::min<uint64_t>(read_bytes, std::max<uint64_t>(part, mem::kBlobAlign));
        std::vector<DiskResult> res;
        res.push_back(read_test(path, 0, len, 1, size_t(4) << 20, true, &direct, &why));
        if (!direct) {
            std::printf("O_DIRECT: refused (%s)\n", why.c_str());
            advice.push_back("the model's file system refuses O_DIRECT, so disk-tier layers go through the page "
                             "cache: move the model to an ext4 or xfs file system on NVMe");
        }
        int k = 1;
        for (int threads : {4, 8, 16}) res.push_back(read_test(path, (k++ % 4) * part, len, threads, size_t(8) << 20, true, &direct, &why));
        DiskResult best = res[0];
        for (const DiskResult& r : res) {
            std::printf("%s read: %2d in flight x %zu MiB: %.2f GB/s\n", direct ? "O_DIRECT" : "buffered", r.in_flight,
                        r.chunk >> 20, r.gbs);
            if (r.gbs > best.gbs) best = r;
        }
        best_disk = best.gbs;
        untouched = part / 2;
        disk_len = len;
        if (best.in_flight != 8 && best.gbs > 1.15 * res[2].gbs)
            advice.push_back(strfmt("disk reads are fastest with %d in flight: pass --io-threads %d", best.in_flight,
                                    best.in_flight));
        if (best.gbs < 1.0)
            advice.push_back(strfmt("the disk reads at %.2f GB/s: every GiB of layers on the disk tier costs %.1f s "
                                    "per token; give more RAM (--ram-budget) or use a faster NVMe drive",
                                    best.gbs, 1.0737 / best.gbs));
        if (h2d > 0 && best.gbs > 0)
            std::printf("a token streaming G GiB from disk and P GiB from pinned RAM takes at least max(G x %.2f s, "
                        "(G+P) x %.3f s)\n",
                        1.0737 / best.gbs, 1.0737 / h2d);
    } else {
        std::printf("disk: pass -m MODEL to measure reads on the model's file system\n");
    }

    // ---- GPUDirect Storage
    const mem::GdsProbe g = mem::probe_gds();
    std::printf("GPUDirect Storage: %s\n", g.detail.c_str());
#ifdef NT_HAVE_CUDA
    if (g.driver && disk_len && cuda_available()) {
        std::string why;
        const double gds = cuda_measure_gds(a.integer("--gpu", 0), a.str("--model"), untouched, disk_len, 8, &why);
        if (gds < 0) {
            std::printf("cuFile read of the model: not possible (%s)\n", why.c_str());
        } else {
            std::printf("cuFile read into GPU memory: 8 in flight x 8 MiB: %.2f GB/s (O_DIRECT into host memory: "
                        "%.2f GB/s)%s%s\n",
                        gds, best_disk, why.empty() ? "" : "; ", why.c_str());
            if (gds > 1.1 * best_disk)
                advice.push_back(strfmt("cuFile reads the model at %.2f GB/s against O_DIRECT's %.2f: pass --gds "
                                        "when layers stream from disk",
                                        gds, best_disk));
            else if (gds < 0.9 * best_disk)
                advice.push_back(strfmt("cuFile reads the model at %.2f GB/s, slower than O_DIRECT's %.2f "
                                        "(compatibility mode without nvidia-fs?): leave --gds off",
                                        gds, best_disk));
        }
    }
#endif

    std::printf("\n");
    if (advice.empty()) {
        std::printf("nothing to change: every link measured runs near what it should.\n");
    } else {
        std::printf("what to change:\n");
        for (const std::string& s : advice) std::printf("  - %s.\n", s.c_str());
    }
    return 0;
}

}  // namespace nt::cli
