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

void ThreadPool::run_chunks(int thread) {
    for (;;) {
        const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
        if (begin >= n_) break;
        (*fn_)(begin, std::min(n_, begin + chunk_), thread);
    }
}

void ThreadPool::worker(int id) {
    uint64_t seen = 0;
    for (;;) {
        // Spin for a short while: the next job usually follows within microseconds.
        auto spin_start = std::chrono::steady_clock::now();
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen) {
            NT_PAUSE();
            if (++spins % 1024 == 0 &&
                std::chrono::steady_clock::now() - spin_start > std::chrono::milliseconds(2)) {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] { return generation_.load() != seen; });
            }
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load()) return;
        run_chunks(id);
        active_.fetch_sub(1, std::memory_order_acq_rel);
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
    const int64_t chunk = std::max(grain, (n + 4 * n_threads_ - 1) / (4 * n_threads_));
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0, std::memory_order_relaxed);
    active_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lk(mu_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    run_chunks(0);
    while (active_.load(std::memory_order_acquire) != 0) NT_PAUSE();
    fn_ = nullptr;
}

}  // namespace nt
