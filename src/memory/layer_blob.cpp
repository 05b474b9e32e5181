#include "memory/layer_blob.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace nt::mem {

std::array<const WeightView*, kLayerTensors> layer_views(const LayerWeights& w) {
    return {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.ffn_norm, &w.w1, &w.w3, &w.w2};
}
std::array<WeightView*, kLayerTensors> layer_views(LayerWeights& w) {
    return {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.ffn_norm, &w.w1, &w.w3, &w.w2};
}

LayerBlob layout_layer(const std::array<TensorRange, kLayerTensors>& t, uint64_t merge_gap) {
    std::array<int, kLayerTensors> order;
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return t[size_t(a)].file_offset < t[size_t(b)].file_offset; });
    LayerBlob b;
    for (int i : order) {
        const TensorRange& r = t[size_t(i)];
        if (r.file_offset % 16 != 0)
            fail("a tensor at file offset %llu is not 16-byte aligned, which streaming needs; "
                 "rewrite the file with general.alignment 32 (llama.cpp's default).",
                 (unsigned long long)r.file_offset);
        const uint64_t lo = align_down(r.file_offset, kBlobAlign);
        const uint64_t hi = align_up(r.file_offset + std::max<uint64_t>(r.nbytes, 1), kBlobAlign);
        FileExtent* last = b.extents.empty() ? nullptr : &b.extents.back();
        if (last && lo <= last->file_offset + last->length + merge_gap) {
            // Grow the current extent (the bytes in a small gap are read and carried along).
            const uint64_t end = std::max(last->file_offset + last->length, hi);
            last->length = end - last->file_offset;
        } else {
            b.extents.push_back({lo, hi - lo, 0});
            last = &b.extents.back();
        }
        b.payload += r.nbytes;
    }
    uint64_t off = 0;
    for (FileExtent& e : b.extents) {
        e.blob_offset = off;
        off += e.length;
    }
    b.bytes = off;
    // Each tensor sits in the extent that covers it, at the same distance from its start.
    for (int i = 0; i < kLayerTensors; i++) {
        const TensorRange& r = t[size_t(i)];
        for (const FileExtent& e : b.extents)
            if (r.file_offset >= e.file_offset && r.file_offset + r.nbytes <= e.file_offset + e.length) {
                b.tensor_offset[size_t(i)] = e.blob_offset + (r.file_offset - e.file_offset);
                break;
            }
    }
    return b;
}

std::array<TensorRange, kLayerTensors> layer_ranges(const LayerWeights& w, const uint8_t* base) {
    std::array<TensorRange, kLayerTensors> r{};
    const auto v = layer_views(w);
    for (int i = 0; i < kLayerTensors; i++) {
        const auto* p = static_cast<const uint8_t*>(v[size_t(i)]->data);
        r[size_t(i)] = {uint64_t(p - base), v[size_t(i)]->nbytes};
    }
    return r;
}

LayerWeights views_in_blob(const LayerWeights& w, const LayerBlob& b, const void* blob) {
    LayerWeights out = w;
    const auto v = layer_views(out);
    for (int i = 0; i < kLayerTensors; i++)
        v[size_t(i)]->data = static_cast<const uint8_t*>(blob) + b.tensor_offset[size_t(i)];
    return out;
}

}  // namespace nt::mem
