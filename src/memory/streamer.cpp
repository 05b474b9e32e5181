#include "memory/streamer.h"

#include <algorithm>

#include "core/error.h"
#include "memory/clock.h"

namespace nt::mem {

namespace {

// Recounts layers and bytes per tier after layers moved between tiers.
void recount(TierPlan& p, const std::vector<LayerBlob>& blobs) {
    uint64_t vram_bytes = p.bytes[0];
    int vram_layers = p.layers[0];
    for (int t = 1; t < 3; t++) p.layers[t] = 0, p.bytes[t] = 0;
    for (size_t i = 0; i < p.tier.size(); i++) {
        const int t = int(p.tier[i]);
        if (t == 0) continue;
        p.layers[t]++;
        p.bytes[t] += blobs[i].bytes;
    }
    p.layers[0] = vram_layers;
    p.bytes[0] = vram_bytes;
    p.h2d_per_step = p.bytes[1] + p.bytes[2];
    p.disk_per_step = p.bytes[2];
}

}  // namespace

WeightStreamer::WeightStreamer(StreamDevice& dev, const std::string& path, const uint8_t* file_base,
                               const std::vector<LayerWeights>& layers, const TierPlan& plan,
                               const StreamOptions& opt)
    : dev_(dev), plan_(plan), opt_(opt) {
    L_ = int(layers.size());
    if (L_ == 0 || plan.tier.size() != layers.size())
        fail("weight streamer: a plan for %zu layers given %d layers.", plan.tier.size(), L_);
    layers_.resize(size_t(L_));
    blobs_.resize(size_t(L_));
    try {
        uint64_t demoted = 0;
        int n_demoted = 0;
        for (int i = 0; i < L_; i++) {
            Layer& ly = layers_[size_t(i)];
            ly.tier = plan.tier[size_t(i)];
            ly.views = layers[size_t(i)];
            if (ly.tier == Tier::Vram) continue;
            blobs_[size_t(i)] = layout_layer(layer_ranges(ly.views, file_base));
            if (ly.tier == Tier::Pinned) {
                ly.pinned = dev_.alloc_pinned(blobs_[size_t(i)].bytes);
                if (!ly.pinned) {  // the system will not lock more: read this layer from disk
                    ly.tier = Tier::Disk;
                    plan_.tier[size_t(i)] = Tier::Disk;
                    demoted += blobs_[size_t(i)].bytes;
                    n_demoted++;
                }
            }
        }
        if (n_demoted)
            notices_ += strfmt(
                "could not pin %s of host memory for %d layers (the system refused to lock more); "
                "they are read from disk instead: raise the locked-memory limit (ulimit -l) or "
                "lower --ram-budget\n",
                format_gib(demoted).c_str(), n_demoted);
        for (int i = 0; i < L_; i++) {
            Layer& ly = layers_[size_t(i)];
            if (ly.tier == Tier::Vram) continue;
            ly.spos = int(streamed_.size());
            streamed_.push_back(i);
            slot_bytes_ = std::max(slot_bytes_, blobs_[size_t(i)].bytes);
            if (ly.tier == Tier::Disk) {
                ly.dpos = int(disk_.size());
                disk_.push_back(i);
            }
        }
        N_ = int(streamed_.size());
        ND_ = int(disk_.size());
        K_ = N_ ? std::max(1, plan.slots) : 0;
        plan_.slots = K_;
        plan_.slot_bytes = slot_bytes_;
        if (N_) slots_ = static_cast<char*>(dev_.alloc_device(size_t(K_) * slot_bytes_, "the streaming slots"));
        if (ND_) {
            S_ = plan.staging > 0 ? plan.staging : kDefaultStaging;
            // Sized for any streamed layer: a pinned layer may have to move to disk below.
            const uint64_t stage_bytes = slot_bytes_;
            // Staging comes first: when the system will not pin it all, pinned layers give
            // their memory back (and are read from disk) until it fits.
            for (;;) {
                for (int s = int(staging_.size()); s < S_; s++) {
                    void* p = dev_.alloc_pinned(stage_bytes);
                    if (!p) break;
                    staging_.push_back(p);
                }
                if (int(staging_.size()) == S_) break;
                int victim = -1;
                for (int i = 0; i < L_; i++)
                    if (layers_[size_t(i)].tier == Tier::Pinned) victim = i;
                if (victim < 0)
                    fail("could not pin %d staging buffers of %s for the disk tier (the system "
                         "refused to lock more memory); raise the locked-memory limit (ulimit -l), "
                         "lower --ram-budget to leave memory free, or lower --prefetch.",
                         S_, format_gib(stage_bytes).c_str());
                Layer& v = layers_[size_t(victim)];
                dev_.free_pinned(v.pinned);
                v.pinned = nullptr;
                v.tier = Tier::Disk;
                plan_.tier[size_t(victim)] = Tier::Disk;
                notices_ += strfmt("layer %d moved from pinned RAM to disk to make room for staging\n", victim);
            }
            disk_.clear();
            for (int i : streamed_)
                if (layers_[size_t(i)].tier == Tier::Disk) {
                    layers_[size_t(i)].dpos = int(disk_.size());
                    disk_.push_back(i);
                }
            ND_ = int(disk_.size());
            plan_.staging = S_;
            plan_.staging_bytes = stage_bytes;
            // With cuFile the staging buffers stay too: the path to fall back to mid-run.
            ReaderOptions ro = opt_.io;
            std::string why;
            if (opt_.gds) {
                ro.gds = opt_.gds_api ? opt_.gds_api : cufile_api(&why);
                ro.thread_init = [this] { dev_.bind_thread(); };
            }
            reader_ = std::make_unique<FileReader>(path, ro);
            reader_->set_recording(true);
            if (!reader_->direct()) notices_ += reader_->fallback_reason() + "\n";
            if (ro.gds && !reader_->gds()) why = reader_->gds_reason();
            if (reader_->gds()) {
                gds_ = true;
                // Registered once, whole: cuFile DMAs into it without bounce buffers.
                if (!reader_->gds_register(slots_, size_t(K_) * slot_bytes_, &why)) notices_ += why + "\n";
            } else if (opt_.gds) {
                notices_ += why + "\n";
            }
            R_ = gds_ ? K_ : S_;
            ring_.assign(size_t(R_), ReadSlot{});
            plan_.disk_path = disk_path();
        }
        recount(plan_, blobs_);
        plan_.ram_used = plan_.bytes[1] + uint64_t(plan_.staging) * plan_.staging_bytes;
        dev_.make_events(2 * K_ + S_);

        // Fill the pinned tier. Buffered reads: a file just written or read before comes from
        // the page cache at memory speed, a cold one with the kernel's readahead.
        const double t0 = now_seconds();
        bool any = false;
        for (const Layer& ly : layers_) any = any || ly.tier == Tier::Pinned;
        if (any) {
            ReaderOptions fo = opt_.io;
            fo.direct = false;
            FileReader fill(path, fo);
            std::vector<FileReader::Ticket> tickets;
            for (int i = 0; i < L_; i++)
                if (layers_[size_t(i)].tier == Tier::Pinned)
                    tickets.push_back(fill.submit(blobs_[size_t(i)].extents, layers_[size_t(i)].pinned));
            for (auto t : tickets) fill.wait(t);
        }
        fill_seconds_ = now_seconds() - t0;
    } catch (...) {
        reader_.reset();  // its reads land and its cuFile registration of the slots goes first
        for (Layer& ly : layers_)
            if (ly.pinned) dev_.free_pinned(ly.pinned), ly.pinned = nullptr;
        for (void* p : staging_) dev_.free_pinned(p);
        staging_.clear();
        if (slots_) dev_.free_device(slots_);
        slots_ = nullptr;
        throw;
    }
    trace_.name_lane(kLaneHost, "host (waits for disk)");
    trace_.name_lane(kLaneCompute, "compute stream (layers)");
    trace_.name_lane(kLaneCopy, "copy stream (H2D)");
    for (int t = 0; reader_ && t < reader_->threads(); t++)
        trace_.name_lane(kLaneDisk + t, strfmt("disk reader %d%s", t, gds_ ? " (cuFile into VRAM)" : ""));
    window_t0_ = now_seconds();
}

WeightStreamer::~WeightStreamer() {
    try {
        stop_feeder();
        dev_.sync();
    } catch (...) {
    }
    reader_.reset();
    for (Layer& ly : layers_)
        if (ly.pinned) dev_.free_pinned(ly.pinned);
    for (void* p : staging_) dev_.free_pinned(p);
    if (slots_) dev_.free_device(slots_);
}

int64_t WeightStreamer::read_index(int64_t g) const {
    return (g / N_) * ND_ + layers_[size_t(streamed_[size_t(g % N_)])].dpos;
}

int64_t WeightStreamer::use_of_read(int64_t r) const {
    return (r / ND_) * N_ + layers_[size_t(disk_[size_t(r % ND_)])].spos;
}

const char* WeightStreamer::disk_path() const {
    if (gds_) return "GPUDirect Storage (cuFile) straight into the VRAM slots";
    return reader_ && reader_->direct() ? "O_DIRECT into pinned staging" : "buffered reads into pinned staging";
}

void WeightStreamer::leave_gds(const std::string& why) {
    stop_feeder();  // the reads in flight land before their slots are used again
    gds_ = false;
    R_ = S_;
    ring_.assign(size_t(R_), ReadSlot{});
    plan_.disk_path = disk_path();
    notices_ += why + "\n";
    if (opt_.notify) opt_.notify(why);
}

void WeightStreamer::stop_feeder() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (feeder_.joinable()) feeder_.join();
    // Reads in flight write into the staging buffers: let them land before anything reuses them.
    for (ReadSlot& rs : ring_) {
        if (rs.ticket) {
            try {
                reader_->wait(rs.ticket);
            } catch (const Error&) {
            }
        }
        rs = ReadSlot{};
    }
    stop_ = false;
    feeder_error_ = nullptr;
}

