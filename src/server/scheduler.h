// Continuous batching over one Engine: n_slots sequences share its KV cache, and every step is
// ONE forward pass holding the next token of each decoding job plus chunks of waiting prompts
// (chunked prefill, at most max_step_tokens per step). Each job samples with its own Sampler.
// The worker thread owns the engine; front ends (HTTP server, C API) submit jobs and read their
// tokens from any thread. No HTTP, JSON or text handling here: jobs are token ids in and out.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace nt {

enum class FinishReason {
    Running,
    Stop,       // the model produced an end-of-generation token
    Length,     // max_tokens reached or the context is full
    Cancelled,  // cancel() was called (client gone, stop string seen, caller asked)
    Error,      // the step failed; error() says why
};
const char* finish_reason_name(
    FinishReason r);  // "running", "stop", "length", "cancelled", "error"

struct GenerationParams {
    SamplerParams sampling;
    int max_tokens = -1;  // < 0: until end of generation or a full context
    int n_logprobs = -1;  // < 0: none; 0: the sampled token's; k > 0: also the k most likely
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits before sampling
    // Reuse the K/V of a prefix that a free slot already holds. Off: the whole prompt goes
    // through the model, so the request computes exactly as it would on an idle server.
    bool cache_prompt = true;
};

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.f;
};

// One sampled token. End-of-generation tokens are not delivered (they end the job instead;
// Job::eog_token() has the id).
struct GeneratedToken {
    int32_t id = 0;
    float logprob = 0.f;            // log-softmax of the (biased) raw logits; 0 without logprobs
    std::vector<TokenLogprob> top;  // n_logprobs most likely, most likely first
};

struct JobStats {
    int n_prompt = 0;     // prompt tokens of the job
    int n_cached = 0;     // of those, reused from the slot's cache (not evaluated again)
    int n_generated = 0;  // tokens delivered (end-of-generation excluded)
    int kv_end = 0;       // positions of the slot whose KV is valid when the job ended
    double queue_seconds = 0, prompt_seconds = 0, decode_seconds = 0;
};

// A submitted generation: filled by the scheduler's worker, drained by one consumer.
class Job {
  public:
    // Moves the tokens produced since the last call to the end of `out`, waiting up to `timeout`
    // when none are ready. Returns true once the job has finished and every token was taken.
    bool take(std::vector<GeneratedToken>& out, std::chrono::milliseconds timeout);
    // Blocks until the job has finished (tokens stay available to take()).
    void wait_finished();
    // Asks the scheduler to end this job before its next step, as Cancelled: its slot (and, for
    // an unpinned job, its KV cells) is freed. Callable from any thread; the first of cancel()
    // and stop() decides the reason.
    void cancel() { request_end(FinishReason::Cancelled); }
    // Ends the job as finished by a stop condition its consumer detected (a stop string): like
    // cancel(), but the reason is Stop and the slot keeps its cache for later prompts.
    void stop() { request_end(FinishReason::Stop); }
    bool end_requested() const { return end_.load(std::memory_order_relaxed) != 0; }

    FinishReason finish_reason() const;
    std::string error() const;
    JobStats stats() const;
    int32_t eog_token() const;  // the end-of-generation token that stopped the job, or -1

  private:
    friend class Scheduler;
    using clock = std::chrono::steady_clock;

    // Set at submit, then owned by the worker thread.
    std::vector<int32_t> prompt_;
    GenerationParams params_;
    std::unique_ptr<Sampler> own_sampler_;
    Sampler* sampler_ = nullptr;
    int pinned_slot_ = -1;  // a reserved slot (C API session), or -1: any free slot
    int start_pos_ = 0;     // pinned jobs: position of prompt_[0]
    int slot_ = -1;
    int n_fed_ = 0;      // prompt tokens whose K/V are in the cache
    int pos_ = 0;        // next position to write
    int32_t last_ = -1;  // sampled, not yet fed
    int n_gen_ = 0;
    bool decoding_ = false;
    clock::time_point t_submit_, t_start_, t_first_;

    void request_end(FinishReason r) {
        int none = 0;
        end_.compare_exchange_strong(none, int(r), std::memory_order_relaxed);
    }
    std::atomic<int> end_{0};  // 0, or the FinishReason cancel()/stop() asked for

    // Shared with the consumer.
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<GeneratedToken> ready_;
    FinishReason finish_ = FinishReason::Running;
    std::string error_;
    JobStats stats_;
    int32_t eog_ = -1;
};

struct SchedulerOptions {
    int n_slots = 1;          // must equal the EngineOptions::n_seq the engine was built with
    int max_queue = 64;       // jobs waiting for a slot; submit() refuses more
    int max_step_tokens = 0;  // 0: the engine's max_batch
};

// Totals since start and the current load.
struct SchedulerStats {
    uint64_t jobs_submitted = 0, jobs_finished = 0, jobs_rejected = 0;
    uint64_t finished_by_reason[5] = {};  // indexed by FinishReason
    uint64_t prompt_tokens = 0;           // prompt tokens evaluated (cached prefixes excluded)
    uint64_t prompt_tokens_cached = 0;    // prompt tokens whose K/V was reused
    uint64_t generated_tokens = 0;
    uint64_t steps = 0, step_tokens = 0;
    double step_seconds = 0;
    int queued = 0, active = 0, slots = 0, reserved = 0;
    // Over the last window_seconds (or since start when shorter).
    double window_seconds = 0, generated_per_second = 0, prompt_per_second = 0;
};

