// GGUF reader. The file is mapped read-only and parsed in one pass; every count, length and
// offset read from it is checked against the bytes that are really there before it is used or
// allocated from, so a hostile file ends in one nt::Error sentence, never in a crash.
//
// Layout (v2 and v3 are identical; v1 had 32-bit counts and is refused):
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv
//   n_kv x      { string key, u32 value_type, value }
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//   padding to general.alignment (default 32), then the tensor data; offsets are relative to it.
//   string = u64 length + bytes; array value = u32 elem_type, u64 count, count x value.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace nt {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxAlignment = uint64_t(1) << 31;
constexpr uint32_t kMaxDims = 4;
// Arrays of arrays are legal; the limit keeps recursion (parse and destruction) shallow.
constexpr int kMaxArrayDepth = 16;
// Every metadata value costs ~48 bytes in memory against as little as 1 byte in the file, so a
// corrupt array count deep inside a 40 GB file could otherwise eat all RAM before the parse
// fails. Real models hold ~1-2 million values (vocabulary, scores, token types, merges).
constexpr uint64_t kMaxMetadataValues = uint64_t(1) << 24;
// Smallest encodings, used to bound counts by the bytes left before allocating.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim, type, offset

// Names read from the file go into error messages: escape them and keep them short.
std::string printable(const std::string& s) {
    constexpr size_t kMax = 80;
    std::string out;
    for (size_t i = 0; i < s.size() && i < kMax; i++) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\')
            out += strfmt("\\x%02x", c);
        else
            out += char(c);
    }
    if (s.size() > kMax) out += "...";
    return out;
}

// GGML type ids that exist but that ntransformer has no kernels for (names as gguf-py spells them).
const char* unsupported_ggml_type_name(uint32_t id) {
    switch (id) {
        case 16:
            return "iq2_xxs";
        case 17:
            return "iq2_xs";
        case 18:
            return "iq3_xxs";
        case 19:
            return "iq1_s";
        case 20:
            return "iq4_nl";
        case 21:
            return "iq3_s";
        case 22:
            return "iq2_s";
        case 23:
            return "iq4_xs";
        case 24:
            return "i8";
        case 25:
            return "i16";
        case 26:
            return "i32";
        case 27:
            return "i64";
        case 28:
            return "f64";
        case 29:
            return "iq1_m";
        case 34:
            return "tq1_0";
        case 35:
            return "tq2_0";
        case 39:
            return "mxfp4";
        case 40:
            return "nvfp4";
        case 41:
            return "q1_0";
        default:
            return nullptr;
    }
}

uint64_t min_value_bytes(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL:
            return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16:
            return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32:
            return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64:
        case GgufValueType::STRING:
            return 8;  // the length prefix
        case GgufValueType::ARRAY:
            return 12;  // element type + count
    }
    return 1;
}

}  // namespace

class GgufParser {
  public:
    explicit GgufParser(GgufFile& f) : f_(f), p_(f.base_), size_(f.size_), name_(f.path_.c_str()) {}

    void run() {
        read_header();
        for (uint64_t i = 0; i < n_kv_; i++) read_kv(i);
        read_alignment();
        what_ = "the header";
        check_absurd(n_tensors_, kMinTensorInfoBytes, "tensor count");
        // A count that is plausible for the file but not for the bytes left ends in a precise
        // truncation message from the loop; reserve only what the bytes left could hold.
        f_.tensors_.reserve(size_t(std::min<uint64_t>(n_tensors_, left() / kMinTensorInfoBytes)));
        for (uint64_t i = 0; i < n_tensors_; i++) read_tensor_info(i);
        // The data section starts at the next multiple of the alignment (<= 2^31), which
        // cannot wrap since pos_ is at most the file size.
        const uint64_t rem = pos_ % f_.alignment_;
        f_.data_offset_ = rem ? pos_ + (f_.alignment_ - rem) : pos_;
        check_tensor_data();
    }

  private:
    GgufFile& f_;
    const uint8_t* p_;
    size_t size_;
    const char* name_;
    size_t pos_ = 0;
    uint64_t n_kv_ = 0, n_tensors_ = 0;
    uint64_t n_values_ = 0;  // metadata values read so far, against kMaxMetadataValues
    std::string what_;       // the item being read, for error messages

    size_t left() const { return size_ - pos_; }

    void need(uint64_t n) {
        if (n > left())
            fail("%s: truncated file: %s needs %" PRIu64
                 " bytes at offset %zu but the file ends at %zu.",
                 name_, what_.c_str(), n, pos_, size_);
    }

