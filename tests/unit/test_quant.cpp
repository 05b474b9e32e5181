// Quant formats on the CPU: dequantization and quantization bit-exact against gguf-py, dot
// products against float dot products of the dequantized rows, and every SIMD level against the
// portable scalar path (bit for bit).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace nt {
namespace {

using quant_detail::SimdLevel;

using testing_quant::kWeightTypes;

// ---------------------------------------------------------------------------------------------
// Bit-exact against gguf-py: tests/python/gen_quant_fixtures.py writes the fixtures.

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read fixture " + path);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                                std::istreambuf_iterator<char>());
}

class QuantGgufPy : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (std::system("python3 -c 'import gguf, numpy' >/dev/null 2>&1") != 0) {
            skip_reason_ =
                "python3 with the gguf and numpy packages is not available "
                "(pip install gguf numpy) - cannot compare with gguf-py";
            return;
        }
        dir_ = std::string(NT_BINARY_DIR) + "/quant_fixtures." + std::to_string(getpid());
        const std::string cmd = "python3 '" + std::string(NT_SOURCE_DIR) +
                                "/tests/python/gen_quant_fixtures.py' '" + dir_ + "'";
        generated_ = std::system(cmd.c_str()) == 0;
    }
    static void TearDownTestSuite() {
        if (!dir_.empty()) std::filesystem::remove_all(dir_);
    }
    void SetUp() override {
        if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
        ASSERT_TRUE(generated_) << "tests/python/gen_quant_fixtures.py failed";
    }
    static std::vector<uint8_t> fixture(const std::string& name) {
        return read_file(dir_ + "/" + name);
    }

    static inline std::string dir_, skip_reason_;
    static inline bool generated_ = false;
};

TEST_F(QuantGgufPy, DequantizeIsBitExact) {
    const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q8_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                              GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K};
    for (GgmlType t : types) {
        const std::string name = type_name(t);
        SCOPED_TRACE(name);
        const std::vector<uint8_t> in = fixture("dq_" + name + ".bin");
        const std::vector<uint8_t> want = fixture("dq_" + name + ".f32");
        const int64_t n = int64_t(want.size() / 4);
        ASSERT_GT(n, 0);
        ASSERT_EQ(in.size(), row_bytes(t, n));
        std::vector<float> got(size_t(n), -1.0f);
        dequantize_row(t, in.data(), got.data(), n);
        if (std::memcmp(got.data(), want.data(), want.size()) != 0) {
            for (int64_t i = 0; i < n; ++i) {
                float w;
                std::memcpy(&w, want.data() + 4 * i, 4);
                if (std::memcmp(&w, &got[size_t(i)], 4) != 0) {
                    FAIL() << "first mismatch at element " << i << ": got " << got[size_t(i)]
                           << ", gguf-py " << w;
                }
            }
        }
    }
}

