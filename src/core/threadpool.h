// A small pool of persistent worker threads for the CPU backend. Decode steps of a small model
// issue thousands of tiny parallel loops per second, so workers spin briefly between jobs
// before sleeping; the calling thread takes part in every job.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nt {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads <= 0: all hardware threads
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end, thread) over [0, n) split into chunks of at least `grain` items,
    // handed out dynamically. Returns when every chunk is done.
    using RangeFn = std::function<void(int64_t begin, int64_t end, int thread)>;
    void parallel_for(int64_t n, int64_t grain, const RangeFn& fn);

    static int default_threads();

private:
    // One parallel_for. Workers that wake late may still hold a reference after the last chunk
    // is done, so the caller waits for `refs` to drop before the job's memory is reused.
    struct Job {
        const RangeFn* fn = nullptr;
        int64_t n = 0, chunk = 1, n_chunks = 0;
        std::atomic<int64_t> next{0};
        std::atomic<int64_t> done{0};
        std::atomic<int> refs{0};
    };
    void worker(int id);
    static void run_chunks(Job& job, int thread);

    int n_threads_;
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<Job*> job_{nullptr};
    std::atomic<bool> stop_{false};
    Job job_storage_;
};

}  // namespace nt