    // A count read from the file must fit in the bytes left before anything is allocated for
    // it. A count no file of this size could hold is called absurd; one that merely runs past
    // the end is a truncation.
    void check_count(uint64_t count, uint64_t min_bytes_each, const char* noun) {
        if (count <= left() / min_bytes_each) return;
        check_absurd(count, min_bytes_each, noun);
        fail("%s: truncated file: %s has a %s of %" PRIu64
             " but only %zu bytes are left at offset %zu.",
             name_, what_.c_str(), noun, count, left(), pos_);
    }

    // Header counts are only bounded by the file size: the loops that use them consume bytes
    // on every step and allocate nothing from the count itself.
    void check_absurd(uint64_t count, uint64_t min_bytes_each, const char* noun) {
        if (count > size_ / min_bytes_each)
            fail("%s: %s has an absurd %s (%" PRIu64 " in a %zu-byte file).", name_, what_.c_str(),
                 noun, count, size_);
    }

    template <class T>
    T rd() {
        need(sizeof(T));
        T x;
        std::memcpy(&x, p_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return x;
    }

    std::string rd_string() {
        const uint64_t n = rd<uint64_t>();
        check_count(n, 1, "string length");
        std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(n));
        pos_ += size_t(n);
        return s;
    }

    GgufValueType rd_type() {
        const uint32_t id = rd<uint32_t>();
        if (id > uint32_t(GgufValueType::FLOAT64))
            fail("%s: %s has unknown value type %u.", name_, what_.c_str(), id);
        return GgufValueType(id);
    }

    void read_header() {
        what_ = "the header";
        const uint32_t magic = rd<uint32_t>();
        if (magic != kGgufMagic) fail("%s: not a GGUF file (bad magic).", name_);
        const uint32_t version = rd<uint32_t>();
        if (version != 2 && version != 3) {
            const uint32_t swapped = __builtin_bswap32(version);
            if (swapped == 2 || swapped == 3)
                fail(
                    "%s: unsupported GGUF version (the file is big-endian; only little-endian "
                    "files are supported).",
                    name_);
            if (version == 1)
                fail(
                    "%s: unsupported GGUF version 1 (versions 2 and 3 are supported; convert the "
                    "file again with a current llama.cpp).",
                    name_);
            fail("%s: unsupported GGUF version %u (versions 2 and 3 are supported).", name_,
                 version);
        }
        f_.version_ = version;
        n_tensors_ = rd<uint64_t>();
        n_kv_ = rd<uint64_t>();
        check_absurd(n_kv_, kMinKvBytes, "metadata key count");
    }

    GgufValue read_value(GgufValueType t, int depth) {
        GgufValue v;
        v.type = t;
        switch (t) {
            case GgufValueType::UINT8:
                v.v = uint64_t(rd<uint8_t>());
                break;
            case GgufValueType::INT8:
                v.v = int64_t(rd<int8_t>());
                break;
            case GgufValueType::UINT16:
                v.v = uint64_t(rd<uint16_t>());
                break;
            case GgufValueType::INT16:
                v.v = int64_t(rd<int16_t>());
                break;
            case GgufValueType::UINT32:
                v.v = uint64_t(rd<uint32_t>());
                break;
            case GgufValueType::INT32:
                v.v = int64_t(rd<int32_t>());
                break;
            case GgufValueType::UINT64:
                v.v = rd<uint64_t>();
                break;
            case GgufValueType::INT64:
                v.v = rd<int64_t>();
                break;
            case GgufValueType::FLOAT32:
                v.v = double(rd<float>());
                break;
            case GgufValueType::FLOAT64:
                v.v = rd<double>();
                break;
            case GgufValueType::BOOL:
                v.v = rd<uint8_t>() != 0;
                break;  // never load a byte as bool
            case GgufValueType::STRING:
                v.v = rd_string();
                break;
            case GgufValueType::ARRAY:
                v.v = read_array(depth + 1);
                break;
        }
        return v;
    }

    std::shared_ptr<GgufArray> read_array(int depth) {
        if (depth > kMaxArrayDepth)
            fail("%s: %s nests arrays more than %d levels deep.", name_, what_.c_str(),
                 kMaxArrayDepth);
        auto a = std::make_shared<GgufArray>();
        a->elem_type = rd_type();
        const uint64_t n = rd<uint64_t>();
        check_count(n, min_value_bytes(a->elem_type), "array count");
        if (n > kMaxMetadataValues - n_values_)
            fail("%s: %s brings the metadata to more than %" PRIu64
                 " values, far beyond any real model.",
                 name_, what_.c_str(), kMaxMetadataValues);
        n_values_ += n;
        a->items.reserve(size_t(n));
        for (uint64_t i = 0; i < n; i++) a->items.push_back(read_value(a->elem_type, depth));
        return a;
    }

