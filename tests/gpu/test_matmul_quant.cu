// The per-type block arithmetic of the CUDA matmul kernels (src/backend/cuda/matmul_quant.cuh),
// run on the host: its functions are __host__ __device__, so every bit manipulation is checked
// against nt::dequantize_row without a GPU. The GPU tests (test_matmul.cpp) then cover the
// kernels that call them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/matmul_quant.cuh"
#include "core/f16.h"
#include "quant/quant.h"

namespace {

using nt::GgmlType;
using namespace nt::cuda::detail;

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return float(next() >> 40) * (1.f / 16777216.f); }
};

// nb random blocks of type T, with finite scales (nt::block_scales) of either sign.
template <GgmlType T>
std::vector<uint8_t> random_blocks(int nb, Rng& rng) {
    constexpr int kBytes = Quant<T>::kBlockBytes;
    std::vector<uint8_t> w(size_t(nb) * kBytes);
    for (auto& b : w) b = uint8_t(rng.next());
    for (int i = 0; i < nb; ++i)
        for (int o : {nt::block_scales(T).d, nt::block_scales(T).min})
            if (o >= 0) {
                const uint16_t h = nt::f32_to_f16((rng.uniform() * 2.f - 1.f) * 0.01f);
                std::memcpy(&w[size_t(i) * kBytes + o], &h, 2);
            }
    return w;
}

template <GgmlType T>
void check_type() {
    using Q = Quant<T>;
    const int nb = 97, n = nb * Q::kBlockElems;
    Rng rng(uint64_t(T) + 1);
    const std::vector<uint8_t> w = random_blocks<T>(nb, rng);

    // dequant8 (the GEMM path's FP16 copy, before rounding) equals dequantize_row exactly.
    std::vector<float> ref(n), mine(n);
    nt::dequantize_row(T, w.data(), ref.data(), n);
    for (int i = 0; i < nb; ++i)
        for (int g = 0; g < Q::kBlockElems / 8; ++g)
            Q::dequant8(&w[size_t(i) * Q::kBlockBytes], g,
                        &mine[size_t(i) * Q::kBlockElems + g * 8]);
    for (int i = 0; i < n; ++i) ASSERT_EQ(mine[i], ref[i]) << nt::type_name(T) << " element " << i;

    // The lanes' partial dot products over all parts of each block equal the float dot product
    // with the int8-rounded activations, block by block.
    std::vector<int8_t> xq(n);
    std::vector<float2> xd(n / 32);
    std::vector<float> xr(n);
    // One scale per 32 elements, or per 256 for the K-quants (their activations are Q8_K).
    std::vector<float> xs(n);
    for (float& v : xs) v = (rng.uniform() * 2.f - 1.f) * 3.f;
    const int group = Q::kBlockElems == 256 ? 256 : 32;
    for (int g0 = 0; g0 < n; g0 += group) {
        float amax = 0.f;
        for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(xs[g0 + i]));
        const float d = amax / 127.f, id = 127.f / amax;
        for (int b = g0 / 32; b < (g0 + group) / 32; ++b) {
            int s = 0;
            for (int i = 0; i < 32; ++i) {
                const int q = int(std::nearbyint(xs[b * 32 + i] * id));
                xq[b * 32 + i] = int8_t(q);
                xr[b * 32 + i] = d * float(q);
                s += q;
            }
            xd[b] = {d, d * float(s)};
        }
    }
    for (int i = 0; i < nb; ++i) {
        double want = 0, mag = 0, got = 0;
        for (int e = 0; e < Q::kBlockElems; ++e) {
            const double p = double(ref[i * Q::kBlockElems + e]) * xr[i * Q::kBlockElems + e];
            want += p;
            mag += std::fabs(p);
        }
        for (int part = 0; part < Q::kLanesPerBlock; ++part) {
            typename Q::W wr;
            typename Q::X xv;
            Q::load_w(&w[size_t(i) * Q::kBlockBytes], part, wr);
            Q::load_x(&xq[i * Q::kBlockElems], &xd[i * Q::kBlockElems / 32], part, xv);
            got += Q::dot(wr, xv);
        }
        ASSERT_LE(std::fabs(got - want), 1e-5 * mag) << nt::type_name(T) << " block " << i;
    }
}