TEST_F(QuantGgufPy, QuantizeIsBitExact) {
    const GgmlType types[] = {GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K};
    for (GgmlType t : types) {
        const std::string name = type_name(t);
        SCOPED_TRACE(name);
        const std::vector<uint8_t> in = fixture("q_" + name + ".f32");
        const std::vector<uint8_t> want = fixture("q_" + name + ".bin");
        const int64_t n = int64_t(in.size() / 4);
        ASSERT_EQ(want.size(), row_bytes(t, n));
        std::vector<float> x(static_cast<size_t>(n));
        std::memcpy(x.data(), in.data(), in.size());
        std::vector<uint8_t> got(want.size(), 0xAA);
        quantize_row(t, x.data(), got.data(), n);
        const size_t bb = size_t(traits(t).block_bytes);
        for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(int(got[i]), int(want[i]))
                << "byte " << i % bb << " of block " << i / bb << " differs";
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Quantization without gguf-py: round trips and invariants.

TEST(Quantize, ActivationFormatsRoundTrip) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n = 1024;
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = nd(rng);
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K}) {
        SCOPED_TRACE(type_name(t));
        const int be = traits(t).block_elems;
        std::vector<uint8_t> q(row_bytes(t, n));
        quantize_row(t, x.data(), q.data(), n);
        dequantize_row(t, q.data(), y.data(), n);
        for (int64_t b = 0; b < n / be; ++b) {
            float amax = 0.0f;
            for (int j = 0; j < be; ++j) amax = std::max(amax, std::fabs(x[b * be + j]));
            // Half a quantization step plus the f16 rounding of the scale.
            const float tol = amax / 127 * 0.5f + amax * 1e-3f;
            for (int j = 0; j < be; ++j) ASSERT_NEAR(y[b * be + j], x[b * be + j], tol);
        }
        if (t == GgmlType::Q8_K) {
            const auto* blk = reinterpret_cast<const block_q8_K*>(q.data());
            for (int64_t b = 0; b < n / be; ++b) {
                for (int g = 0; g < 16; ++g) {
                    int s = 0;
                    for (int j = 0; j < 16; ++j) s += blk[b].qs[g * 16 + j];
                    ASSERT_EQ(s, blk[b].bsums[g]);
                }
            }
        }
    }
}

// Inputs that stress the activation quantizers' roundings: exact halves after scaling (ties of
// roundf and of round-to-even), ties for the largest magnitude with opposite signs, zero and
// subnormal blocks, f16 overflow and subnormal boundaries, infinities and NaNs (f16/bf16 only).
std::vector<float> tricky_inputs(bool with_specials, std::mt19937& rng) {
    const int64_t n = 256 * 8;
    std::vector<float> x(n);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> k127(-126, 125);
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = nd(rng) * std::pow(10.0f, float(i / 256) - 3.0f);
    // Block 1 (elements 256..511): largest magnitude 127 twice with opposite signs, the rest on
    // exact halves: Q8_0/Q8_1 scale 1 (roundf ties), Q8_K iscale +-1 (round-to-even ties).
    for (int64_t i = 256; i < 512; ++i) x[size_t(i)] = float(k127(rng)) + 0.5f;
    for (int64_t i = 256; i < 512; i += 32) x[size_t(i)] = (i / 32) % 2 ? 127.0f : -127.0f;
    x[300] = 127.0f;
    // Block 2: zeros. Block 3: subnormals and tiny values.
    for (int64_t i = 512; i < 768; ++i) x[size_t(i)] = 0.0f;
    for (int64_t i = 768; i < 1024; ++i) x[size_t(i)] = float(i - 900) * 1e-41f;
    if (with_specials) {
        const float specials[] = {65504.0f,       65519.99f,      65520.0f,       -65520.0f,
                                  6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                                  1e-45f,         INFINITY,       -INFINITY,      NAN,
                                  -NAN,           1.00048828125f, 1.0009765625f,  3.3895314e38f};
        for (size_t j = 0; j < std::size(specials); ++j) x[1024 + j] = specials[j];
    }
    return x;
}