void WeightStreamer::restart(int layer) {
    stop_feeder();
    if (started_) {
        dev_.sync();
        resolve_timings(true);
        pass_++;  // fresh numbering: nothing in flight refers to it
    }
    started_ = true;
    broken_ = holding_ = false;
    cursor_ = layer;
    int s0 = 0, d0 = 0;
    for (int i : streamed_) s0 += i < layer;
    for (int i : disk_) d0 += i < layer;
    issued_ = released_ = pass_ * N_ + s0;
    const int64_t r0 = pass_ * ND_ + d0;
    if (ND_) {
        std::lock_guard<std::mutex> lk(mu_);
        copied_reads_ = feed_base_ = r0;
        released_shared_ = released_;
        feed_use0_ = issued_;
    }
    if (ND_) feeder_ = std::thread([this, r0] { feeder(r0); });
}

void WeightStreamer::feeder(int64_t r0) {
    try {
        for (int64_t r = r0;; r++) {
            const int s = int(r % R_);
            const int layer = disk_[size_t(r % ND_)];
            FileReader::Ticket t;
            if (gds_) {
                // Straight into the slot of use g: free once the compute that released its
                // previous use (g - K) has run. That release is recorded before this waits on it.
                const int64_t g = use_of_read(r);
                {
                    std::unique_lock<std::mutex> lk(mu_);
                    cv_.wait(lk, [&] { return stop_ || released_shared_ > g - K_; });
                    if (stop_) return;
                }
                if (g - K_ >= feed_use0_) dev_.host_wait(ev_released(int(g % K_)));
                t = reader_->submit_device(blobs_[size_t(layer)].extents, slot_ptr(int(g % K_)));
            } else {
                {
                    std::unique_lock<std::mutex> lk(mu_);
                    // Staging buffer s is free once the copy out of it (read r - S) has been
                    // enqueued and has run.
                    cv_.wait(lk, [&] { return stop_ || r - r0 < S_ || copied_reads_ > r - S_; });
                    if (stop_) return;
                }
                if (r - r0 >= S_) dev_.host_wait(ev_staging_free(s));
                t = reader_->submit(blobs_[size_t(layer)].extents, staging_[size_t(s)]);
            }
            {
                std::lock_guard<std::mutex> lk(mu_);
                ring_[size_t(s)] = ReadSlot{r, t};
            }
            cv_.notify_all();
        }
    } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        feeder_error_ = std::current_exception();
        cv_.notify_all();
    }
}