// The CPU's dot product of a whole row, bit for bit, from the lanes' double shares (dot())
// summed in an order unlike any kernel's (last block and last part first) and rounded once:
// what every GEMV kernel relies on to give the CPU backend's bits whatever its own order. The
// activations are the CPU's quantization, laid out as the GPU's quantize_q8 lays them out (int8
// quants, and per 32 elements (d, d * sum q) for Q8_0 and Q8_K, (d, s) for Q8_1).
template <GgmlType T>
void check_row_sums() {
    using Q = Quant<T>;
    const GgmlType at = nt::vec_dot_type(T);
    for (int nb : {1, 7, 18, 56}) {
        const int n = nb * Q::kBlockElems;
        Rng rng(uint64_t(T) * 31 + uint64_t(nb));
        std::vector<float> x(n);
        for (float& v : x) v = (rng.uniform() * 2.f - 1.f) * 4.f;
        std::vector<uint8_t> act(nt::row_bytes(at, n));
        nt::quantize_row(at, x.data(), act.data(), n);
        std::vector<int8_t> xq(n);
        std::vector<float2> xd(n / 32);
        for (int b32 = 0; b32 < n / 32; ++b32) {
            const int8_t* q = nullptr;
            float d = 0.f, s = 0.f;
            if (at == GgmlType::Q8_K) {
                const auto* blk = reinterpret_cast<const nt::block_q8_K*>(act.data()) + b32 / 8;
                q = blk->qs + (b32 % 8) * 32;
                d = blk->d;
            } else if (at == GgmlType::Q8_1) {
                const auto* blk = reinterpret_cast<const nt::block_q8_1*>(act.data()) + b32;
                q = blk->qs;
                d = nt::f16_to_f32(blk->d);
                s = nt::f16_to_f32(blk->s);
            } else {
                const auto* blk = reinterpret_cast<const nt::block_q8_0*>(act.data()) + b32;
                q = blk->qs;
                d = nt::f16_to_f32(blk->d);
            }
            int sum = 0;
            for (int i = 0; i < 32; ++i) sum += (xq[size_t(b32) * 32 + i] = q[i]);
            xd[size_t(b32)] = {d, at == GgmlType::Q8_1 ? s : d * float(sum)};
        }
        for (int row = 0; row < 9; ++row) {
            const std::vector<uint8_t> w = random_blocks<T>(nb, rng);
            double sum = 0;
            for (int i = nb - 1; i >= 0; --i)
                for (int part = Q::kLanesPerBlock - 1; part >= 0; --part) {
                    typename Q::W wr;
                    typename Q::X xv;
                    Q::load_w(&w[size_t(i) * Q::kBlockBytes], part, wr);
                    Q::load_x(&xq[size_t(i) * Q::kBlockElems], &xd[size_t(i) * Q::kBlockElems / 32],
                              part, xv);
                    sum += Q::dot(wr, xv);
                }
            const float got = float(sum), want = nt::vec_dot(T, n, w.data(), act.data());
            ASSERT_EQ(0, std::memcmp(&got, &want, sizeof(float)))
                << nt::type_name(T) << " blocks " << nb << " row " << row << ": " << got
                << " against the CPU's " << want;
        }
    }
}

TEST(MatmulQuantHost, RowSumsAreTheCpus) {
    check_row_sums<GgmlType::Q4_0>();
    check_row_sums<GgmlType::Q4_1>();
    check_row_sums<GgmlType::Q5_0>();
    check_row_sums<GgmlType::Q5_1>();
    check_row_sums<GgmlType::Q8_0>();
    check_row_sums<GgmlType::Q2_K>();
    check_row_sums<GgmlType::Q3_K>();
    check_row_sums<GgmlType::Q4_K>();
    check_row_sums<GgmlType::Q5_K>();
    check_row_sums<GgmlType::Q6_K>();
}

TEST(MatmulQuantHost, Q4_0) {
    check_type<GgmlType::Q4_0>();
}
TEST(MatmulQuantHost, Q4_1) {
    check_type<GgmlType::Q4_1>();
}
TEST(MatmulQuantHost, Q5_0) {
    check_type<GgmlType::Q5_0>();
}
TEST(MatmulQuantHost, Q5_1) {
    check_type<GgmlType::Q5_1>();
}
TEST(MatmulQuantHost, Q8_0) {
    check_type<GgmlType::Q8_0>();
}
TEST(MatmulQuantHost, Q2_K) {
    check_type<GgmlType::Q2_K>();
}
TEST(MatmulQuantHost, Q3_K) {
    check_type<GgmlType::Q3_K>();
}
TEST(MatmulQuantHost, Q4_K) {
    check_type<GgmlType::Q4_K>();
}
TEST(MatmulQuantHost, Q5_K) {
    check_type<GgmlType::Q5_K>();
}
TEST(MatmulQuantHost, Q6_K) {
    check_type<GgmlType::Q6_K>();
}