    void read_kv(uint64_t i) {
        what_ = strfmt("metadata key #%" PRIu64, i);
        std::string key = rd_string();
        what_ = "metadata key '" + printable(key) + "'";
        if (f_.kv_index_.count(key))
            fail("%s: duplicate metadata key '%s'.", name_, printable(key).c_str());
        const GgufValueType t = rd_type();
        GgufValue v = read_value(t, 0);
        f_.kv_index_.emplace(key, f_.kv_.size());
        f_.kv_.emplace_back(std::move(key), std::move(v));
    }

    void read_alignment() {
        const GgufValue* a = f_.find("general.alignment");
        if (!a) return;
        if (!a->is_int())
            fail("%s: general.alignment is a %s, expected an unsigned integer.", name_,
                 gguf_type_name(a->type));
        const uint64_t* u = std::get_if<uint64_t>(&a->v);
        const int64_t signed_value = u ? 0 : std::get<int64_t>(a->v);
        if (!u && signed_value <= 0)
            fail("%s: general.alignment is %" PRId64
                 ", which is not a power of two from 1 to 2^31.",
                 name_, signed_value);
        const uint64_t al = u ? *u : uint64_t(signed_value);
        // The spec stores it as a uint32; anything larger is corruption, not a layout.
        if (!std::has_single_bit(al) || al > kMaxAlignment)
            fail("%s: general.alignment is %" PRIu64
                 ", which is not a power of two from 1 to 2^31.",
                 name_, al);
        f_.alignment_ = size_t(al);
    }

    void read_tensor_info(uint64_t i) {
        what_ = strfmt("tensor info #%" PRIu64, i);
        GgufTensorInfo t;
        t.name = rd_string();
        const std::string pname = printable(t.name);
        const char* tn = pname.c_str();
        what_ = "tensor '" + pname + "'";
        if (f_.tensor_index_.count(t.name)) fail("%s: duplicate tensor name '%s'.", name_, tn);

        const uint32_t n_dims = rd<uint32_t>();
        if (n_dims == 0 || n_dims > kMaxDims)
            fail("%s: tensor '%s' has %u dimensions (1 to %u are supported).", name_, tn, n_dims,
                 kMaxDims);
        t.ne.resize(n_dims);
        int64_t nel = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            const int64_t x = int64_t(rd<uint64_t>());  // values >= 2^63 show up as negative
            if (x <= 0)
                fail("%s: tensor '%s' has dimension ne[%u] = %" PRId64
                     " (dimensions must be positive).",
                     name_, tn, d, x);
            if (__builtin_mul_overflow(nel, x, &nel))
                fail("%s: tensor '%s' has dimensions whose product overflows 64 bits.", name_, tn);
            t.ne[d] = x;
        }

        const uint32_t type_id = rd<uint32_t>();
        const TypeTraits* tr = type_traits(type_id);
        if (!tr) {
            if (const char* known = unsupported_ggml_type_name(type_id))
                fail("%s: tensor '%s' has unsupported type %s (type id %u).", name_, tn, known,
                     type_id);
            fail("%s: tensor '%s' has unknown type id %u.", name_, tn, type_id);
        }
        t.type = GgmlType(type_id);
        if (t.ne[0] % tr->block_elems != 0)
            fail("%s: tensor '%s' has row length %" PRId64
                 ", which is not a multiple of the %s block size %d.",
                 name_, tn, t.ne[0], tr->name, tr->block_elems);
        // Every dimension is a whole number of blocks along ne[0], so nel divides evenly.
        size_t nbytes = 0;
        if (__builtin_mul_overflow(size_t(nel / tr->block_elems), size_t(tr->block_bytes), &nbytes))
            fail("%s: tensor '%s' has a size in bytes that overflows 64 bits.", name_, tn);
        t.nbytes = nbytes;

        t.offset = rd<uint64_t>();
        if (t.offset % f_.alignment_ != 0)
            fail("%s: tensor '%s' has data offset %" PRIu64
                 ", which is not a multiple of the alignment %zu.",
                 name_, tn, t.offset, f_.alignment_);

