// The weight streamer: a WeightSource that serves resident layers as they are and moves every
// other layer through a ring of K VRAM slots, one DMA per layer on a copy stream, while the
// compute stream runs the layers before it. Events order everything:
//   copy of streamed use g into slot g % K  waits for  the compute that released use g - K;
//   compute of use g                        waits for  copy g.
// The host never waits in the steady state: copies are enqueued as soon as their slot's release
// is recorded, continuing into the next step (its first layers arrive while this step's last
// layers and the output head run). Disk-tier layers are read ahead by a feeder thread into a
// ring of pinned staging buffers (O_DIRECT, several reads in flight); the host blocks only when
// a layer's read has not finished by the time its copy must be enqueued.
// With GPUDirect Storage (StreamOptions::gds) disk-tier layers skip staging and the copy: the
// feeder waits until the compute that released the layer's slot has run, then the reader threads
// cuFileRead the layer straight into the slot; compute waits for the read as it would for a copy.
// Where cuFile is missing or refuses, the staging path runs instead and notices() says why.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "memory/io_reader.h"
#include "memory/layer_blob.h"
#include "memory/planner.h"
#include "memory/stream_device.h"
#include "memory/trace.h"
#include "model/llama.h"

namespace nt::mem {

struct StreamOptions {
    ReaderOptions io;     // disk tier reads (O_DIRECT by default)
    bool trace = false;   // keep Chrome-trace boxes (write_trace)
    bool gds = false;     // read the disk tier with cuFile straight into VRAM where possible
    const CuFileApi* gds_api = nullptr;  // tests: these functions instead of libcufile's
    // Told one sentence when a fallback happens while running (a cuFile read that cuFile cannot
    // do); notices() keeps it too.
    std::function<void(const std::string&)> notify;
};

// Totals over a window (reset_stats() .. stats()).
struct StreamStats {
    int steps = 0;
    double wall = 0;  // seconds of the window
    uint64_t h2d_bytes = 0, disk_bytes = 0;  // h2d: copies only (cuFile reads are not copies)
    bool gds = false;                          // disk bytes went by cuFile straight into VRAM
    int copies = 0, reads = 0;
    double h2d_busy = 0;      // seconds the copy stream spent copying
    double disk_busy = 0;     // seconds at least one read was in flight
    double compute_busy = 0;  // seconds the compute stream spent in layers
    double host_wait = 0;     // seconds the host blocked on disk reads
};

class WeightStreamer : public WeightSource {
public:
    // `layers` holds every layer's views: device pointers for VRAM-tier layers, pointers into the
    // mapped file at `file_base` (of the file at `path`) for the others. Pins and fills the
    // pinned tier; throws nt::Error when memory cannot be had.
    WeightStreamer(StreamDevice& dev, const std::string& path, const uint8_t* file_base,
                   const std::vector<LayerWeights>& layers, const TierPlan& plan,
                   const StreamOptions& opt);
    ~WeightStreamer() override;
    WeightStreamer(const WeightStreamer&) = delete;
    WeightStreamer& operator=(const WeightStreamer&) = delete;

    const LayerWeights& acquire(int layer) override;
    void release(int layer) override;

    const TierPlan& plan() const { return plan_; }  // after any pinning fallback
    const std::vector<LayerBlob>& blobs() const { return blobs_; }
    // What fell back and why (O_DIRECT refused, memory that could not be pinned), one per line.
    const std::string& notices() const { return notices_; }
    bool direct_io() const { return reader_ ? reader_->direct() : false; }
    bool gds() const { return gds_; }  // disk-tier layers read by cuFile into the slots
    double fill_seconds() const { return fill_seconds_; }  // loading the pinned tier

    // Read bandwidth (GB/s) of the disk-tier layers with the configured reads in flight (cuFile
    // into the slots, or O_DIRECT into staging); 0 without a disk tier. Call before the first step.
    double measure_disk_gbs(uint64_t bytes = uint64_t(1) << 30);

    FileReader* reader_for_testing() { return reader_.get(); }  // fault injection

    void reset_stats();  // drains the device, starts a new window
    StreamStats stats();  // drains the device, totals of the window so far
    // Writes the Chrome trace of everything recorded so far; throws nt::Error.
    void write_trace(const std::string& path);

private:
    struct Layer {
        Tier tier = Tier::Vram;
        LayerWeights views;  // device views (VRAM) or views into the mapped file
        void* pinned = nullptr;
        int spos = -1, dpos = -1;  // index among the streamed / disk-tier layers
    };
    struct ReadSlot {
        int64_t r = -1;
        FileReader::Ticket ticket = 0;
    };
    struct Timing {  // a box between two device marks, resolved later
        int m0 = -1, m1 = -1;
        double t0 = -1, t1 = -1;
        int lane = 0, layer = 0;
        uint64_t bytes = 0;
    };

    int ev_copied(int slot) const { return slot; }
    int ev_released(int slot) const { return K_ + slot; }
    int ev_staging_free(int s) const { return 2 * K_ + s; }
    int64_t read_index(int64_t g) const;  // the disk read of streamed use g
    int64_t use_of_read(int64_t r) const;  // and back
    char* slot_ptr(int slot) const { return slots_ + size_t(slot) * slot_bytes_; }
    const char* disk_path() const;
    void restart(int layer);  // drains everything, restarts the pipeline at `layer`
    void stop_feeder();
    void leave_gds(const std::string& why);  // from now on the staging path; stops the feeder
    double measure_reads(uint64_t bytes);
    void feeder(int64_t r0);
    void pump(int64_t need);  // enqueues copies in order; blocks only for use `need`
    void issue(int64_t g);
    void resolve_timings(bool all);
    void collect_reads();
    void add_box(const std::string& name, const char* cat, int lane, double t0, double t1,
                 uint64_t bytes);

    StreamDevice& dev_;
    TierPlan plan_;
    StreamOptions opt_;
    std::vector<Layer> layers_;
    std::vector<LayerBlob> blobs_;
    std::vector<int> streamed_, disk_;
    int L_ = 0, N_ = 0, ND_ = 0, K_ = 0, S_ = 0;
    char* slots_ = nullptr;
    uint64_t slot_bytes_ = 0;
    std::vector<void*> staging_;
    std::unique_ptr<FileReader> reader_;
    bool gds_ = false;  // changes only while the feeder is stopped
    int R_ = 0;         // read ring: staging buffers (S_), or slots (K_) with cuFile
    std::string notices_;
    double fill_seconds_ = 0;

    // Pipeline position (host thread only).
    bool started_ = false, holding_ = false, broken_ = false;
    int cursor_ = 0;        // the layer expected next
    int64_t pass_ = 0;      // forward passes begun
    int64_t issued_ = 0;    // copies enqueued for every use < issued_
    int64_t released_ = 0;  // every use < released_ released by the compute stream
    int64_t cur_g_ = -1;    // the streamed use being computed
    LayerWeights current_;
    int cur_mark_ = -1;

    // Feeder thread and its hand-off.
    std::thread feeder_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    int64_t feed_base_ = 0;    // first read of this run of the feeder
    int64_t copied_reads_ = 0;  // copies enqueued for every read < this
    int64_t released_shared_ = 0;  // released_, for the feeder (cuFile reads into slots)
    int64_t feed_use0_ = 0;        // first use of this run of the feeder
    std::vector<ReadSlot> ring_;
    std::exception_ptr feeder_error_;

    // Stats and trace.
    StreamStats st_;
    double window_t0_ = 0;
    std::vector<Timing> timings_;
    TraceWriter trace_;
};

}  // namespace nt::mem
