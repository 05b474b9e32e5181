// Helpers shared by the memory tests (tests/unit/test_memory_*.cpp, tests/gpu/test_streaming.cpp):
// a small Llama GGUF written from C++ in any weight type, and HostStreamDevice, a StreamDevice
// simulated on the host with a real copy thread, so the streamer's event protocol is exercised
// with genuine concurrency: copies are slow, poison their destination first, and compute (the
// calling thread) only sees a slot after waiting for its event, as on a GPU.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "gguf/gguf.h"
#include "memory/clock.h"
#include "memory/planner.h"
#include "memory/stream_device.h"
#include "quant/quant.h"
#include "quant/types.h"

namespace nt::testing_mem {

// A file path in a fresh directory under `dir` (default: the system temp directory), removed
// with its directory at destruction.
struct TempPath {
    std::string dir, path;
    explicit TempPath(const std::string& name, const std::string& base = "") {
        std::string root = base.empty() ? std::filesystem::temp_directory_path().string() : base;
        std::string tmpl = root + "/nt_mem_XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        if (!mkdtemp(buf.data())) throw Error("mkdtemp failed in " + root);
        dir = buf.data();
        path = dir + "/" + name;
    }
    ~TempPath() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
};

struct SynthSpec {
    GgmlType type = GgmlType::Q8_0;  // every matrix (embeddings included)
    int n_layer = 6;
    int n_embd = 256, n_ff = 512, n_head = 4, n_head_kv = 2;
    int n_vocab = 300;
    bool tied = false;
    uint32_t seed = 7;
};

// Random weights of one type: real quantizations where we can quantize, random blocks with sane
// scales for the K-quants (as tests/python/synth_model.py does).
inline std::vector<uint8_t> synth_tensor(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng,
                                         float std_dev = 0.05f) {
    std::normal_distribution<float> nd(0.f, std_dev);
    const int64_t n = rows * cols;
    std::vector<uint8_t> out(row_bytes(t, cols) * size_t(rows));
    if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || can_quantize(t)) {
        std::vector<float> f(static_cast<size_t>(n));
        for (float& x : f) x = nd(rng);
        if (t == GgmlType::F32) {
            std::memcpy(out.data(), f.data(), out.size());
        } else if (t == GgmlType::F16 || t == GgmlType::BF16) {
            auto* h = reinterpret_cast<uint16_t*>(out.data());
            for (int64_t i = 0; i < n; i++) h[i] = t == GgmlType::F16 ? f32_to_f16(f[size_t(i)]) : f32_to_bf16(f[size_t(i)]);
        } else {
            for (int64_t r = 0; r < rows; r++)
                quantize_row(t, f.data() + r * cols, out.data() + size_t(r) * row_bytes(t, cols), cols);
        }
        return out;
    }
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : out) b = uint8_t(byte(rng));
    // (offset of an f16 scale in the block, range of its values)
    struct Scale {
        int off;
        float lo, hi;
    };
    std::vector<Scale> scales;
    switch (t) {
        case GgmlType::Q2_K: scales = {{80, 2e-3f, 5e-3f}, {82, 1e-3f, 2e-3f}}; break;
        case GgmlType::Q3_K: scales = {{108, 2e-4f, 6e-4f}}; break;
        case GgmlType::Q4_K: scales = {{0, 2e-4f, 5e-4f}, {2, 1e-4f, 3e-4f}}; break;
        case GgmlType::Q5_K: scales = {{0, 1e-4f, 2.5e-4f}, {2, 1e-4f, 2e-4f}}; break;
        case GgmlType::Q6_K: scales = {{208, 5e-6f, 1.5e-5f}}; break;
        default: throw Error(std::string("synth_tensor: no generator for ") + type_name(t));
    }
    const size_t bb = size_t(traits(t).block_bytes);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (size_t b = 0; b < out.size() / bb; b++)
        for (const Scale& s : scales) {
            const uint16_t h = f32_to_f16(s.lo + (s.hi - s.lo) * u(rng));
            std::memcpy(out.data() + b * bb + size_t(s.off), &h, 2);
        }
    return out;
}