TEST(Quantize, SimdLevelsAreBitExact) {
    std::mt19937 rng(21);
    for (GgmlType t :
         {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16, GgmlType::BF16}) {
        const bool floats = t == GgmlType::F16 || t == GgmlType::BF16;
        const std::vector<float> x = tricky_inputs(floats, rng);
        const int64_t n = int64_t(x.size());
        std::vector<uint8_t> want(row_bytes(t, n));
        quant_detail::quantize_row_scalar(t, x.data(), want.data(), n);
        for (SimdLevel l : testing_quant::simd_levels()) {
            const quant_detail::QuantizeFn f = quant_detail::quantize_kernel(l, t);
            if (!f) continue;
            SCOPED_TRACE(std::string(type_name(t)) + " level=" + quant_detail::level_name(l));
            std::vector<uint8_t> got(want.size(), 0xAA);
            f(x.data(), got.data(), n);
            for (size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(int(got[i]), int(want[i])) << "byte " << i;
            // Odd lengths for the float formats (the vector loop's tail).
            if (floats) {
                std::vector<uint8_t> w7(14), g7(14);
                quant_detail::quantize_row_scalar(t, x.data() + 1020, w7.data(), 7);
                f(x.data() + 1020, g7.data(), 7);
                ASSERT_EQ(w7, g7);
            }
        }
    }
}

TEST(Quantize, RejectsWhatItCannotDo) {
    std::vector<float> x(256, 1.0f);
    std::vector<uint8_t> out(2048);
    EXPECT_FALSE(can_quantize(GgmlType::Q4_K));
    EXPECT_TRUE(can_quantize(GgmlType::Q8_K));
    EXPECT_THROW(quantize_row(GgmlType::Q4_K, x.data(), out.data(), 256), Error);
    EXPECT_THROW(quantize_row(GgmlType::Q8_0, x.data(), out.data(), 40), Error);
    EXPECT_THROW(dequantize_row(GgmlType::Q4_K, out.data(), x.data(), 100), Error);
    EXPECT_THROW(vec_dot_type(GgmlType::Q8_K), Error);
}

// ---------------------------------------------------------------------------------------------
// Dot products.

// Random weight rows: random bytes everywhere, with the scale fields set to values of a
// realistic size (so the float rounding of the result is meaningful) and mins of the same order
// as the scaled quants.
struct Weights {
    GgmlType type;
    int64_t n;
    int rows;
    size_t stride;  // bytes between rows (>= row_bytes: tests padded rows too)
    std::vector<uint8_t> data;
};

void put_f16(uint8_t* p, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(p, &h, 2);
}

Weights random_weights(GgmlType t, int64_t n, int rows, std::mt19937& rng, size_t pad = 0) {
    Weights w{t, n, rows, row_bytes(t, n) + pad, {}};
    w.data.resize(w.stride * size_t(rows));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    std::bernoulli_distribution coin(0.5);
    for (auto& b : w.data) b = uint8_t(byte(rng));
    auto sgn = [&] { return coin(rng) ? 1.0f : -1.0f; };
    const int be = traits(t).block_elems, bb = traits(t).block_bytes;
    for (int r = 0; r < rows; ++r) {
        uint8_t* row = w.data.data() + size_t(r) * w.stride;
        if (t == GgmlType::F32) {
            for (int64_t i = 0; i < n; ++i) {
                const float v = sgn() * u(rng) * 0.05f;
                std::memcpy(row + 4 * i, &v, 4);
            }
            continue;
        }
        if (t == GgmlType::F16 || t == GgmlType::BF16) {
            for (int64_t i = 0; i < n; ++i) {
                const float v = sgn() * u(rng) * 0.05f;
                const uint16_t h = t == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
                std::memcpy(row + 2 * i, &h, 2);
            }
            continue;
        }
        for (int64_t b = 0; b < n / be; ++b) {
            uint8_t* blk = row + b * bb;
            const float d = u(rng) * 0.004f;
            switch (t) {
                case GgmlType::Q4_0:
                case GgmlType::Q5_0:
                case GgmlType::Q8_0:
                    put_f16(blk, sgn() * d);
                    break;
                case GgmlType::Q4_1:
                case GgmlType::Q5_1:
                    put_f16(blk, d);
                    put_f16(blk + 2, -u(rng) * d * (t == GgmlType::Q4_1 ? 8 : 16));
                    break;
                case GgmlType::Q2_K:
                    put_f16(blk + 80, d * 0.1f);
                    put_f16(blk + 82, d * 0.05f);
                    break;
                case GgmlType::Q3_K:
                    put_f16(blk + 108, d * 0.1f);
                    break;
                case GgmlType::Q4_K:
                case GgmlType::Q5_K:
                    put_f16(blk, d * 0.05f);
                    put_f16(blk + 2, d * 0.1f);
                    break;
                case GgmlType::Q6_K:
                    put_f16(blk + 208, d * 0.02f);
                    break;
                default:
                    break;
            }
        }
    }
    return w;
}

// Activation rows: floats (kept for the float reference) and their vec_dot_type encoding.
struct Acts {
    int64_t n;
    int cols;
    size_t stride;
    std::vector<float> x;       // cols * n
    std::vector<uint8_t> data;  // cols * stride
};

Acts random_acts(GgmlType wt, int64_t n, int cols, std::mt19937& rng, size_t pad = 0) {
    const GgmlType at = vec_dot_type(wt);
    Acts a{n, cols, row_bytes(at, n) + pad, {}, {}};
    a.x.resize(size_t(n) * size_t(cols));
    a.data.resize(a.stride * size_t(cols));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int c = 0; c < cols; ++c) {
        const float scale = std::pow(10.0f, float(c % 5) - 2.0f);
        for (int64_t i = 0; i < n; ++i) a.x[size_t(c) * size_t(n) + size_t(i)] = nd(rng) * scale;
        quantize_row(at, a.x.data() + size_t(c) * size_t(n), a.data.data() + size_t(c) * a.stride,
                     n);
    }
    return a;
}