void WeightStreamer::pump(int64_t need) {
    while (N_ > 0 && issued_ < released_ + K_) {
        const int64_t g = issued_;
        const Layer& ly = layers_[size_t(streamed_[size_t(g % N_)])];
        if (ly.tier == Tier::Disk) {
            const int64_t r = read_index(g);
            const int s = int(r % R_);
            const bool must = g <= need;
            const double t0 = now_seconds();
            FileReader::Ticket ticket;
            {
                std::unique_lock<std::mutex> lk(mu_);
                if (must)
                    cv_.wait(lk, [&] { return ring_[size_t(s)].r == r || feeder_error_; });
                if (feeder_error_) std::rethrow_exception(feeder_error_);
                if (ring_[size_t(s)].r != r) return;  // not submitted yet: enqueue later
                ticket = ring_[size_t(s)].ticket;
            }
            if (!must && !reader_->done(ticket)) return;
            {
                std::lock_guard<std::mutex> lk(mu_);
                ring_[size_t(s)].ticket = 0;  // collected below, error or not
            }
            reader_->wait(ticket);  // throws the read's error
            if (must) {
                const double t1 = now_seconds();
                st_.host_wait += t1 - t0;
                if (opt_.trace && t1 - t0 > 20e-6)
                    add_box(strfmt("wait for layer %d", streamed_[size_t(g % N_)]), "wait", kLaneHost, t0, t1, 0);
            }
        }
        issue(g);
    }
}

