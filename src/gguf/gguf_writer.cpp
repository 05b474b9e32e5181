// GGUF v3 writer: metadata in insertion order, tensor data padded to the chosen alignment. It
// refuses anything the reader would refuse, so whatever it writes reads back.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "gguf/gguf.h"

namespace nt {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;
constexpr uint32_t kVersion = 3;
constexpr size_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 16;  // as in the reader

using Sink = std::function<void(const void*, size_t)>;

template <class T>
void put(const Sink& out, T x) {
    out(&x, sizeof x);
}

void put_string(const Sink& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out(s.data(), s.size());
}

// Checks that `type` names a valid GGUF type, the held alternative matches it, the number fits
// its width, and arrays are homogeneous; `what` names the value in the message.
void check_value(const GgufValue& v, const std::string& what, int depth) {
    auto bad = [&](const char* why) {
        fail("GGUF writer: %s (%s) %s.", what.c_str(), gguf_type_name(v.type), why);
    };
    switch (v.type) {
        case GgufValueType::UINT8:
        case GgufValueType::UINT16:
        case GgufValueType::UINT32:
        case GgufValueType::UINT64: {
            const uint64_t* u = std::get_if<uint64_t>(&v.v);
            if (!u) bad("does not hold an unsigned integer");
            const uint64_t max = v.type == GgufValueType::UINT8    ? UINT8_MAX
                                 : v.type == GgufValueType::UINT16 ? UINT16_MAX
                                 : v.type == GgufValueType::UINT32 ? UINT32_MAX
                                                                   : UINT64_MAX;
            if (*u > max) bad("holds a value too large for its width");
            return;
        }
        case GgufValueType::INT8:
        case GgufValueType::INT16:
        case GgufValueType::INT32:
        case GgufValueType::INT64: {
            const int64_t* i = std::get_if<int64_t>(&v.v);
            if (!i) bad("does not hold a signed integer");
            const int64_t max = v.type == GgufValueType::INT8    ? INT8_MAX
                                : v.type == GgufValueType::INT16 ? INT16_MAX
                                : v.type == GgufValueType::INT32 ? INT32_MAX
                                                                 : INT64_MAX;
            if (*i > max || *i < -max - 1) bad("holds a value too large for its width");
            return;
        }
        case GgufValueType::FLOAT32:
        case GgufValueType::FLOAT64:
            if (!std::holds_alternative<double>(v.v)) bad("does not hold a floating-point number");
            return;
        case GgufValueType::BOOL:
            if (!std::holds_alternative<bool>(v.v)) bad("does not hold a bool");
            return;
        case GgufValueType::STRING:
            if (!std::holds_alternative<std::string>(v.v)) bad("does not hold a string");
            return;
        case GgufValueType::ARRAY: {
            const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v.v);
            if (!a || !*a) bad("does not hold an array");
            if (depth >= kMaxArrayDepth) bad("nests arrays too deeply");
            const GgufArray& arr = **a;
            if (uint32_t(arr.elem_type) > uint32_t(GgufValueType::FLOAT64))
                bad("has an unknown element type");
            for (size_t k = 0; k < arr.items.size(); k++) {
                if (arr.items[k].type != arr.elem_type)
                    fail("GGUF writer: %s is an array of %s but item %zu is a %s.", what.c_str(),
                         gguf_type_name(arr.elem_type), k, gguf_type_name(arr.items[k].type));
                check_value(arr.items[k], what + strfmt("[%zu]", k), depth + 1);
            }
            return;
        }
    }
    fail("GGUF writer: %s has unknown type id %u.", what.c_str(), unsigned(v.type));
}