std::vector<float> dequant(GgmlType t, const uint8_t* row, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    dequantize_row(t, row, v.data(), n);
    return v;
}

// Size of the terms a dot product adds: sum |w_i * a_i|, and apart the min part of each weight
// (a kernel adds d*q*a and m*a as separate terms, so its rounding error scales with both).
// The min part comes from dequantizing with the scale d zeroed.
struct Magnitude {
    double all = 0;  // sum |w_i a_i|
    double min = 0;  // sum |m_i a_i|
};

// What a correct kernel may differ from the exact dot product of the dequantized rows: float
// rounding (rel of the terms) plus, for Q4_1/Q5_1, the f16 rounding of the Q8_1 activation's
// s = d * sum(q) field that their min term multiplies (2^-11 relative, llama.cpp's semantics).
double tolerance(GgmlType t, const Magnitude& m, double rel) {
    double tol = rel * (m.all + 2 * m.min) + 1e-30;
    if (vec_dot_type(t) == GgmlType::Q8_1) tol += 5e-4 * m.min;
    return tol;
}

Magnitude term_magnitude(GgmlType t, const uint8_t* row, const std::vector<float>& a, int64_t n) {
    const std::vector<float> w = dequant(t, row, n);
    Magnitude mag;
    for (int64_t i = 0; i < n; ++i) mag.all += std::fabs(double(w[size_t(i)]) * a[size_t(i)]);
    int min_off = -1;
    switch (t) {
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
            min_off = 2;
            break;
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
            min_off = 2;
            break;
        case GgmlType::Q2_K:
            min_off = 82;
            break;
        default:
            break;
    }
    if (min_off >= 0) {
        const int bb = traits(t).block_bytes;
        std::vector<uint8_t> only_min(row, row + row_bytes(t, n));
        const int d_off = t == GgmlType::Q2_K ? 80 : 0;
        for (size_t b = 0; b < only_min.size(); b += size_t(bb))
            std::memset(&only_min[b + d_off], 0, 2);
        const std::vector<float> m = dequant(t, only_min.data(), n);
        for (int64_t i = 0; i < n; ++i) mag.min += std::fabs(double(m[size_t(i)]) * a[size_t(i)]);
    }
    return mag;
}

std::vector<int64_t> lengths_for(GgmlType t) {
    const int be = traits(t).block_elems;
    if (be == 1) return {1, 7, 32, 100, 4096 + 24};
    if (be == 32) return {32, 96, 32 * 37, 4096};
    return {256, 768, 256 * 11, 4096};
}

