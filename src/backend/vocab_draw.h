// The draw over the whole vocabulary (no top-k: OpenAI's default request), defined so that a GPU
// can make it in parallel and still draw, bit for bit, the token the host's sampler draws.
//
// Each token's weight is exp((logit - max) / temperature) as a float (0 below min-p's floor).
// Their sum is taken in a fixed hierarchy, every sum a double in id order: runs of kDrawRun
// consecutive ids, blocks of kDrawBlockRuns runs, then the blocks. The draw's target is the
// uniform's share of the total, and the walk descends the same hierarchy: the block whose
// running sum reaches the target, then within it the run, then the token, each level starting
// from the running sum before the element chosen above it (walk_level). A sequential sum over
// 128k tokens is a chain a GPU cannot split; this one is 4008 independent runs, 126 blocks and
// one short chain, and its result is one number however it is computed.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define NT_HOST_DEVICE __host__ __device__
#else
#define NT_HOST_DEVICE
#endif

namespace nt {

constexpr int kDrawRun = 32;
constexpr int kDrawBlockRuns = 32;
constexpr int kDrawBlock = kDrawRun * kDrawBlockRuns;

// One level of the walk over weights w(0..n) with the draw's target: the first element whose
// running sum (from `run`) reaches the target and whose weight is positive, or the last
// positive one where rounding left the target past the running sum. `run` becomes the running
// sum before the element returned, where the level below starts.
template <class W>
NT_HOST_DEVICE int walk_level(const W& w, int n, double target, double& run) {
    double r = run, before_last = run;
    int last_positive = 0;
    for (int i = 0; i < n; ++i) {
        const double v = w(i);
        const double before = r;
        r += v;
        if (v > 0.0) {
            if (r >= target) {
                run = before;
                return i;
            }
            last_positive = i;
            before_last = before;
        }
    }
    run = before_last;
    return last_positive;
}

}  // namespace nt