// A Llama-architecture GGUF with a SentencePiece vocabulary (3 control tokens, 256 byte tokens,
// the rest plain pieces) and random weights of spec.type; norms are F32 near 1.
inline void write_synth_model(const std::string& path, const SynthSpec& s) {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_string("general.name", "synth-memory-test");
    w.set_u32("llama.context_length", 512);
    w.set_u32("llama.embedding_length", uint32_t(s.n_embd));
    w.set_u32("llama.block_count", uint32_t(s.n_layer));
    w.set_u32("llama.feed_forward_length", uint32_t(s.n_ff));
    w.set_u32("llama.attention.head_count", uint32_t(s.n_head));
    w.set_u32("llama.attention.head_count_kv", uint32_t(s.n_head_kv));
    w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_f32("llama.rope.freq_base", 10000.f);
    std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
    std::vector<float> scores{0, 0, 0};
    std::vector<int32_t> types{2, 3, 3};
    for (int b = 0; b < 256; b++) {
        tokens.push_back(strfmt("<0x%02X>", b));
        scores.push_back(0);
        types.push_back(6);
    }
    for (int i = int(tokens.size()); i < s.n_vocab; i++) {
        tokens.push_back("\xE2\x96\x81t" + std::to_string(i));
        scores.push_back(-float(i));
        types.push_back(1);
    }
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_i32_array("tokenizer.ggml.token_type", types);

    std::mt19937 rng(s.seed);
    const int64_t d = s.n_embd, hd = s.n_embd / s.n_head, kv = int64_t(s.n_head_kv) * hd;
    auto add = [&](const std::string& name, GgmlType t, int64_t rows, int64_t cols, float sd = 0.05f) {
        std::vector<uint8_t> b = synth_tensor(t, rows, cols, rng, sd);
        std::vector<int64_t> ne{cols};
        if (rows > 1) ne.push_back(rows);
        w.add_tensor(name, t, ne, b.data(), b.size());
    };
    auto add_norm = [&](const std::string& name) {
        std::uniform_real_distribution<float> u(0.8f, 1.2f);
        std::vector<float> v(static_cast<size_t>(d));
        for (float& x : v) x = u(rng);
        w.add_tensor(name, GgmlType::F32, {d}, v.data(), v.size() * 4);
    };
    add("token_embd.weight", s.type, s.n_vocab, d, 0.5f);
    for (int l = 0; l < s.n_layer; l++) {
        const std::string p = "blk." + std::to_string(l) + ".";
        add_norm(p + "attn_norm.weight");
        add(p + "attn_q.weight", s.type, d, d);
        add(p + "attn_k.weight", s.type, kv, d);
        add(p + "attn_v.weight", s.type, kv, d);
        add(p + "attn_output.weight", s.type, d, d);
        add_norm(p + "ffn_norm.weight");
        add(p + "ffn_gate.weight", s.type, s.n_ff, d);
        add(p + "ffn_up.weight", s.type, s.n_ff, d);
        add(p + "ffn_down.weight", s.type, d, s.n_ff);
    }
    add_norm("output_norm.weight");
    if (!s.tied) add("output.weight", s.type, s.n_vocab, d);
    w.write(path);
}

// ---- a StreamDevice on the host --------------------------------------------------------------

class HostStreamDevice : public mem::StreamDevice {
public:
    // Copies sleep `copy_delay_us` after poisoning their destination, to widen any window in
    // which a missing wait would let compute read a half-written slot.
    explicit HostStreamDevice(int copy_delay_us = 200) : delay_us_(copy_delay_us) {
        worker_ = std::thread([this] { run(); });
    }
    ~HostStreamDevice() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        worker_.join();
        for (void* p : live_) std::free(p);
    }

    std::string name() const override { return "host simulation"; }
    uint64_t backend_bytes() const override { return backend_bytes_; }
    uint64_t free_bytes() override { return free_bytes_; }
    uint64_t headroom_bytes() const override { return 0; }
    uint64_t resident_footprint(uint64_t n) const override { return (n + 255) / 256 * 256; }
    void* alloc_device(size_t bytes, const char*) override { return alloc(bytes, &device_bytes_); }
    void free_device(void* p) override { release(p); }
    void* alloc_pinned(size_t bytes) override {
        if (pinned_bytes_ + bytes > pin_limit_) return nullptr;
        return alloc(bytes, &pinned_bytes_);
    }
    void free_pinned(void* p) override { release(p); }

    void make_events(int n) override {
        std::lock_guard<std::mutex> lk(mu_);
        recorded_.assign(size_t(n), 0);
        completed_.assign(size_t(n), 0);
    }
    void copy_wait(int e) override { push({Cmd::Wait, e, recorded(e), nullptr, nullptr, 0, -1}); }
    void copy_h2d(void* dst, const void* src, size_t n) override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            // Nothing may stream from memory the device did not pin.
            if (!pinned_.count(src)) bad_source_ = true;
            copies_++;
            copied_bytes_ += n;
        }
        push({Cmd::Copy, -1, 0, dst, src, n, -1});
    }
    void copy_record(int e) override {
        uint64_t g;
        {
            std::lock_guard<std::mutex> lk(mu_);
            g = ++recorded_.at(size_t(e));
        }
        push({Cmd::Record, e, g, nullptr, nullptr, 0, -1});
    }
    void compute_wait(int e) override { wait_for(e, recorded(e)); }
    void compute_record(int e) override {
        std::lock_guard<std::mutex> lk(mu_);
        // Compute is the calling thread, already finished: the record completes at once.
        completed_.at(size_t(e)) = ++recorded_.at(size_t(e));
        cv_.notify_all();
    }
    void host_wait(int e) override { wait_for(e, recorded(e)); }
    void sync() override {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return q_.empty() && !busy_; });
    }
    void begin_streaming() override { streaming_ = true; }
    int mark(Lane lane) override {
        std::lock_guard<std::mutex> lk(mu_);
        const int id = next_mark_++;
        if (lane == Lane::Compute) {
            marks_[id] = mem::now_seconds();
            return id;
        }
        q_.push_back({Cmd::Mark, -1, 0, nullptr, nullptr, 0, id});
        cv_.notify_all();
        return id;
    }
    bool resolve(int m, double* t) override {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = marks_.find(m);
        if (it == marks_.end()) return false;
        *t = it->second;
        marks_.erase(it);
        return true;
    }
    double measure_h2d_gbs() override { return 10.0; }
    double measure_hbm_gbs() override { return 100.0; }

    // Test knobs and observations.
    uint64_t backend_bytes_ = 64 << 10, free_bytes_ = uint64_t(1) << 30;
    uint64_t pin_limit_ = ~uint64_t(0);
    bool streaming_ = false;
    int copies() {
        std::lock_guard<std::mutex> lk(mu_);
        return copies_;
    }
    uint64_t copied_bytes() {
        std::lock_guard<std::mutex> lk(mu_);
        return copied_bytes_;
    }
    bool bad_source() {
        std::lock_guard<std::mutex> lk(mu_);
        return bad_source_;
    }
    uint64_t pinned_bytes() {
        std::lock_guard<std::mutex> lk(mu_);
        return pinned_bytes_;
    }