// vec_dot at every SIMD level against the dequantized rows: tight against the dequantized
// activations (only float rounding differs), loose against the original floats (the activation
// quantization error).
TEST(VecDot, MatchesFloatDotOfDequantizedRows) {
    std::mt19937 rng(11);
    for (GgmlType t : kWeightTypes) {
        const GgmlType at = vec_dot_type(t);
        for (int64_t n : lengths_for(t)) {
            const Weights w = random_weights(t, n, 3, rng);
            const Acts a = random_acts(t, n, 3, rng);
            for (int r = 0; r < w.rows; ++r) {
                const uint8_t* wr = w.data.data() + size_t(r) * w.stride;
                const std::vector<float> wf = dequant(t, wr, n);
                for (int c = 0; c < a.cols; ++c) {
                    const uint8_t* ar = a.data.data() + size_t(c) * a.stride;
                    const std::vector<float> aq = dequant(at, ar, n);
                    const float* ax = a.x.data() + size_t(c) * size_t(n);
                    double ref_q = 0, ref_x = 0, mag_x = 0;
                    for (int64_t i = 0; i < n; ++i) {
                        ref_q += double(wf[size_t(i)]) * aq[size_t(i)];
                        ref_x += double(wf[size_t(i)]) * ax[i];
                        mag_x += std::fabs(double(wf[size_t(i)]) * ax[i]);
                    }
                    const Magnitude mag_q = term_magnitude(t, wr, aq, n);
                    for (SimdLevel l : testing_quant::simd_levels()) {
                        SCOPED_TRACE(std::string(type_name(t)) + " n=" + std::to_string(n) +
                                     " level=" + quant_detail::level_name(l));
                        float got = 0;
                        quant_detail::tile_kernel(l, t)(n, 1, 1, wr, 0, ar, 0, &got, 1);
                        EXPECT_NEAR(got, ref_q, tolerance(t, mag_q, 1e-5));
                        EXPECT_NEAR(got, ref_x, 1e-2 * mag_x);
                    }
                }
            }
        }
    }
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Every level's tile kernel against the scalar level, over tile shapes that reach each code
// path (one column: decoding's row-direct kernels; a few; full and partial column groups of the
// prompt's transposed tiles; full and partial row tiles), with padded strides. The quantized
// types match bit for bit (dot_scalar.cpp's header), so that the CPU backend's results do not
// depend on the instruction set; the float types only to rounding (AVX2 adds the elements in 8
// fma chains, AVX-512 in 16, the scalar path in 8 without fma).
TEST(VecDot, SimdLevelsEqualScalar) {
    std::mt19937 rng(12);
    const int col_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 64};
    const int rows = 37;  // two full 16-row tiles and a partial one (8-row tiles at avx2)
    for (GgmlType t : kWeightTypes) {
        const bool exact = traits(t).block_elems > 1;
        for (int64_t n : lengths_for(t)) {
            const Weights w = random_weights(t, n, rows, rng, 8);
            const Acts a = random_acts(t, n, 64, rng, 16);
            std::vector<Magnitude> mag(size_t(rows) * 64);
            for (int c = 0; c < 64; ++c) {
                const std::vector<float> aq =
                    dequant(vec_dot_type(t), a.data.data() + size_t(c) * a.stride, n);
                for (int r = 0; r < rows; ++r)
                    mag[size_t(c) * rows + size_t(r)] =
                        term_magnitude(t, w.data.data() + size_t(r) * w.stride, aq, n);
            }
            const size_t out_stride = size_t(rows) + 3;
            std::vector<float> ref(out_stride * 64, NAN);
            quant_detail::tile_kernel(SimdLevel::Scalar, t)(n, rows, 64, w.data.data(), w.stride,
                                                            a.data.data(), a.stride, ref.data(),
                                                            out_stride);
            for (SimdLevel l : testing_quant::simd_levels()) {
                for (int cols : col_counts) {
                    SCOPED_TRACE(std::string(type_name(t)) + " n=" + std::to_string(n) + " cols=" +
                                 std::to_string(cols) + " level=" + quant_detail::level_name(l));
                    std::vector<float> out(out_stride * 64, NAN);
                    quant_detail::tile_kernel(l, t)(n, rows, cols, w.data.data(), w.stride,
                                                    a.data.data(), a.stride, out.data(),
                                                    out_stride);
                    for (int c = 0; c < 64; ++c) {
                        for (size_t r = 0; r < out_stride; ++r) {
                            const float got = out[size_t(c) * out_stride + r];
                            if (c >= cols || r >= size_t(rows)) {
                                ASSERT_TRUE(std::isnan(got)) << "wrote outside the tile";
                                continue;
                            }
                            const float want = ref[size_t(c) * out_stride + r];
                            ASSERT_FALSE(std::isnan(want)) << "row " << r << " col " << c;
                            if (exact) {
                                ASSERT_EQ(bits(got), bits(want))
                                    << "row " << r << " col " << c << ": " << got << " vs " << want;
                            } else {
                                const Magnitude& m = mag[size_t(c) * rows + r];
                                ASSERT_NEAR(got, want, 1e-5 * (m.all + 2 * m.min) + 1e-30)
                                    << "row " << r << " col " << c;
                            }
                        }
                    }
                }
            }
        }
    }
}