void WeightStreamer::issue(int64_t g) {
    const int layer = streamed_[size_t(g % N_)];
    const Layer& ly = layers_[size_t(layer)];
    const LayerBlob& b = blobs_[size_t(layer)];
    const int slot = int(g % K_);
    if (ly.tier == Tier::Disk && gds_) {
        // cuFile has put the layer in its slot already (pump saw the read finish): the compute
        // stream's wait on ev_copied only has to find a record.
        dev_.copy_record(ev_copied(slot));
        st_.disk_bytes += b.bytes;
        st_.reads++;
        {
            std::lock_guard<std::mutex> lk(mu_);
            copied_reads_ = read_index(g) + 1;
        }
        issued_ = g + 1;
        return;
    }
    dev_.copy_wait(ev_released(slot));  // the slot's previous layer is done with it
    int64_t r = -1;
    const void* src = ly.pinned;
    if (ly.tier == Tier::Disk) {
        r = read_index(g);
        src = staging_[size_t(r % S_)];
    }
    const int m0 = dev_.mark(StreamDevice::Lane::Copy);
    dev_.copy_h2d(slots_ + size_t(slot) * slot_bytes_, src, b.bytes);
    const int m1 = dev_.mark(StreamDevice::Lane::Copy);
    dev_.copy_record(ev_copied(slot));
    timings_.push_back({m0, m1, -1, -1, kLaneCopy, layer, b.bytes});
    st_.h2d_bytes += b.bytes;
    st_.copies++;
    if (r >= 0) {
        dev_.copy_record(ev_staging_free(int(r % S_)));
        st_.disk_bytes += b.bytes;
        st_.reads++;
        {
            std::lock_guard<std::mutex> lk(mu_);
            copied_reads_ = r + 1;
        }
        cv_.notify_all();
    }
    issued_ = g + 1;
}

const LayerWeights& WeightStreamer::acquire(int layer) {
    if (layer < 0 || layer >= L_) fail("weight streamer: layer %d of %d.", layer, L_);
    if (!started_ || broken_ || holding_ || layer != cursor_) restart(layer);
    broken_ = true;  // until this call returns normally
    if (layer == 0) {
        st_.steps++;
        resolve_timings(false);
    }
    Layer& ly = layers_[size_t(layer)];
    const LayerWeights* out = &ly.views;
    if (ly.tier != Tier::Vram) {
        int64_t g = pass_ * N_ + ly.spos;
        for (;;) {
            cur_g_ = g;
            try {
                pump(g);
                break;
            } catch (const GdsReadError& e) {
                leave_gds(e.what());
                restart(layer);
                g = pass_ * N_ + ly.spos;
            }
        }
        const int slot = int(g % K_);
        dev_.compute_wait(ev_copied(slot));
        current_ = views_in_blob(ly.views, blobs_[size_t(layer)], slots_ + size_t(slot) * slot_bytes_);
        out = &current_;
    }
    cur_mark_ = dev_.mark(StreamDevice::Lane::Compute);
    holding_ = true;
    broken_ = false;
    return *out;
}

void WeightStreamer::release(int layer) {
    if (!holding_ || layer != cursor_) {
        broken_ = true;  // the next acquire starts over
        return;
    }
    const int m1 = dev_.mark(StreamDevice::Lane::Compute);
    timings_.push_back({cur_mark_, m1, -1, -1, kLaneCompute, layer, 0});
    const Layer& ly = layers_[size_t(layer)];
    if (ly.tier != Tier::Vram) {
        dev_.compute_record(ev_released(int(cur_g_ % K_)));
        released_ = cur_g_ + 1;
        if (gds_) {
            {
                std::lock_guard<std::mutex> lk(mu_);
                released_shared_ = released_;
            }
            cv_.notify_all();
        }
    }
    holding_ = false;
    if (++cursor_ == L_) {
        cursor_ = 0;
        pass_++;
    }
    try {
        pump(-1);
    } catch (const GdsReadError& e) {
        leave_gds(e.what());
        restart(cursor_);
    } catch (...) {
        broken_ = true;  // a read failed: the next acquire starts over
        throw;
    }
}