private:
    struct Cmd {
        enum Kind { Wait, Copy, Record, Mark } kind;
        int event;
        uint64_t gen;
        void* dst;
        const void* src;
        size_t n;
        int mark;
    };
    uint64_t recorded(int e) {
        std::lock_guard<std::mutex> lk(mu_);
        return recorded_.at(size_t(e));
    }
    void wait_for(int e, uint64_t gen) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return completed_.at(size_t(e)) >= gen; });
    }
    void push(const Cmd& c) {
        std::lock_guard<std::mutex> lk(mu_);
        q_.push_back(c);
        cv_.notify_all();
    }
    void* alloc(size_t bytes, uint64_t* counter) {
        void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
        std::lock_guard<std::mutex> lk(mu_);
        live_.insert(p);
        sizes_[p] = bytes;
        *counter += bytes;
        if (counter == &pinned_bytes_) pinned_.insert(p);
        return p;
    }
    void release(void* p) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!live_.erase(p)) return;
        if (pinned_.erase(p)) pinned_bytes_ -= sizes_[p];
        else device_bytes_ -= sizes_[p];
        sizes_.erase(p);
        std::free(p);
    }
    void run() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
            if (q_.empty()) return;
            Cmd c = q_.front();
            if (c.kind == Cmd::Wait) {
                // The stream stalls here, as a GPU stream does, until the event completes.
                if (completed_.at(size_t(c.event)) < c.gen) {
                    cv_.wait(lk, [&] { return stop_ || completed_.at(size_t(c.event)) >= c.gen; });
                    if (stop_) return;
                }
                q_.pop_front();
                continue;
            }
            q_.pop_front();
            busy_ = true;
            lk.unlock();
            if (c.kind == Cmd::Copy) {
                std::memset(c.dst, 0xFF, c.n);  // a reader that did not wait sees NaN scales
                if (delay_us_) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
                std::memcpy(c.dst, c.src, c.n);
            }
            lk.lock();
            if (c.kind == Cmd::Record) completed_.at(size_t(c.event)) = std::max(completed_.at(size_t(c.event)), c.gen);
            if (c.kind == Cmd::Mark) marks_[c.mark] = mem::now_seconds();
            busy_ = false;
            cv_.notify_all();
        }
    }

    int delay_us_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Cmd> q_;
    bool stop_ = false, busy_ = false;
    std::vector<uint64_t> recorded_, completed_;
    std::map<int, double> marks_;
    int next_mark_ = 0;
    std::set<void*> live_;
    std::set<const void*> pinned_;
    std::map<void*, size_t> sizes_;
    uint64_t device_bytes_ = 0, pinned_bytes_ = 0, copied_bytes_ = 0;
    int copies_ = 0;
    bool bad_source_ = false;
    std::thread worker_;
};

// A plan with one tier per layer, from one letter each (V: VRAM, P: pinned RAM, D: disk).
inline mem::TierPlan tier_plan(const std::string& tiers, int slots, int staging) {
    mem::TierPlan p;
    for (char c : tiers)
        p.tier.push_back(c == 'V' ? mem::Tier::Vram : c == 'P' ? mem::Tier::Pinned : mem::Tier::Disk);
    p.slots = slots;
    p.staging = staging;
    return p;
}

}  // namespace nt::testing_mem