// The GEMV's packed Q4_K/Q5_K scales and mins (scale_min_k4_packed, byte permutes and masks)
// against the per-value definition (scale_min_k4_words) for every lane part, on words that put
// every byte value in every position, and the unsigned-by-signed dp4a against its definition.
TEST(MatmulQuantHost, PackedScalesAndUnsignedDp4a) {
    for (uint32_t t = 0; t < 256 * 4; ++t) {
        const uint32_t b = t & 255, r = t >> 8;
        uint32_t v[3];
        for (int k = 0; k < 3; ++k) {
            v[k] = 0;
            for (int y = 0; y < 4; ++y)
                v[k] |= uint32_t(uint8_t(b + 37 * (4 * k + y) + 59 * r)) << (8 * ((y + r) & 3));
        }
        for (int c = 0; c < 4; ++c) {
            int sc1, m1, sc2, m2;
            scale_min_k4_words(2 * c, v[0], v[1], v[2], sc1, m1);
            scale_min_k4_words(2 * c + 1, v[0], v[1], v[2], sc2, m2);
            const uint32_t want =
                uint32_t(sc1) | uint32_t(sc2) << 8 | uint32_t(m1) << 16 | uint32_t(m2) << 24;
            ASSERT_EQ(want, scale_min_k4_packed(c, v[0], v[1], v[2])) << "part " << c << " t " << t;
        }
    }
    for (int a = 0; a < 256; ++a)
        for (int x = -128; x < 128; ++x) {
            const uint32_t aw = uint32_t(a) | uint32_t(255 - a) << 8 | uint32_t(a ^ 0x5A) << 16 | 7u << 24;
            const int xw = int(uint32_t(uint8_t(x)) | uint32_t(uint8_t(-x - 1)) << 8 |
                               uint32_t(uint8_t(x / 2)) << 16 | uint32_t(uint8_t(3)) << 24);
            const int want = 5 + a * x + (255 - a) * (-x - 1) + (a ^ 0x5A) * (x / 2) + 7 * 3;
            ASSERT_EQ(want, dp4a_us(aw, xw, 5)) << a << " " << x;
        }
}

// Q6_K's wgmma A (q6k_scale_digits, q6k_digit_times), exhaustively: every int8 scale in every
// byte lane, beside other scales, splits into digits in [-3, 4] with 64 c2 + 8 c1 + c0 = sc;
// every digit times every quant gives the int8 c (q - 32) in its lane, beside other quants.
TEST(MatmulQuantHost, Q6kScaleDigits) {
    const auto lane = [](uint32_t v, int b) { return int((v >> (8 * b)) & 0xFF); };
    for (int sc = -128; sc < 128; ++sc)
        for (int p = 0; p < 4; ++p) {
            int want[4];
            uint32_t s = 0;
            for (int b = 0; b < 4; ++b) {
                want[b] = b == p ? sc : int(int8_t(uint8_t(sc * 37 + 91 * b + 11)));
                s |= uint32_t(uint8_t(want[b])) << (8 * b);
            }
            uint32_t e[3];
            q6k_scale_digits(s, e);
            for (int b = 0; b < 4; ++b) {
                int c[3];
                for (int m = 0; m < 3; ++m) {
                    c[m] = lane(e[m], b) - 3;
                    ASSERT_TRUE(c[m] >= -3 && c[m] <= 4) << "scale " << want[b] << " digit " << m;
                }
                ASSERT_EQ(want[b], 64 * c[2] + 8 * c[1] + c[0]) << "lane " << b;
            }
        }
    for (uint32_t e = 0; e < 8; ++e)
        for (int q = 0; q < 64; ++q)
            for (int p = 0; p < 4; ++p) {
                int qs[4];
                uint32_t u = 0;
                for (int b = 0; b < 4; ++b) {
                    qs[b] = b == p ? q : (q * 7 + 13 * b + 5) & 63;
                    u |= uint32_t(qs[b]) << (8 * b);
                }
                const uint32_t a = q6k_digit_times(e, u);
                for (int b = 0; b < 4; ++b)
                    ASSERT_EQ((int(e) - 3) * (qs[b] - 32), int(int8_t(uint8_t(lane(a, b)))))
                        << "digit " << int(e) - 3 << " quant " << qs[b];
            }
}

}  // namespace
