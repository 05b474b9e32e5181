#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "core/env.h"
#include "core/error.h"

namespace nt {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::Running:
            return "running";
        case FinishReason::Stop:
            return "stop";
        case FinishReason::Length:
            return "length";
        case FinishReason::Cancelled:
            return "cancelled";
        case FinishReason::Error:
            return "error";
    }
    return "unknown";
}

// ---- Job (consumer side) ----

bool Job::take(std::vector<GeneratedToken>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    if (ready_.empty() && finish_ == FinishReason::Running)
        cv_.wait_for(lk, timeout,
                     [&] { return !ready_.empty() || finish_ != FinishReason::Running; });
    for (GeneratedToken& t : ready_) out.push_back(std::move(t));
    ready_.clear();
    return finish_ != FinishReason::Running;
}

void Job::wait_finished() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return finish_ != FinishReason::Running; });
}

FinishReason Job::finish_reason() const {
    std::lock_guard<std::mutex> lk(mu_);
    return finish_;
}

std::string Job::error() const {
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
}

JobStats Job::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
}

int32_t Job::eog_token() const {
    std::lock_guard<std::mutex> lk(mu_);
    return eog_;
}

// ---- Scheduler ----

namespace {
double seconds(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

// log-softmax denominator of a row: max and log(sum(exp(l - max))).
std::pair<float, double> log_norm(const float* l, int n) {
    float mx = l[0];
    for (int i = 1; i < n; i++) mx = std::max(mx, l[i]);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += std::exp(double(l[i] - mx));
    return {mx, std::log(sum)};
}
}  // namespace

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt)
    : eng_(engine),
      n_slots_(opt.n_slots),
      n_ctx_(engine.n_ctx()),
      max_step_(opt.max_step_tokens > 0 ? std::min(opt.max_step_tokens, engine.max_batch())
                                        : engine.max_batch()),
      max_queue_(std::max(0, opt.max_queue)) {
    if (n_slots_ < 1) fail("the number of parallel slots must be at least 1.");
    // Every decoding job adds one token per step, so a step must hold one token of each slot.
    if (max_step_ < n_slots_)
        fail(
            "the batch size (%d tokens) must be at least the number of parallel slots (%d); raise "
            "-b or lower "
            "--parallel.",
            max_step_, n_slots_);
    slots_.resize(size_t(n_slots_));
    totals_.slots = n_slots_;
    started_ = clock::now();
    worker_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
}

void Scheduler::validate(const std::vector<int32_t>& prompt, int start_pos) const {
    if (prompt.empty()) fail("the prompt is empty.");
    const int n_vocab = eng_.n_vocab();
    for (int32_t t : prompt)
        if (t < 0 || t >= n_vocab)
            fail("token id %d is outside the vocabulary of %d tokens.", t, n_vocab);
    if (start_pos + int64_t(prompt.size()) > n_ctx_)
        fail("the prompt needs %lld positions but the context holds %d tokens.",
             (long long)(start_pos + int64_t(prompt.size())), n_ctx_);
}

std::shared_ptr<Job> Scheduler::submit(std::vector<int32_t> prompt, const GenerationParams& params,
                                       std::unique_ptr<Sampler> sampler) {
    validate(prompt, 0);
    auto job = new_job(std::move(prompt), params);
    job->own_sampler_ = std::move(sampler);
    job->sampler_ = job->own_sampler_.get();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (int(queue_.size()) >= max_queue_ &&
            !std::any_of(slots_.begin(), slots_.end(),
                         [](const Slot& s) { return !s.job && !s.reserved; })) {
            totals_.jobs_rejected++;
            return nullptr;
        }
        if (!enqueue_locked(job)) return job;
    }
    cv_.notify_all();
    return job;
}

std::shared_ptr<Job> Scheduler::new_job(std::vector<int32_t> prompt,
                                        const GenerationParams& params) {
    auto job = std::make_shared<Job>();
    job->prompt_ = std::move(prompt);
    job->params_ = params;
    job->t_submit_ = clock::now();
    job->stats_.n_prompt = int(job->prompt_.size());
    return job;
}

