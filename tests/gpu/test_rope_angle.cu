// The rope's angles (src/backend/cuda/rope.cuh), run on the host: sincos_lean and rope_angle are
// __host__ __device__, and a double fused multiply-add rounds alike on both, so these are the
// GPU's bits. They must be the CPU backend's (CpuBackend::rope_rows: the float angle, std::cos
// and std::sin in double, each rounded to float) at every position a long context reaches. The
// GPU tests (CudaBackend.RopeAttention and the rope kernels') then cover the kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/rope.cuh"

namespace {

using nt::cuda::detail::rope_angle;
using nt::cuda::detail::sincos_lean;

// Every position below 131072 (Llama 3.1's context) for every pair of a 128-dim head, at the
// bases of Llama 2 (10000) and Llama 3 (500000), and with Llama 3.1's long-context factors
// (the low frequencies divided by 8), as CudaBackend::init computes them.
TEST(RopeAngleHost, EveryPositionGivesTheCpusFloats) {
    int64_t differ = 0, checked = 0;
    for (float base : {10000.f, 500000.f})
        for (bool scaled : {false, true})
            for (int i = 0; i < 64; i++) {
                float f = std::pow(base, -2.0f * float(i) / 128.f);
                if (scaled && i >= 32) f /= 8.f;
                for (int p = 0; p < 131072; p++) {
                    float c, s;
                    rope_angle(p, f, c, s);
                    const float theta = float(p) * f;
                    const float cc = float(std::cos(double(theta)));
                    const float sc = float(std::sin(double(theta)));
                    if (c != cc || s != sc) {
                        if (differ++ < 5)
                            ADD_FAILURE() << "position " << p << ", frequency " << f << ": cos "
                                          << c << " sin " << s << " against " << cc << " " << sc;
                    }
                    checked++;
                }
            }
    EXPECT_EQ(differ, 0) << "of " << checked;
}

// Arguments of either sign across the whole range the reduction is for (up to 2^31), spread
// evenly in their exponent; and the points where the quadrant turns.
TEST(RopeAngleHost, LargeAndTurningArgumentsGiveTheCpusFloats) {
    uint64_t state = 1;
    auto next = [&] {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    int64_t differ = 0;
    auto check = [&](float x) {
        double s, c;
        sincos_lean(double(x), &s, &c);
        if (float(c) != float(std::cos(double(x))) || float(s) != float(std::sin(double(x))))
            if (differ++ < 5) ADD_FAILURE() << "x = " << x;
    };
    for (int k = 0; k < 2000000; k++) {
        const float x = float(std::exp2(double(next() >> 11) * 0x1p-53 * 31.0));
        check(next() & 1 ? -x : x);
    }
    for (int q = -40; q <= 40; q++) {
        const float x = float(q * 1.5707963267948966);
        for (float y : {x, std::nextafter(x, -INFINITY), std::nextafter(x, INFINITY)}) check(y);
    }
    check(0.f);
    EXPECT_EQ(differ, 0);
}

}  // namespace
