// The thread pool must hand every index to exactly one thread, job after job, including when
// jobs are tiny and follow each other immediately (the decode pattern).
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/threadpool.h"

namespace nt {

TEST(ThreadPool, EveryIndexExactlyOnceAcrossManyJobs) {
    for (int threads : {1, 2, 3, 8}) {
        ThreadPool pool(threads);
        for (int64_t n : {1, 2, 7, 64, 1000, 4097}) {
            for (int rep = 0; rep < 200; rep++) {
                std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
                pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int th) {
                    ASSERT_GE(th, 0);
                    ASSERT_LT(th, threads);
                    for (int64_t i = b; i < e; i++) hits[size_t(i)].fetch_add(1);
                });
                for (int64_t i = 0; i < n; i++) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
            }
        }
    }
}

TEST(ThreadPool, GrainKeepsSmallJobsOnTheCaller) {
    ThreadPool pool(4);
    int calls = 0;
    pool.parallel_for(10, 16, [&](int64_t b, int64_t e, int th) {
        calls++;
        EXPECT_EQ(b, 0);
        EXPECT_EQ(e, 10);
        EXPECT_EQ(th, 0);
    });
    EXPECT_EQ(calls, 1);
}

TEST(ThreadPool, SumsMatchSerial) {
    ThreadPool pool(3);
    std::vector<int64_t> v(100000);
    for (size_t i = 0; i < v.size(); i++) v[i] = int64_t(i * 7 % 13);
    for (int rep = 0; rep < 50; rep++) {
        std::atomic<int64_t> total{0};
        pool.parallel_for(int64_t(v.size()), 100, [&](int64_t b, int64_t e, int) {
            int64_t s = 0;
            for (int64_t i = b; i < e; i++) s += v[size_t(i)];
            total += s;
        });
        int64_t expect = 0;
        for (int64_t x : v) expect += x;
        ASSERT_EQ(total.load(), expect);
    }
}

}  // namespace nt