// The quantized dot products' arithmetic against its specification (dot_scalar.cpp's header),
// independently of any kernel's order: each block's term T_b is formed exactly (long double has
// room for every one), the terms are summed, and the kernel's float must be that sum rounded
// once. A GPU summing the same double terms in another order relies on exactly this. Near ties
// are the exception the specification allows: where the double rounding of the kernel's (or a
// GPU's) sum may decide the float, i.e. where float(S - B) != float(S + B) for a bound B on
// that rounding, the output is not checked; they must stay rare (exact sums, ties included,
// are checked: every double operation on them is exact). The float chains this replaced (one
// float rounding per block) failed here at 47-69% of the outputs, depending on the type.


// One block's integers, read through dequantize_row with its scale fields replaced: d = 1 and
// the min 0 give q (with sub-block scales and offsets), d = 0 and the min 1 give -min per
// element, both exact in float.
std::vector<int> block_ints(GgmlType t, const uint8_t* blk, bool mins) {
    const int be = traits(t).block_elems, bb = traits(t).block_bytes;
    const BlockScales f = block_scales(t);
    std::vector<uint8_t> b(blk, blk + bb);
    put_f16(&b[size_t(f.d)], mins ? 0.0f : 1.0f);
    if (f.min >= 0) put_f16(&b[size_t(f.min)], mins ? 1.0f : 0.0f);
    std::vector<float> v(size_t(be), NAN);
    dequantize_row(t, b.data(), v.data(), be);
    std::vector<int> q(static_cast<size_t>(be));
    for (int i = 0; i < be; ++i) {
        q[size_t(i)] = int(v[size_t(i)]);
        EXPECT_EQ(float(q[size_t(i)]), v[size_t(i)]) << "not an integer";
    }
    return q;
}

// The exponent of the lowest set bit of x != 0 (x = odd integer * 2^result).
int lsb_exponent(long double x) {
    int e;
    const long double fr = std::frexp(std::fabs(x), &e);  // x = fr * 2^e, 0.5 <= fr < 1
    const auto m = uint64_t(std::ldexp(fr, 64));          // exact: x has at most 64 bits
    return e - 64 + __builtin_ctzll(m);
}

struct SpecSum {
    long double sum = 0;  // sum of the exact terms
    long double mag = 0;  // sum of their magnitudes
    int lsb = INT_MAX;    // the lowest set bit of any term (all are multiples of 2^lsb)
    double reversed = 0;  // the double terms summed last block first (a GPU's freedom)

    void add(long double t) {
        sum += t;
        mag += std::fabs(t);
        if (t != 0) lsb = std::min(lsb, lsb_exponent(t));
    }
    // Whether every double operation on these terms is exact, in any order: the terms and all
    // partial sums are multiples of 2^lsb below 2^(53 + lsb) in magnitude. Needs long double's
    // 64 bits, so that the terms themselves are exact here.
    bool exact_in_double() const {
        return std::numeric_limits<long double>::digits >= 64 &&
               (lsb == INT_MAX || mag < std::ldexp(1.0L, 53 + lsb));
    }
};

