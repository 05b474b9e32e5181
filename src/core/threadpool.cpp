#include "core/threadpool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define NT_PAUSE() _mm_pause()
#else
#define NT_PAUSE() ((void)0)
#endif

namespace nt {

int ThreadPool::default_threads() {
    unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : int(n);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_threads()) {
    for (int i = 1; i < n_threads_; i++) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(Job& job, int thread) {
    for (;;) {
        const int64_t begin = job.next.fetch_add(job.chunk, std::memory_order_relaxed);
        if (begin >= job.n) break;
        (*job.fn)(begin, std::min(job.n, begin + job.chunk), thread);
        job.done.fetch_add(1, std::memory_order_acq_rel);
    }
}

namespace {
// Spin briefly, then yield: on a machine with more runnable threads than cores a pure spin
// would burn the time slice that the thread we wait for needs.
template <class Pred>
void wait_until(Pred ready) {
    for (int i = 0; !ready(); i++) {
        if (i < 4096) NT_PAUSE();
        else std::this_thread::yield();
    }
}
}  // namespace

void ThreadPool::worker(int id) {
    uint64_t seen = 0;
    for (;;) {
        // Spin (then yield) for a short while: the next job usually follows within microseconds.
        auto idle_start = std::chrono::steady_clock::now();
        for (int i = 0; generation_.load(std::memory_order_acquire) == seen; i++) {
            if (i < 4096) {
                NT_PAUSE();
                continue;
            }
            std::this_thread::yield();
            if (i % 64 == 0 && std::chrono::steady_clock::now() - idle_start > std::chrono::milliseconds(2)) {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] { return generation_.load() != seen; });
            }
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load()) return;
        Job* job = job_.load(std::memory_order_acquire);
        if (!job) continue;
        job->refs.fetch_add(1, std::memory_order_acq_rel);
        // The job may have finished (and been replaced) while this thread was asleep.
        if (generation_.load(std::memory_order_acquire) == seen && job_.load(std::memory_order_acquire) == job)
            run_chunks(*job, id);
        job->refs.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const RangeFn& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    if (n_threads_ == 1 || n <= grain) {
        fn(0, n, 0);
        return;
    }
    // About four chunks per thread balances uneven rows without too many atomics.
    Job& job = job_storage_;
    job.fn = &fn;
    job.n = n;
    job.chunk = std::max(grain, (n + 4 * n_threads_ - 1) / (4 * n_threads_));
    job.n_chunks = (n + job.chunk - 1) / job.chunk;
    job.next.store(0, std::memory_order_relaxed);
    job.done.store(0, std::memory_order_relaxed);
    job_.store(&job, std::memory_order_release);
    {
        std::lock_guard<std::mutex> lk(mu_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    run_chunks(job, 0);
    // Chunks are handed out dynamically, so the caller finishes whatever workers did not take;
    // it only waits for chunks already running elsewhere.
    wait_until([&] { return job.done.load(std::memory_order_acquire) == job.n_chunks; });
    job_.store(nullptr, std::memory_order_release);
    wait_until([&] { return job.refs.load(std::memory_order_acquire) == 0; });
}

}  // namespace nt