class Scheduler {
  public:
    // Starts the worker thread. The engine must outlive the scheduler and must not be used by
    // anything else while it runs. Throws nt::Error when the options do not fit the engine.
    Scheduler(Engine& engine, const SchedulerOptions& opt);
    ~Scheduler();  // cancels every job and joins the worker
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Queues a generation continuing `prompt` on any free slot (reusing the longest cached
    // prefix among free slots). `sampler` must have accepted the prompt tokens already when
    // penalties should see them. Returns nullptr when the queue is full. Throws nt::Error when
    // the prompt is empty or longer than the context.
    std::shared_ptr<Job> submit(std::vector<int32_t> prompt, const GenerationParams& params,
                                std::unique_ptr<Sampler> sampler);

    // Reserved slots (C API sessions): a slot kept out of the pool with its cache, fed by
    // submit_pinned at explicit positions. reserve_slot returns -1 when none is free.
    int reserve_slot();
    void release_slot(int slot);  // no job of that slot may be running
    // Continues slot `slot` from position `start_pos` (its cache beyond is dropped). The sampler
    // is borrowed and must outlive the job. Never queued.
    std::shared_ptr<Job> submit_pinned(int slot, int start_pos, std::vector<int32_t> prompt,
                                       const GenerationParams& params, Sampler* sampler);

    SchedulerStats stats() const;
    int n_slots() const { return n_slots_; }
    int n_ctx() const { return n_ctx_; }
    int max_queue() const { return max_queue_; }
    Engine& engine() { return eng_; }

    static constexpr double kRateWindowSeconds = 10.0;

  private:
    struct Slot {
        std::shared_ptr<Job> job;     // running job, or null
        std::vector<int32_t> cached;  // tokens whose K/V are valid, from position 0
        bool reserved = false;
        uint64_t last_used = 0;
    };
    using clock = std::chrono::steady_clock;

    void validate(const std::vector<int32_t>& prompt, int start_pos) const;
    // A job for `prompt` stamped with its submission time (no sampler, slot or position yet).
    static std::shared_ptr<Job> new_job(std::vector<int32_t> prompt,
                                        const GenerationParams& params);
    // Counts the job as submitted and queues it; with max_tokens 0 it finishes at once instead
    // (no slot, no evaluation) and false is returned. Caller holds mu_.
    bool enqueue_locked(const std::shared_ptr<Job>& job);
    void run();
    void admit_locked();
    void start_job_locked(const std::shared_ptr<Job>& job, int slot, int n_cached);
    void finish(const std::shared_ptr<Job>& job, FinishReason reason,
                const std::string& error = "");
    void step(const std::vector<std::shared_ptr<Job>>& active,
              const std::vector<std::pair<Job*, int>>& chunks);
    // What became of a job given a token.
    enum class Delivery {
        Ended,      // end of generation: the token is not delivered and the job has finished
        Last,       // delivered, and the job has finished (its length, or a full context)
        Continues,  // delivered, and fed next (Job::last_)
    };
    // Hands token `id`, sampled from the job's logits row (d: that row's draw, for the
    // log-probabilities; null when none were asked), to the job.
    Delivery deliver(const std::shared_ptr<Job>& j, int32_t id, const Engine::Draw* d,
                     clock::time_point now);
    // Whether job j, decoding alone, can run fed: the engine pipelines and its sampler draws on
    // the device (greedy or the top-k chain, a logit bias of at most kMaxDrawBias tokens, no
    // log-probabilities); `draw` is how.
    bool can_feed(const Job& j, TokenDraw& draw) const;
    // Whether the job should leave a fed run: its end was asked, or a queued job could start.
    bool fed_run_interrupted(const Job& j) const;
    // Decodes job j as generate() does: each step enqueued before the host has the token it
    // feeds, drawn on the device and checked on the host. Returns when the job ends or
    // fed_run_interrupted(); the job then goes on in ordinary steps.
    void decode_fed(const std::shared_ptr<Job>& j, const TokenDraw& draw);
    void record_step(double seconds, int tokens, int prompt_tokens, int generated);

    Engine& eng_;
    const int n_slots_, n_ctx_, max_step_, max_queue_;

    mutable std::mutex mu_;  // guards everything below but the worker-only members
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    std::vector<Slot> slots_;
    bool stop_ = false;
    uint64_t use_counter_ = 0;
    SchedulerStats totals_;
    struct Sample {
        clock::time_point t;
        int prompt, generated;
    };
    std::deque<Sample> window_;
    clock::time_point started_;

    // Worker-only.
    Batch batch_;
    std::vector<Engine::Draw> draws_;             // the step's logit rows, sampled
    std::vector<std::shared_ptr<Job>> row_jobs_;  // job of each logits row, in batch order
    std::thread worker_;
};

}  // namespace nt