// Values are checked before emission, so the variant accesses below cannot fail.
void put_value(const Sink& out, const GgufValue& v) {
    switch (v.type) {
        case GgufValueType::UINT8:
            put<uint8_t>(out, uint8_t(std::get<uint64_t>(v.v)));
            break;
        case GgufValueType::UINT16:
            put<uint16_t>(out, uint16_t(std::get<uint64_t>(v.v)));
            break;
        case GgufValueType::UINT32:
            put<uint32_t>(out, uint32_t(std::get<uint64_t>(v.v)));
            break;
        case GgufValueType::UINT64:
            put<uint64_t>(out, std::get<uint64_t>(v.v));
            break;
        case GgufValueType::INT8:
            put<int8_t>(out, int8_t(std::get<int64_t>(v.v)));
            break;
        case GgufValueType::INT16:
            put<int16_t>(out, int16_t(std::get<int64_t>(v.v)));
            break;
        case GgufValueType::INT32:
            put<int32_t>(out, int32_t(std::get<int64_t>(v.v)));
            break;
        case GgufValueType::INT64:
            put<int64_t>(out, std::get<int64_t>(v.v));
            break;
        case GgufValueType::FLOAT32:
            put<float>(out, float(std::get<double>(v.v)));
            break;
        case GgufValueType::FLOAT64:
            put<double>(out, std::get<double>(v.v));
            break;
        case GgufValueType::BOOL:
            put<uint8_t>(out, std::get<bool>(v.v) ? 1 : 0);
            break;
        case GgufValueType::STRING:
            put_string(out, std::get<std::string>(v.v));
            break;
        case GgufValueType::ARRAY: {
            const GgufArray& a = *std::get<std::shared_ptr<GgufArray>>(v.v);
            put<uint32_t>(out, uint32_t(a.elem_type));
            put<uint64_t>(out, a.items.size());
            for (const GgufValue& item : a.items) put_value(out, item);
            break;
        }
    }
}

size_t padding(uint64_t pos, size_t alignment) {
    const uint64_t rem = pos % alignment;
    return rem ? size_t(alignment - rem) : 0;
}

struct TensorView {
    const std::string* name;
    GgmlType type;
    const std::vector<int64_t>* ne;
    const std::vector<uint8_t>* bytes;
};

void emit(const Sink& out, const std::vector<std::pair<std::string, GgufValue>>& kv_in,
          const std::vector<TensorView>& tensors, size_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (size_t(1) << 31))
        fail("GGUF writer: alignment %zu is not a power of two from 1 to 2^31.", alignment);

    // general.alignment must say what the layout uses; the default needs no key.
    std::vector<std::pair<std::string, GgufValue>> kv = kv_in;
    bool have_alignment = false;
    for (auto& [key, v] : kv) {
        check_value(v, "key '" + key + "'", 0);
        if (key != "general.alignment") continue;
        have_alignment = true;
        if (!v.is_int() || v.as_int() != int64_t(alignment))
            fail("GGUF writer: general.alignment is %s but the file is written with alignment %zu.",
                 describe_value(v, 4).c_str(), alignment);
    }
    if (!have_alignment && alignment != kDefaultAlignment)
        kv.emplace_back("general.alignment", GgufValue::of_uint(GgufValueType::UINT32, alignment));

    uint64_t pos = 0;
    auto counted = [&](const void* p, size_t n) {
        out(p, n);
        pos += n;
    };
    static const uint8_t kZeros[256] = {};
    auto pad = [&] {
        for (size_t n = padding(pos, alignment); n > 0;) {
            const size_t k = n < sizeof kZeros ? n : sizeof kZeros;
            counted(kZeros, k);
            n -= k;
        }
    };
    const Sink sink = counted;

    put<uint32_t>(sink, kGgufMagic);
    put<uint32_t>(sink, kVersion);
    put<uint64_t>(sink, tensors.size());
    put<uint64_t>(sink, kv.size());
    for (const auto& [key, v] : kv) {
        put_string(sink, key);
        put<uint32_t>(sink, uint32_t(v.type));
        put_value(sink, v);
    }
    uint64_t offset = 0;
    for (const TensorView& t : tensors) {
        put_string(sink, *t.name);
        put<uint32_t>(sink, uint32_t(t.ne->size()));
        for (int64_t x : *t.ne) put<uint64_t>(sink, uint64_t(x));
        put<uint32_t>(sink, uint32_t(t.type));
        put<uint64_t>(sink, offset);
        offset += t.bytes->size() + padding(t.bytes->size(), alignment);
    }
    if (!tensors.empty()) pad();  // without tensors the file ends with the metadata
    for (const TensorView& t : tensors) {
        counted(t.bytes->data(), t.bytes->size());
        pad();
    }
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
    check_value(value, "key '" + key + "'", 0);
    for (auto& kv : kv_) {
        if (kv.first == key) {  // a key set twice keeps its place and takes the new value
            kv.second = std::move(value);
            return;
        }
    }
    kv_.emplace_back(key, std::move(value));
}