bool Scheduler::enqueue_locked(const std::shared_ptr<Job>& job) {
    totals_.jobs_submitted++;
    if (job->params_.max_tokens == 0) {
        // Nothing to generate: no slot, no evaluation.
        totals_.jobs_finished++;
        totals_.finished_by_reason[int(FinishReason::Length)]++;
        job->finish_ = FinishReason::Length;
        return false;
    }
    queue_.push_back(job);
    return true;
}

int Scheduler::reserve_slot() {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < slots_.size(); i++)
        if (!slots_[i].job && !slots_[i].reserved) {
            slots_[i].reserved = true;
            slots_[i].cached.clear();
            totals_.reserved++;
            return int(i);
        }
    return -1;
}

void Scheduler::release_slot(int slot) {
    std::lock_guard<std::mutex> lk(mu_);
    if (slot < 0 || slot >= n_slots_ || !slots_[size_t(slot)].reserved) return;
    Slot& s = slots_[size_t(slot)];
    if (s.job) fail("slot %d still has a running job; cancel it and wait before releasing.", slot);
    s.reserved = false;
    s.cached.clear();
    totals_.reserved--;
}

std::shared_ptr<Job> Scheduler::submit_pinned(int slot, int start_pos, std::vector<int32_t> prompt,
                                              const GenerationParams& params, Sampler* sampler) {
    if (start_pos < 0) fail("the start position must not be negative.");
    validate(prompt, start_pos);
    auto job = new_job(std::move(prompt), params);
    job->sampler_ = sampler;
    job->pinned_slot_ = slot;
    job->start_pos_ = start_pos;
    job->stats_.kv_end = start_pos;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (slot < 0 || slot >= n_slots_ || !slots_[size_t(slot)].reserved)
            fail("slot %d is not reserved.", slot);
        for (const auto& q : queue_)
            if (q->pinned_slot_ == slot) fail("slot %d already has a job.", slot);
        if (slots_[size_t(slot)].job) fail("slot %d already has a job.", slot);
        if (!enqueue_locked(job)) return job;
    }
    cv_.notify_all();
    return job;
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    SchedulerStats s = totals_;
    s.queued = 0;
    for (const auto& j : queue_) s.queued += j->pinned_slot_ < 0 ? 1 : 0;
    s.active = 0;
    for (const Slot& sl : slots_) s.active += sl.job ? 1 : 0;
    const auto now = clock::now();
    s.window_seconds = std::min(kRateWindowSeconds, seconds(now - started_));
    uint64_t gen = 0, prompt = 0;
    for (const Sample& w : window_)
        if (seconds(now - w.t) <= kRateWindowSeconds) {
            gen += uint64_t(w.generated);
            prompt += uint64_t(w.prompt);
        }
    if (s.window_seconds > 0) {
        s.generated_per_second = double(gen) / s.window_seconds;
        s.prompt_per_second = double(prompt) / s.window_seconds;
    }
    return s;
}

// Called with mu_ held, on the worker thread (the only one that touches the backend).
void Scheduler::start_job_locked(const std::shared_ptr<Job>& job, int slot, int n_cached) {
    Slot& s = slots_[size_t(slot)];
    s.job = job;
    s.last_used = ++use_counter_;
    totals_.prompt_tokens_cached += uint64_t(n_cached);
    job->slot_ = slot;
    const int first = job->pinned_slot_ >= 0 ? job->start_pos_ : 0;
    job->n_fed_ = n_cached;
    job->pos_ = first + n_cached;
    s.cached.resize(std::min(s.cached.size(), size_t(job->pos_)));
    eng_.backend().kv_truncate(slot, job->pos_);
    job->t_start_ = clock::now();
    std::lock_guard<std::mutex> jl(job->mu_);
    job->stats_.n_cached = n_cached;
    job->stats_.kv_end = job->pos_;
    job->stats_.queue_seconds = seconds(job->t_start_ - job->t_submit_);
}

