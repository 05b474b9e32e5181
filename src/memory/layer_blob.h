// A streamed layer as one blob: the file ranges that hold its nine tensors, rounded out to
// 4 KiB so O_DIRECT can read them straight into pinned memory, and where each tensor lands in
// the blob. The same bytes sit in a pinned RAM blob, a staging buffer or a VRAM slot, so one
// DMA moves a whole layer and a tensor's offset is the same in every tier.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/llama.h"

namespace nt::mem {

constexpr size_t kBlobAlign = 4096;  // O_DIRECT alignment (file offset, length, buffer)

inline uint64_t align_down(uint64_t x, uint64_t a) { return x / a * a; }
inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// A file range copied to blob_offset; all three are multiples of kBlobAlign.
struct FileExtent {
    uint64_t file_offset = 0;
    uint64_t length = 0;
    uint64_t blob_offset = 0;
};

constexpr int kLayerTensors = 9;  // attn_norm wq wk wv wo ffn_norm w1 w3 w2, in that order

struct TensorRange {
    uint64_t file_offset = 0;
    uint64_t nbytes = 0;
};

struct LayerBlob {
    std::vector<FileExtent> extents;
    uint64_t bytes = 0;  // blob size, a multiple of kBlobAlign
    std::array<uint64_t, kLayerTensors> tensor_offset{};
    uint64_t payload = 0;  // bytes of tensor data (bytes - payload is alignment padding)
};

// Lays out one layer. Tensors whose aligned ranges lie within `merge_gap` bytes of each other
// share an extent (one read, one copy); a file offset keeps its position modulo 4 KiB in the
// blob, so a tensor aligned to 32 bytes in the file is aligned to 32 bytes in VRAM. Throws
// nt::Error when a tensor is not 16-byte aligned in the file (the CUDA kernels need that).
LayerBlob layout_layer(const std::array<TensorRange, kLayerTensors>& tensors,
                       uint64_t merge_gap = uint64_t(1) << 20);

// The layer's tensors as file ranges, from views that point into the mapped file at `base`.
std::array<TensorRange, kLayerTensors> layer_ranges(const LayerWeights& w, const uint8_t* base);

// The layer's views re-pointed into a blob at `blob` (any memory holding the blob's bytes).
LayerWeights views_in_blob(const LayerWeights& w, const LayerBlob& b, const void* blob);

// The nine views of a layer in the fixed order above.
std::array<const WeightView*, kLayerTensors> layer_views(const LayerWeights& w);
std::array<WeightView*, kLayerTensors> layer_views(LayerWeights& w);

}  // namespace nt::mem