// The specification for weight row w against activation row a (n elements).
SpecSum spec_dot(GgmlType t, int64_t n, const uint8_t* w, const uint8_t* a) {
    using ld = long double;
    using quant_detail::load_u16;
    const GgmlType at = vec_dot_type(t);
    const int be = traits(t).block_elems, wb = traits(t).block_bytes, ab = traits(at).block_bytes;
    const BlockScales f = block_scales(t);
    const bool k = at == GgmlType::Q8_K, q8_1 = at == GgmlType::Q8_1;
    const size_t qs_off = k || q8_1 ? 4 : 2;  // the activation quants in their block
    SpecSum r;
    std::vector<double> terms;
    for (int64_t b = 0; b < n / be; ++b) {
        const uint8_t* x = w + size_t(b) * size_t(wb);
        const uint8_t* y = a + size_t(b) * size_t(ab);
        double dy;
        if (k) {
            float d;
            std::memcpy(&d, y, 4);
            dy = d;
        } else {
            dy = f16_to_f32(load_u16(y));
        }
        const auto* yq = reinterpret_cast<const int8_t*>(y + qs_off);
        const double dw = f16_to_f32(load_u16(x + f.d));
        int64_t isum = 0;
        const std::vector<int> q = block_ints(t, x, false);
        for (int i = 0; i < be; ++i) isum += int64_t(q[size_t(i)]) * yq[i];
        r.add(ld(isum) * (ld(dw) * ld(dy)));
        double term = double(isum) * (dw * dy);
        if (f.min >= 0) {
            const double dmin = f16_to_f32(load_u16(x + f.min));
            if (k) {  // - msum * (dmin * dy), msum = sum(min_j * bsum_j)
                int64_t msum = 0;
                const std::vector<int> m = block_ints(t, x, true);
                for (int i = 0; i < be; ++i) msum -= int64_t(m[size_t(i)]) * yq[i];
                r.add(-ld(msum) * (ld(dmin) * ld(dy)));
                term -= double(msum) * (dmin * dy);
            } else {  // + m * s, s the Q8_1 block's f16 field
                const double s = f16_to_f32(load_u16(y + 2));
                r.add(ld(dmin) * ld(s));
                term += dmin * s;
            }
        }
        terms.push_back(term);
    }
    for (size_t i = terms.size(); i-- > 0;) r.reversed += terms[i];
    return r;
}