void Scheduler::admit_locked() {
    for (auto it = queue_.begin(); it != queue_.end();) {
        const std::shared_ptr<Job>& job = *it;
        if (job->pinned_slot_ >= 0) {
            // A reserved slot waits for nobody.
            start_job_locked(job, job->pinned_slot_, 0);
            it = queue_.erase(it);
            continue;
        }
        // The free slot whose cache shares the longest prefix with the prompt; ties go to the
        // least recently used, so that cached conversations survive as long as possible.
        int best = -1;
        size_t best_common = 0;
        for (size_t i = 0; i < slots_.size(); i++) {
            const Slot& s = slots_[i];
            if (s.job || s.reserved) continue;
            size_t common = 0;
            const size_t n = std::min(s.cached.size(), job->prompt_.size());
            while (common < n && s.cached[common] == job->prompt_[common]) common++;
            if (best < 0 || common > best_common ||
                (common == best_common && s.last_used < slots_[size_t(best)].last_used)) {
                best = int(i);
                best_common = common;
            }
        }
        if (best < 0) break;  // FIFO: later jobs wait behind this one
        // At least one prompt token must go through the model to produce logits.
        const int n_cached =
            job->params_.cache_prompt ? int(std::min(best_common, job->prompt_.size() - 1)) : 0;
        start_job_locked(job, best, n_cached);
        it = queue_.erase(it);
    }
}

void Scheduler::finish(const std::shared_ptr<Job>& job, FinishReason reason,
                       const std::string& error) {
    const auto now = clock::now();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (job->slot_ >= 0) {
            Slot& s = slots_[size_t(job->slot_)];
            if (s.job == job) s.job.reset();
            // After a failed step the cache contents are unknown.
            if (reason == FinishReason::Error) s.cached.clear();
            // A request whose client left frees its cells at once (a session's cancel only
            // stops its generation: the session keeps its context).
            if (reason == FinishReason::Cancelled && job->pinned_slot_ < 0) {
                s.cached.clear();
                eng_.backend().kv_truncate(job->slot_, 0);
            }
        }
        totals_.jobs_finished++;
        totals_.finished_by_reason[int(reason)]++;
    }
    cv_.notify_all();  // a freed slot may admit a queued job
    {
        std::lock_guard<std::mutex> jl(job->mu_);
        job->finish_ = reason;
        job->error_ = error;
        job->stats_.kv_end = job->slot_ >= 0 ? job->pos_ : job->stats_.kv_end;
        if (job->slot_ >= 0) {
            const auto t_first = job->t_first_ == clock::time_point{} ? now : job->t_first_;
            job->stats_.prompt_seconds = seconds(t_first - job->t_start_);
            job->stats_.decode_seconds = seconds(now - t_first);
        }
    }
    job->cv_.notify_all();
}

void Scheduler::record_step(double secs, int tokens, int prompt_tokens, int generated) {
    std::lock_guard<std::mutex> lk(mu_);
    totals_.steps++;
    totals_.step_tokens += uint64_t(tokens);
    totals_.step_seconds += secs;
    totals_.prompt_tokens += uint64_t(prompt_tokens);
    totals_.generated_tokens += uint64_t(generated);
    const auto now = clock::now();
    window_.push_back({now, prompt_tokens, generated});
    while (!window_.empty() && seconds(now - window_.front().t) > kRateWindowSeconds)
        window_.pop_front();
}