        f_.tensor_index_.emplace(t.name, f_.tensors_.size());
        f_.tensors_.push_back(std::move(t));
    }

    void check_tensor_data() {
        auto& ts = f_.tensors_;
        if (ts.empty()) return;
        if (f_.data_offset_ > size_)
            fail("%s: truncated file: the tensor data section starts at offset %" PRIu64
                 " but the file ends at %zu.",
                 name_, f_.data_offset_, size_);
        const uint64_t data_bytes = size_ - f_.data_offset_;
        for (const GgufTensorInfo& t : ts) {
            if (t.offset > data_bytes)
                fail("%s: tensor '%s' has data offset %" PRIu64
                     ", past the end of the file (the data section holds %" PRIu64 " bytes).",
                     name_, printable(t.name).c_str(), t.offset, data_bytes);
            if (t.nbytes > data_bytes - t.offset)
                fail("%s: truncated file: tensor '%s' needs %zu bytes at data offset %" PRIu64
                     " but the data section holds only %" PRIu64 " bytes.",
                     name_, printable(t.name).c_str(), t.nbytes, t.offset, data_bytes);
        }
        std::vector<size_t> order(ts.size());
        for (size_t i = 0; i < order.size(); i++) order[i] = i;
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return ts[a].offset < ts[b].offset; });
        for (size_t k = 1; k < order.size(); k++) {
            const GgufTensorInfo& a = ts[order[k - 1]];
            const GgufTensorInfo& b = ts[order[k]];
            if (a.offset + a.nbytes > b.offset)
                fail("%s: tensors '%s' and '%s' overlap in the data section.", name_,
                     printable(a.name).c_str(), printable(b.name).c_str());
        }
    }
};

// ---- GgufFile ----

int64_t GgufTensorInfo::nelements() const {
    int64_t n = 1;
    for (int64_t x : ne) n *= x;
    return n;
}

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* data, size_t size,
                                          const std::string& name) {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = name;
    static const uint8_t kEmpty = 0;
    f->base_ = data ? data : &kEmpty;
    f->size_ = data ? size : 0;
    GgufParser(*f).run();
    return f;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("%s: cannot open the file (%s).", path.c_str(), std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        fail("%s: cannot stat the file (%s).", path.c_str(), std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail("%s: not a regular file.", path.c_str());
    }
    const size_t size = size_t(st.st_size);
    if (size == 0) {
        ::close(fd);
        return parse(nullptr, 0, path);  // reports the truncated header
    }
    // Read-only and private: tensor data stays in the page cache, shared and never copied.
    void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps its own reference to the file
    if (m == MAP_FAILED) fail("%s: cannot map the file (%s).", path.c_str(), std::strerror(err));

    std::unique_ptr<GgufFile> f(new GgufFile());  // owns the mapping from here on
    f->path_ = path;
    f->base_ = static_cast<const uint8_t*>(m);
    f->size_ = size;
    f->mapped_ = true;
    GgufParser(*f).run();
    return f;
}

GgufFile::~GgufFile() {
    if (mapped_) munmap(const_cast<uint8_t*>(base_), size_);
}

const GgufValue* GgufFile::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// Getters: a key of the wrong type is an error even where a default exists, since silently
// using the default would hide a broken file.
namespace {

[[noreturn]] void wrong_type(const std::string& file, const std::string& key, const GgufValue& v,
                             const char* expected) {
    fail("%s: key '%s' is a %s, expected %s.", file.c_str(), key.c_str(), gguf_type_name(v.type),
         expected);
}

int64_t int_value(const std::string& file, const std::string& key, const GgufValue& v) {
    if (!v.is_int()) wrong_type(file, key, v, "an integer");
    const uint64_t* u = std::get_if<uint64_t>(&v.v);
    if (u && *u > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("%s: key '%s' = %" PRIu64 " does not fit in a signed 64-bit integer.", file.c_str(),
             key.c_str(), *u);
    return u ? int64_t(*u) : std::get<int64_t>(v.v);
}

}  // namespace

std::string GgufFile::get_string(const std::string& key, const std::string& def) const {
    const GgufValue* v = find(key);
    if (!v) return def;
    if (v->type != GgufValueType::STRING) wrong_type(path_, key, *v, "a string");
    return v->as_string();
}

std::string GgufFile::require_string(const std::string& key) const {
    if (!find(key)) fail("%s: missing required key '%s'.", path_.c_str(), key.c_str());
    return get_string(key, {});
}

int64_t GgufFile::get_int(const std::string& key, int64_t def) const {
    const GgufValue* v = find(key);
    return v ? int_value(path_, key, *v) : def;
}

int64_t GgufFile::require_int(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) fail("%s: missing required key '%s'.", path_.c_str(), key.c_str());
    return int_value(path_, key, *v);
}

double GgufFile::get_float(const std::string& key, double def) const {
    const GgufValue* v = find(key);
    if (!v) return def;
    if (!v->is_float() && !v->is_int()) wrong_type(path_, key, *v, "a number");
    return v->as_float();
}

bool GgufFile::get_bool(const std::string& key, bool def) const {
    const GgufValue* v = find(key);
    if (!v) return def;
    if (v->type != GgufValueType::BOOL) wrong_type(path_, key, *v, "a bool");
    return std::get<bool>(v->v);
}

const GgufArray* GgufFile::get_array(const std::string& key) const {
    const GgufValue* v = find(key);
    if (!v) return nullptr;
    if (v->type != GgufValueType::ARRAY) wrong_type(path_, key, *v, "an array");
    return &v->as_array();
}

}  // namespace nt
