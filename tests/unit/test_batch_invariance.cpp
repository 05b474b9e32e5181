// Batch invariance of the CPU path: a matmul column, and a sequence's logits, are bit-identical
// whatever else shares the batch (how many columns, in which place, on how many threads), at
// every SIMD level. This is what lets the continuous-batching server promise that a greedy
// request returns exactly what it returns alone (tests/unit/test_scheduler.cpp,
// tests/python/test_server.py rely on it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/f16.h"
#include "engine/engine.h"
#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant_test_util.h"
#include "smol_model_test.h"

namespace nt {
namespace {

using quant_detail::SimdLevel;

using testing_quant::kWeightTypes;
const int kBatchSizes[] = {1, 2, 3, 7, 16, 33};

// Runs the process at one SIMD level for a scope.
struct AtLevel {
    SimdLevel old;
    explicit AtLevel(SimdLevel l) : old(quant_detail::set_active_level(l)) {}
    ~AtLevel() { quant_detail::set_active_level(old); }
};

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Rows of type t from Gaussian floats (quantized with the reference rounding where we can),
// for the K-quants random bytes with scale fields of a realistic size. Magnitudes vary by row so
// that sums round differently in different orders.
std::vector<uint8_t> random_weights(GgmlType t, int64_t n, int rows, std::mt19937& rng) {
    const size_t rb = row_bytes(t, n);
    std::vector<uint8_t> w(rb * size_t(rows));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    if (can_quantize(t)) {
        std::vector<float> x(static_cast<size_t>(n));
        for (int r = 0; r < rows; ++r) {
            const float scale = std::pow(10.0f, float(r % 4) - 3.0f);
            for (auto& v : x) v = nd(rng) * scale;
            quantize_row(t, x.data(), w.data() + size_t(r) * rb, n);
        }
        return w;
    }
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (auto& b : w) b = uint8_t(byte(rng));
    auto put = [](uint8_t* p, float v) {
        const uint16_t h = f32_to_f16(v);
        std::memcpy(p, &h, 2);
    };
    const int bb = traits(t).block_bytes;
    for (size_t off = 0; off < w.size(); off += size_t(bb)) {
        uint8_t* b = w.data() + off;
        const float d = u(rng) * 1e-3f;
        switch (t) {
            case GgmlType::Q2_K:
                put(b + 80, d);
                put(b + 82, d * 0.5f);
                break;
            case GgmlType::Q3_K:
                put(b + 108, d);
                break;
            case GgmlType::Q4_K:
            case GgmlType::Q5_K:
                put(b, d * 0.5f);
                put(b + 2, d);
                break;
            case GgmlType::Q6_K:
                put(b + 208, d * 0.2f);
                break;
            default:
                ADD_FAILURE() << "no weight generator for " << type_name(t);
        }
    }
    return w;
}

// cols activation rows of n floats, each of its own magnitude, and their vec_dot_type encoding
// (stride: the encoded row's bytes plus a little padding).
struct Acts {
    std::vector<float> x;
    std::vector<uint8_t> q;
    size_t stride = 0;
};

Acts random_acts(GgmlType wt, int64_t n, int cols, std::mt19937& rng) {
    const GgmlType at = vec_dot_type(wt);
    Acts a;
    a.stride = row_bytes(at, n) + 8;
    a.x.resize(size_t(n) * size_t(cols));
    a.q.resize(a.stride * size_t(cols));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int c = 0; c < cols; ++c) {
        const float scale = std::pow(10.0f, float(c % 5) - 2.0f);
        float* xr = a.x.data() + size_t(c) * size_t(n);
        for (int64_t i = 0; i < n; ++i) xr[i] = nd(rng) * scale;
        quantize_row(at, xr, a.q.data() + size_t(c) * a.stride, n);
    }
    return a;
}

// Lengths that reach the kernels' tails: float rows not a multiple of the vector width, block
// counts not a multiple of the row-direct kernels' group of four.
std::vector<int64_t> lengths_for(GgmlType t) {
    const int be = traits(t).block_elems;
    if (be == 1) return {100, 576};
    if (be == 32) return {32 * 18, 32 * 37};
    return {256 * 3, 256 * 6};
}

// Every kernel (each SIMD level's vec_dot_tile): column j of a tile of any width equals the
// one-column result for the same activation, bit for bit, wherever it sits among the columns
// and whichever rows the tile covers.
TEST(BatchInvariance, TileColumnsEqualTheOneColumnResult) {
    std::mt19937 rng(31);
    const int rows = 37;  // two full 16-row tiles and a partial one (and 8-row tiles at avx2)
    const int pool = 40;  // distinct activation rows to pick batches from
    for (GgmlType t : kWeightTypes) {
        for (int64_t n : lengths_for(t)) {
            const std::vector<uint8_t> w = random_weights(t, n, rows, rng);
            const size_t ws = row_bytes(t, n);
            const Acts a = random_acts(t, n, pool, rng);
            for (SimdLevel l : testing_quant::simd_levels()) {
                SCOPED_TRACE(std::string(type_name(t)) + " n=" + std::to_string(n) +
                             " level=" + quant_detail::level_name(l));
                const quant_detail::TileFn tile = quant_detail::tile_kernel(l, t);
                ASSERT_NE(tile, nullptr);
                // The reference: one column at a time over all rows.
                std::vector<float> ref(size_t(pool) * rows);
                for (int c = 0; c < pool; ++c)
                    tile(n, rows, 1, w.data(), ws, a.q.data() + size_t(c) * a.stride, a.stride,
                         ref.data() + size_t(c) * rows, 1);
                // Sub-ranges of rows alone (thread partitions, partial tiles).
                for (auto [r0, nr] : {std::pair{0, 1}, {3, 21}, {20, 17}, {36, 1}}) {
                    std::vector<float> out(static_cast<size_t>(nr));
                    for (int c = 0; c < pool; c += 13) {
                        tile(n, nr, 1, w.data() + size_t(r0) * ws, ws,
                             a.q.data() + size_t(c) * a.stride, a.stride, out.data(), 1);
                        for (int r = 0; r < nr; ++r)
                            ASSERT_EQ(bits(out[size_t(r)]), bits(ref[size_t(c) * rows + r0 + r]))
                                << "rows " << r0 << "+" << nr << ", row " << r0 + r << " col " << c;
                    }
                }
                for (int B : {1, 2, 3, 5, 7, 9, 16, 33, 64}) {
                    for (int start : {0, 11, 29}) {
                        // B columns picked from the pool with a stride coprime to its size, so
                        // each activation lands in a different place for each start.
                        std::vector<int> pick(static_cast<size_t>(B));
                        std::vector<uint8_t> batch(a.stride * size_t(B));
                        for (int k = 0; k < B; ++k) {
                            pick[size_t(k)] = (start + 7 * k) % pool;
                            std::memcpy(batch.data() + size_t(k) * a.stride,
                                        a.q.data() + size_t(pick[size_t(k)]) * a.stride, a.stride);
                        }
                        for (auto [r0, nr] : {std::pair{0, rows}, {5, 19}}) {
                            const size_t os = size_t(nr) + 3;
                            std::vector<float> out(os * size_t(B));
                            tile(n, nr, B, w.data() + size_t(r0) * ws, ws, batch.data(), a.stride,
                                 out.data(), os);
                            for (int k = 0; k < B; ++k)
                                for (int r = 0; r < nr; ++r)
                                    ASSERT_EQ(bits(out[size_t(k) * os + size_t(r)]),
                                              bits(ref[size_t(pick[size_t(k)]) * rows + r0 + r]))
                                        << B << " columns, column " << k << " (activation "
                                        << pick[size_t(k)] << "), row " << r0 + r;
                        }
                    }
                }
            }
        }
    }
}

// The backend's matmul (activation quantization, row and column tiling, threads): the output
// row of an activation is the same alone on one thread as inside any batch on 1..3 threads.
TEST(BatchInvariance, CpuMatmulRowsEqualTheOneRowResult) {
    std::mt19937 rng(32);
    const int rows = 200;  // three 64-row tiles and a partial one, spread over the threads
    const int pool = 80;
    CpuBackend one(1), two(2), three(3);
    CpuBackend* backends[] = {&one, &two, &three};
    for (SimdLevel l : testing_quant::simd_levels()) {
        const AtLevel at(l);
        for (GgmlType t : kWeightTypes) {
            const int64_t n = lengths_for(t)[0];
            SCOPED_TRACE(std::string(type_name(t)) + " level=" + quant_detail::level_name(l));
            const std::vector<uint8_t> wdata = random_weights(t, n, rows, rng);
            const WeightView w{t, n, rows, wdata.data(), wdata.size()};
            std::vector<float> x(size_t(pool) * size_t(n));
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (size_t i = 0; i < x.size(); ++i)
                x[i] = nd(rng) * std::pow(10.0f, float(i / size_t(n) % 5) - 2.0f);
            // The matmul caches its quantized input by address: every input gets its own buffer,
            // alive to the end.
            std::vector<std::vector<float>> inputs;
            auto input = [&](const std::vector<int>& pick) -> const float* {
                std::vector<float> v(pick.size() * size_t(n));
                for (size_t k = 0; k < pick.size(); ++k)
                    std::memcpy(v.data() + k * size_t(n), x.data() + size_t(pick[k]) * size_t(n),
                                size_t(n) * sizeof(float));
                inputs.push_back(std::move(v));
                return inputs.back().data();
            };
            std::vector<float> ref(size_t(pool) * rows);
            for (int c = 0; c < pool; ++c)
                one.matmul(w, input({c}), 1, ref.data() + size_t(c) * rows);
            for (CpuBackend* be : backends) {
                for (int B : {1, 2, 3, 7, 16, 33, 70}) {  // 70: two 64-column tiles
                    std::vector<int> pick(static_cast<size_t>(B));
                    for (int k = 0; k < B; ++k) pick[size_t(k)] = (5 + 13 * k) % pool;
                    std::vector<float> out(size_t(B) * rows);
                    be->matmul(w, input(pick), B, out.data());
                    for (int k = 0; k < B; ++k)
                        for (int r = 0; r < rows; ++r)
                            ASSERT_EQ(bits(out[size_t(k) * rows + size_t(r)]),
                                      bits(ref[size_t(pick[size_t(k)]) * rows + size_t(r)]))
                                << be->threads() << " threads, " << B << " rows, row " << k
                                << " (input " << pick[size_t(k)] << "), output " << r;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The whole model: a sequence's logits alone and inside batches with other sequences.

class ModelBatchInvariance : public testing_smol::SmolModelTest {
  protected:
    static std::unique_ptr<Engine> engine(int threads) {
        EngineOptions o;
        o.n_seq = 3;
        o.n_ctx = 128;
        o.max_batch = 64;
        o.logits_all = true;
        return std::make_unique<Engine>(*model_, std::make_unique<CpuBackend>(threads), o);
    }
    static std::vector<int32_t> tokens(const std::string& text) {
        return model_->tokenizer->encode(text, true, false);
    }
    static int32_t argmax(const float* logits) {
        int32_t best = 0;
        for (int32_t t = 1; t < model_->hp.shape.n_vocab; t++)
            if (logits[t] > logits[best]) best = t;
        return best;
    }
};

// Sequence 0 decoded alone (prompt in one step, then one token per step, one thread) and among
// two other sequences on two threads: its prompt split in chunks that share steps with the
// others' prompts and tokens, then decode steps of three rows with it first, in the middle and
// last. Every logit of sequence 0 must be bit-identical, at every SIMD level.
TEST_F(ModelBatchInvariance, SequenceAloneEqualsInsideABatch) {
    const std::vector<int32_t> a = tokens("The quick brown fox jumps over the lazy dog because");
    const std::vector<int32_t> b = tokens("def fibonacci(n):");
    const std::vector<int32_t> c = tokens("List three colors:\n1.");
    const int n_vocab = model_->hp.shape.n_vocab;
    const int steps = 6;
    for (SimdLevel l : testing_quant::simd_levels()) {
        const AtLevel at(l);
        SCOPED_TRACE(std::string("level=") + quant_detail::level_name(l));

        // Alone.
        std::vector<std::vector<float>> ref;
        std::vector<int32_t> ref_ids;
        {
            auto eng = engine(1);
            Batch batch;
            for (size_t i = 0; i < a.size(); i++) batch.add(a[i], int32_t(i), 0, i + 1 == a.size());
            std::vector<float> logits;
            eng->eval(batch, logits);
            ref.push_back(logits);
            for (int s = 0; s < steps; s++) {
                ref_ids.push_back(argmax(ref.back().data()));
                batch.clear();
                batch.add(ref_ids.back(), int32_t(a.size()) + s, 0, true);
                eng->eval(batch, logits);
                ref.push_back(logits);
            }
        }

        // Among others.
        auto eng = engine(2);
        std::vector<float> logits;
        auto expect_same = [&](const float* got, size_t k, const std::string& what) {
            size_t differ = 0, first = 0;
            for (int t = 0; t < n_vocab; t++) {
                if (bits(got[t]) != bits(ref[k][size_t(t)]) && differ++ == 0) first = size_t(t);
            }
            EXPECT_EQ(differ, 0u) << what << ": " << differ << " logits differ from the lone run, "
                                  << "first at token " << first << " (" << got[first] << " vs "
                                  << ref[k][first] << ")";
        };
        // Step 1: b's whole prompt, then a's first 5 tokens (no logits for a).
        const size_t split = 5;
        Batch batch;
        for (size_t i = 0; i < b.size(); i++) batch.add(b[i], int32_t(i), 1, i + 1 == b.size());
        for (size_t i = 0; i < split; i++) batch.add(a[i], int32_t(i), 0, false);
        eng->eval(batch, logits);
        int32_t next_b = argmax(logits.data());
        // Step 2: c's prompt, b's first token, the rest of a's prompt.
        batch.clear();
        for (size_t i = 0; i < c.size(); i++) batch.add(c[i], int32_t(i), 2, i + 1 == c.size());
        batch.add(next_b, int32_t(b.size()), 1, true);
        for (size_t i = split; i < a.size(); i++) batch.add(a[i], int32_t(i), 0, i + 1 == a.size());
        eng->eval(batch, logits);
        int32_t next_c = argmax(logits.data());
        next_b = argmax(logits.data() + n_vocab);
        expect_same(logits.data() + 2 * size_t(n_vocab), 0, "prompt");
        // Decode: three rows, a's place rotating.
        int32_t pos_b = int32_t(b.size()) + 1, pos_c = int32_t(c.size());
        for (int s = 0; s < steps; s++) {
            const int32_t pos_a = int32_t(a.size()) + s;
            batch.clear();
            const int place = s % 3;
            int row_a = 0, row = 0;
            for (int slot = 0; slot < 3; slot++, row++) {
                if (slot == place) {
                    batch.add(ref_ids[size_t(s)], pos_a, 0, true);
                    row_a = row;
                } else if (slot == (place + 1) % 3) {
                    batch.add(next_b, pos_b++, 1, true);
                } else {
                    batch.add(next_c, pos_c++, 2, true);
                }
            }
            eng->eval(batch, logits);
            expect_same(
                logits.data() + size_t(row_a) * size_t(n_vocab), size_t(s) + 1,
                "decode step " + std::to_string(s) + " (row " + std::to_string(row_a) + " of 3)");
            for (int r = 0; r < 3; r++) {
                if (r == row_a) continue;
                const int32_t id = argmax(logits.data() + size_t(r) * size_t(n_vocab));
                if (batch.seq[size_t(r)] == 1) {
                    next_b = id;
                } else {
                    next_c = id;
                }
            }
        }
    }
}

}  // namespace
}  // namespace nt