void Scheduler::run() {
    std::vector<std::shared_ptr<Job>> active;
    for (;;) {
        active.clear();
        {
            std::unique_lock<std::mutex> lk(mu_);
            for (;;) {
                if (stop_) break;
                // Jobs ended while queued leave the queue at once (they never held a slot).
                for (auto it = queue_.begin(); it != queue_.end();) {
                    if ((*it)->end_requested()) {
                        std::shared_ptr<Job> j = *it;
                        it = queue_.erase(it);
                        lk.unlock();
                        finish(j, FinishReason(j->end_.load()));
                        lk.lock();
                    } else {
                        ++it;
                    }
                }
                admit_locked();
                for (const Slot& s : slots_)
                    if (s.job) active.push_back(s.job);
                if (!active.empty()) break;
                cv_.wait(lk);
            }
            if (stop_) {
                std::vector<std::shared_ptr<Job>> all(queue_.begin(), queue_.end());
                queue_.clear();
                for (const Slot& s : slots_)
                    if (s.job) all.push_back(s.job);
                lk.unlock();
                for (auto& j : all) finish(j, FinishReason::Cancelled);
                return;
            }
        }
        // Oldest first: prompt chunks go to the jobs that have waited longest.
        std::sort(active.begin(), active.end(),
                  [](const std::shared_ptr<Job>& a, const std::shared_ptr<Job>& b) {
                      return a->t_start_ < b->t_start_;
                  });
        // Running jobs that were cancelled or stopped free their slot before the step.
        std::erase_if(active, [&](const std::shared_ptr<Job>& j) {
            if (!j->end_requested()) return false;
            finish(j, FinishReason(j->end_.load()));
            return true;
        });
        if (active.empty()) continue;
        if (TokenDraw draw; active.size() == 1 && can_feed(*active[0], draw)) {
            decode_fed(active[0], draw);
            continue;
        }
        batch_.clear();
        row_jobs_.clear();
        int budget = max_step_;
        for (const auto& j : active)
            if (j->decoding_) {
                batch_.add(j->last_, j->pos_, j->slot_, true);
                row_jobs_.push_back(j);
                budget--;
            }
        std::vector<std::pair<Job*, int>> chunks;  // prompt tokens fed per job this step
        for (const auto& j : active) {
            if (j->decoding_ || budget <= 0) continue;
            const int n = std::min(budget, int(j->prompt_.size()) - j->n_fed_);
            for (int i = 0; i < n; i++) {
                const int k = j->n_fed_ + i;
                const bool last = k + 1 == int(j->prompt_.size());
                batch_.add(j->prompt_[size_t(k)], j->pos_ + i, j->slot_, last);
                if (last) row_jobs_.push_back(j);
            }
            chunks.emplace_back(j.get(), n);
            budget -= n;
        }
        step(active, chunks);
    }
}

void Scheduler::step(const std::vector<std::shared_ptr<Job>>& active,
                     const std::vector<std::pair<Job*, int>>& chunks) {
    const auto t0 = clock::now();
    try {
        eng_.forward(batch_);  // the logits stay on the device: each row's sampler asks below
    } catch (const std::exception& e) {
        // The step failed as a whole: every job in it ends with the reason; the others go on.
        const std::string msg = std::string("the forward step failed: ") + e.what();
        for (const auto& j : active) {
            const bool in_batch =
                j->decoding_ || std::any_of(chunks.begin(), chunks.end(), [&](const auto& c) {
                    return c.first == j.get() && c.second > 0;
                });
            if (in_batch) finish(j, FinishReason::Error, msg);
        }
        return;
    }
    // The step's tokens are in the cache now.
    int n_prompt = 0;
    for (const auto& [j, n] : chunks) {
        std::vector<int32_t>& cached = slots_[size_t(j->slot_)].cached;
        cached.insert(cached.end(), j->prompt_.begin() + j->n_fed_,
                      j->prompt_.begin() + j->n_fed_ + n);
        j->n_fed_ += n;
        j->pos_ += n;
        n_prompt += n;
    }
    for (const auto& j : active)
        if (j->decoding_) {
            slots_[size_t(j->slot_)].cached.push_back(j->last_);
            j->pos_++;
        }

    const auto now = clock::now();
    int n_generated = 0;
    // Log-probabilities need the whole row; every other row's sampler gets only its candidates
    // from the device, all rows in one selection.
    draws_.resize(row_jobs_.size());  // (each draw keeps its row's buffer from step to step)
    for (size_t r = 0; r < row_jobs_.size(); r++) {
        const std::shared_ptr<Job>& j = row_jobs_[r];
        Engine::Draw& d = draws_[r];
        d.sampler = j->sampler_;
        d.row = int(r);
        d.bias = &j->params_.logit_bias;
        d.whole_row = j->params_.n_logprobs >= 0;
    }
    eng_.sample_rows(draws_);
    for (size_t r = 0; r < row_jobs_.size(); r++) {
        const std::shared_ptr<Job>& j = row_jobs_[r];
        const Engine::Draw& d = draws_[r];
        if (!d.error.empty()) {
            finish(j, FinishReason::Error, "sampling failed: " + d.error);
            continue;
        }
        if (deliver(j, d.token, &d, now) != Delivery::Ended) n_generated++;
    }
    record_step(seconds(clock::now() - t0), batch_.size(), n_prompt, n_generated);
}