void GgufWriter::set_string(const std::string& key, const std::string& s) {
    set(key, GgufValue::of_string(s));
}
void GgufWriter::set_u32(const std::string& key, uint32_t x) {
    set(key, GgufValue::of_uint(GgufValueType::UINT32, x));
}
void GgufWriter::set_i32(const std::string& key, int32_t x) {
    set(key, GgufValue::of_int(GgufValueType::INT32, x));
}
void GgufWriter::set_f32(const std::string& key, float x) {
    set(key, GgufValue::of_float(GgufValueType::FLOAT32, x));
}
void GgufWriter::set_bool(const std::string& key, bool x) {
    set(key, GgufValue::of_bool(x));
}

void GgufWriter::set_string_array(const std::string& key, const std::vector<std::string>& items) {
    std::vector<GgufValue> v;
    v.reserve(items.size());
    for (const std::string& s : items) v.push_back(GgufValue::of_string(s));
    set(key, GgufValue::of_array(GgufValueType::STRING, std::move(v)));
}

void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& items) {
    std::vector<GgufValue> v;
    v.reserve(items.size());
    for (float x : items) v.push_back(GgufValue::of_float(GgufValueType::FLOAT32, x));
    set(key, GgufValue::of_array(GgufValueType::FLOAT32, std::move(v)));
}

void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& items) {
    std::vector<GgufValue> v;
    v.reserve(items.size());
    for (int32_t x : items) v.push_back(GgufValue::of_int(GgufValueType::INT32, x));
    set(key, GgufValue::of_array(GgufValueType::INT32, std::move(v)));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                            const void* data, size_t nbytes) {
    const char* n = name.c_str();
    for (const Pending& p : tensors_)
        if (p.name == name) fail("GGUF writer: tensor '%s' is added twice.", n);
    const TypeTraits* tr = type_traits(uint32_t(type));
    if (!tr) fail("GGUF writer: tensor '%s' has unknown type id %u.", n, unsigned(type));
    if (ne.empty() || ne.size() > 4)
        fail("GGUF writer: tensor '%s' has %zu dimensions (1 to 4 are supported).", n, ne.size());
    int64_t nel = 1;
    for (int64_t x : ne) {
        if (x <= 0) fail("GGUF writer: tensor '%s' has a dimension of %" PRId64 ".", n, x);
        if (__builtin_mul_overflow(nel, x, &nel))
            fail("GGUF writer: tensor '%s' has too many elements.", n);
    }
    if (ne[0] % tr->block_elems != 0)
        fail("GGUF writer: tensor '%s' has row length %" PRId64
             ", not a multiple of the %s block size %d.",
             n, ne[0], tr->name, tr->block_elems);
    const size_t expect = size_t(nel / tr->block_elems) * size_t(tr->block_bytes);
    if (nbytes != expect)
        fail("GGUF writer: tensor '%s' is given %zu bytes but its shape and type need %zu.", n,
             nbytes, expect);
    if (!data) fail("GGUF writer: tensor '%s' has no data.", n);
    const uint8_t* b = static_cast<const uint8_t*>(data);
    tensors_.push_back(Pending{name, type, std::move(ne), std::vector<uint8_t>(b, b + nbytes)});
}

std::vector<uint8_t> GgufWriter::to_bytes(size_t alignment) const {
    std::vector<TensorView> views;
    for (const Pending& p : tensors_) views.push_back({&p.name, p.type, &p.ne, &p.bytes});
    std::vector<uint8_t> out;
    emit(
        [&](const void* p, size_t n) {
            const uint8_t* b = static_cast<const uint8_t*>(p);
            out.insert(out.end(), b, b + n);
        },
        kv_, views, alignment);
    return out;
}

void GgufWriter::write(const std::string& path, size_t alignment) const {
    std::vector<TensorView> views;
    for (const Pending& p : tensors_) views.push_back({&p.name, p.type, &p.ne, &p.bytes});
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("%s: cannot create the file (%s).", path.c_str(), std::strerror(errno));
    int err = 0;
    try {
        emit(
            [&](const void* p, size_t n) {
                if (!err && n && std::fwrite(p, 1, n, f) != n) err = errno ? errno : EIO;
            },
            kv_, views, alignment);
    } catch (...) {
        std::fclose(f);
        std::remove(path.c_str());
        throw;
    }
    if (std::fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (err) {
        std::remove(path.c_str());
        fail("%s: cannot write the file (%s).", path.c_str(), std::strerror(err));
    }
}

}  // namespace nt