TEST(VecDot, QuantizedMatchesSpecification) {
    std::mt19937 rng(14);
    const int rows = 37, max_cols = 9;
    long checked = 0, near_ties = 0;
    for (GgmlType t : kWeightTypes) {
        if (traits(t).block_elems == 1) continue;  // the float weights are not specified
        for (int64_t n : lengths_for(t)) {
            const Weights w = random_weights(t, n, rows, rng, 8);
            const Acts a = random_acts(t, n, max_cols, rng, 16);
            const int64_t nb = n / traits(t).block_elems;
            // What the double roundings can move a sum by: at most 4 per block (the product, the
            // min's product, two additions), each half an ulp of a partial sum <= mag; plus the
            // long double sum's own roundings.
            const long double per_mag =
                (4.0L * nb + 4) *
                (std::ldexp(1.0L, -53) + std::numeric_limits<long double>::epsilon());
            std::vector<float> want(size_t(rows) * max_cols);
            std::vector<bool> tie(want.size());
            for (int c = 0; c < max_cols; ++c) {
                for (int r = 0; r < rows; ++r) {
                    const SpecSum s = spec_dot(t, n, w.data.data() + size_t(r) * w.stride,
                                               a.data.data() + size_t(c) * a.stride);
                    const long double B = s.exact_in_double() ? 0.0L : per_mag * s.mag;
                    const size_t i = size_t(c) * rows + size_t(r);
                    want[i] = float(s.sum);
                    tie[i] = float(s.sum - B) != float(s.sum + B);
                    if (!tie[i]) {
                        ASSERT_EQ(bits(float(s.reversed)), bits(want[i])) << "the bound B is wrong";
                    }
                }
            }
            for (SimdLevel l : testing_quant::simd_levels()) {
                for (int cols = 1; cols <= max_cols; ++cols) {
                    SCOPED_TRACE(std::string(type_name(t)) + " n=" + std::to_string(n) + " cols=" +
                                 std::to_string(cols) + " level=" + quant_detail::level_name(l));
                    const size_t out_stride = size_t(rows) + 3;
                    std::vector<float> out(out_stride * size_t(cols), NAN);
                    quant_detail::tile_kernel(l, t)(n, rows, cols, w.data.data(), w.stride,
                                                    a.data.data(), a.stride, out.data(),
                                                    out_stride);
                    for (int c = 0; c < cols; ++c) {
                        for (int r = 0; r < rows; ++r) {
                            const size_t i = size_t(c) * rows + size_t(r);
                            const float got = out[size_t(c) * out_stride + size_t(r)];
                            if (tie[i]) {
                                ++near_ties;
                                continue;
                            }
                            ++checked;
                            ASSERT_EQ(bits(got), bits(want[i]))
                                << "row " << r << " col " << c << ": " << got << " vs " << want[i]
                                << " (exact sum rounded once)";
                        }
                    }
                }
            }
        }
    }
    EXPECT_GT(checked, 10000);
    EXPECT_LE(near_ties, checked / 1000) << near_ties << " near ties of " << checked;
}

// The public entry points: vec_dot_tile equals vec_dot element by element at the active level,
// to the bit (the kernels are batch-invariant; test_batch_invariance.cpp covers every level).
TEST(VecDot, TileEqualsVecDot) {
    std::mt19937 rng(13);
    for (GgmlType t : kWeightTypes) {
        const int64_t n = lengths_for(t)[1];
        const int rows = 9, cols = 20;
        const Weights w = random_weights(t, n, rows, rng);
        const Acts a = random_acts(t, n, cols, rng);
        std::vector<float> out(size_t(rows) * cols);
        vec_dot_tile(t, n, rows, cols, w.data.data(), w.stride, a.data.data(), a.stride, out.data(),
                     rows);
        for (int c = 0; c < cols; ++c) {
            const uint8_t* ar = a.data.data() + size_t(c) * a.stride;
            for (int r = 0; r < rows; ++r) {
                const uint8_t* wr = w.data.data() + size_t(r) * w.stride;
                const float one = vec_dot(t, n, wr, ar), got = out[size_t(c) * rows + r];
                EXPECT_EQ(std::memcmp(&got, &one, sizeof one), 0)
                    << type_name(t) << " row " << r << " col " << c << ": " << got << " vs " << one;
            }
        }
    }
}

TEST(Simd, LevelSelection) {
    using quant_detail::level_from_env;
    const SimdLevel best = quant_detail::cpu_level();
    EXPECT_EQ(level_from_env(nullptr), best);
    EXPECT_EQ(level_from_env(""), best);
    EXPECT_EQ(level_from_env("scalar"), SimdLevel::Scalar);
    EXPECT_EQ(level_from_env("avx2"), std::min(best, SimdLevel::Avx2));
    EXPECT_EQ(level_from_env("avx512"), best);
    EXPECT_THROW(level_from_env("sse9"), Error);
    // The process's level follows NT_SIMD (CI runs this binary under several values).
    const char* env = std::getenv("NT_SIMD");
    const bool valid = !env || !*env || !std::strcmp(env, "scalar") || !std::strcmp(env, "avx2") ||
                       !std::strcmp(env, "avx512");
    if (valid) {
        EXPECT_STREQ(simd_level(), quant_detail::level_name(level_from_env(env)));
    } else {
        EXPECT_THROW(simd_level(), Error);
    }
}

}  // namespace
}  // namespace nt