Scheduler::Delivery Scheduler::deliver(const std::shared_ptr<Job>& j, int32_t id,
                                       const Engine::Draw* d, clock::time_point now) {
    j->sampler_->accept(id);
    if (!j->decoding_) {
        j->decoding_ = true;
        j->t_first_ = now;
    }
    if (eng_.model().tokenizer->is_eog(id)) {
        {
            std::lock_guard<std::mutex> jl(j->mu_);
            j->eog_ = id;
        }
        finish(j, FinishReason::Stop);
        return Delivery::Ended;
    }
    GeneratedToken g;
    g.id = id;
    if (d && d->whole_row) {
        const float* lg = d->logits.data();  // the biased row
        const auto [mx, lse] = log_norm(lg, eng_.n_vocab());
        g.logprob = float(double(lg[id] - mx) - lse);
        if (j->params_.n_logprobs > 0)
            for (const auto& [tid, lp] : j->sampler_->top_logprobs(lg, j->params_.n_logprobs))
                g.top.push_back({tid, lp});
    }
    {
        std::lock_guard<std::mutex> jl(j->mu_);
        j->ready_.push_back(std::move(g));
        j->stats_.n_generated = ++j->n_gen_;
    }
    j->cv_.notify_all();
    if ((j->params_.max_tokens > 0 && j->n_gen_ >= j->params_.max_tokens) || j->pos_ >= n_ctx_) {
        finish(j, FinishReason::Length);  // at a full context: no room to feed the token back
        return Delivery::Last;
    }
    j->last_ = id;
    return Delivery::Continues;
}

bool Scheduler::can_feed(const Job& j, TokenDraw& draw) const {
    static const bool allowed = env_switch("NT_SCHEDULER_FED");  // (=0: never, for A/B runs)
    if (!allowed || !j.decoding_ || !eng_.pipelines() || j.params_.n_logprobs >= 0 ||
        !j.sampler_->device_draw(draw))
        return false;
    // The logit bias goes with the draw (ids past the vocabulary change nothing, as on the host).
    for (const auto& [id, b] : j.params_.logit_bias) {
        if (id < 0 || id >= eng_.n_vocab()) continue;
        if (draw.n_bias == kMaxDrawBias) return false;
        draw.bias_id[draw.n_bias] = id;
        draw.bias[draw.n_bias++] = b;
    }
    return !fed_run_interrupted(j);
}

bool Scheduler::fed_run_interrupted(const Job& j) const {
    if (j.end_requested()) return true;
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return true;
    const bool slot_free = std::any_of(slots_.begin(), slots_.end(),
                                       [](const Slot& s) { return !s.job && !s.reserved; });
    return std::any_of(queue_.begin(), queue_.end(), [&](const std::shared_ptr<Job>& q) {
        return q->pinned_slot_ >= 0 || slot_free || q->end_requested();
    });
}

void Scheduler::decode_fed(const std::shared_ptr<Job>& j, const TokenDraw& draw) {
    FedSteps steps(eng_, *j->sampler_, draw, j->slot_);
    const char* stage = "the forward step failed: ";
    try {
        auto t0 = clock::now();
        steps.enqueue(j->last_, j->pos_);
        for (;;) {
            // The token the queued step draws is fed back at pos_ + 1, in a step enqueued
            // before it is known here, unless it is the job's last or the run ends after it. A
            // step fed past the end only wrote a cache cell that the next step there rewrites.
            const bool more =
                j->pos_ + 1 < n_ctx_ &&
                (j->params_.max_tokens <= 0 || j->n_gen_ + 1 < j->params_.max_tokens) &&
                !fed_run_interrupted(*j);
            if (more) steps.enqueue(kFedToken, j->pos_ + 1);
            stage = "sampling failed: ";
            const DrawnToken t = steps.take(more ? j->pos_ + 1 : -1);
            stage = "the forward step failed: ";
            slots_[size_t(j->slot_)].cached.push_back(j->last_);
            j->pos_++;
            const auto now = clock::now();
            const Delivery dl = deliver(j, t.token, nullptr, now);
            record_step(seconds(now - t0), 1, 0, dl == Delivery::Ended ? 0 : 1);
            t0 = now;
            if (dl != Delivery::Continues || !more) break;
        }
    } catch (const std::exception& e) {
        steps.drop();
        finish(j, FinishReason::Error, stage + std::string(e.what()));
    }
}

}  // namespace nt