void WeightStreamer::add_box(const std::string& name, const char* cat, int lane, double t0, double t1,
                             uint64_t bytes) {
    if (!opt_.trace) return;
    std::vector<std::pair<std::string, double>> args;
    if (bytes) {
        args.push_back({"MiB", double(bytes) / double(1 << 20)});
        if (t1 > t0) args.push_back({"GB/s", double(bytes) / (t1 - t0) / 1e9});
    }
    trace_.add(name, cat, lane, t0, t1, args);
}

void WeightStreamer::resolve_timings(bool all) {
    (void)all;
    std::vector<Timing> left;
    for (Timing& t : timings_) {
        if (t.t0 < 0 && !dev_.resolve(t.m0, &t.t0)) t.t0 = -1;
        if (t.t1 < 0 && !dev_.resolve(t.m1, &t.t1)) t.t1 = -1;
        if (t.t0 < 0 || t.t1 < 0) {
            left.push_back(t);
            continue;
        }
        const double d = std::max(0.0, t.t1 - t.t0);
        if (t.lane == kLaneCopy) {
            st_.h2d_busy += d;
            add_box(strfmt("copy layer %d", t.layer), "h2d", kLaneCopy, t.t0, t.t1, t.bytes);
        } else {
            st_.compute_busy += d;
            add_box(strfmt("layer %d", t.layer), "compute", kLaneCompute, t.t0, t.t1, 0);
        }
    }
    timings_.swap(left);
}

void WeightStreamer::collect_reads() {
    if (!reader_) return;
    std::vector<ReadRecord> rec = reader_->take_records();
    std::sort(rec.begin(), rec.end(), [](const ReadRecord& a, const ReadRecord& b) { return a.t0 < b.t0; });
    double end = -1;
    for (const ReadRecord& r : rec) {
        // Busy time is the union of the reads' intervals: several run at once.
        if (r.t1 > end) {
            st_.disk_busy += r.t1 - std::max(r.t0, end);
            end = r.t1;
        }
        add_box(r.device ? "gds read" : "read", "disk", kLaneDisk + r.thread, r.t0, r.t1, r.bytes);
    }
}

void WeightStreamer::reset_stats() {
    dev_.sync();
    resolve_timings(true);
    collect_reads();
    st_ = StreamStats{};
    window_t0_ = now_seconds();
}

StreamStats WeightStreamer::stats() {
    dev_.sync();
    resolve_timings(true);
    collect_reads();
    st_.wall = now_seconds() - window_t0_;
    st_.gds = gds_;
    return st_;
}

void WeightStreamer::write_trace(const std::string& path) {
    if (!opt_.trace) fail("the weight streamer was created without tracing.");
    dev_.sync();
    resolve_timings(true);
    collect_reads();
    trace_.write(path);
}

double WeightStreamer::measure_disk_gbs(uint64_t bytes) {
    if (!ND_ || started_) return 0;
    try {
        return measure_reads(bytes);
    } catch (const GdsReadError& e) {
        leave_gds(e.what());
        return measure_reads(bytes);
    }
}

double WeightStreamer::measure_reads(uint64_t bytes) {
    // Into the slots with cuFile (free before the first step), into staging otherwise.
    const int n = gds_ ? K_ : S_;
    std::vector<FileReader::Ticket> t(size_t(n), 0);
    auto collect = [&](size_t s) {
        const FileReader::Ticket x = t[s];
        t[s] = 0;
        if (x) reader_->wait(x);
    };
    uint64_t total = 0;
    const double t0 = now_seconds();
    try {
        for (int i = 0; total < bytes; i++) {
            const size_t s = size_t(i % n);
            collect(s);
            const int layer = disk_[size_t(i % ND_)];
            const auto& ext = blobs_[size_t(layer)].extents;
            t[s] = gds_ ? reader_->submit_device(ext, slot_ptr(int(s))) : reader_->submit(ext, staging_[s]);
            total += blobs_[size_t(layer)].bytes;
        }
        for (size_t s = 0; s < t.size(); s++) collect(s);
    } catch (...) {
        // The other reads land before anyone reuses their memory.
        for (size_t s = 0; s < t.size(); s++) {
            try {
                collect(s);
            } catch (const Error&) {
            }
        }
        reader_->take_records();
        throw;
    }
    const double dt = now_seconds() - t0;
    reader_->take_records();  // not part of any step
    return dt > 0 ? double(total) / dt / 1e9 : 0;
}

}  // namespace nt::mem
