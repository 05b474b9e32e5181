// Reads and writes GGUF files (versions 2 and 3). The reader validates everything before use
// and maps tensor data instead of copying it; every malformed file ends in one nt::Error
// sentence naming the file and the problem.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "quant/types.h"

namespace nt {

enum class GgufValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

struct GgufValue;
struct GgufArray {
    GgufValueType elem_type = GgufValueType::UINT8;
    std::vector<GgufValue> items;
};
struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;
    // Integers of every width are held as int64/uint64, floats as double, so readers need not
    // care which width the writer picked.
    std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;

    bool is_int() const;
    bool is_float() const;
    int64_t as_int() const;     // throws nt::Error when not an integer
    double as_float() const;    // ints convert too
    const std::string& as_string() const;
    const GgufArray& as_array() const;

    // Builders that keep `type` and the held alternative consistent; they throw nt::Error when
    // the value does not fit the type (e.g. of_uint(UINT8, 300)).
    static GgufValue of_uint(GgufValueType t, uint64_t x);   // t: UINT8/16/32/64
    static GgufValue of_int(GgufValueType t, int64_t x);     // t: INT8/16/32/64
    static GgufValue of_float(GgufValueType t, double x);    // t: FLOAT32/64
    static GgufValue of_bool(bool x);
    static GgufValue of_string(std::string s);
    static GgufValue of_array(GgufValueType elem_type, std::vector<GgufValue> items);
};

// "uint8", "string", "array", ...; "unknown" for ids outside the enum.
const char* gguf_type_name(GgufValueType t);

// Renders a value for display (`ntransformer info`): arrays show their first max_items items and
// then "..." with the item count; strings are quoted and escaped, and cut after max_string_bytes.
std::string describe_value(const GgufValue& v, size_t max_items, size_t max_string_bytes = 200);

struct GgufTensorInfo {
    std::string name;
    std::vector<int64_t> ne;  // ne[0] is the contiguous (row) dimension, as in ggml
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;      // relative to the start of the data section
    size_t nbytes = 0;
    int64_t nelements() const;
    int64_t rows() const { return ne.empty() ? 1 : nelements() / ne[0]; }
};

class GgufFile {
public:
    // Opens, maps and validates. Throws nt::Error("<path>: <problem>.") on any defect.
    static std::unique_ptr<GgufFile> open(const std::string& path);
    // Parses a file image in memory (for the fuzzer and tests); no mapping and no copy: `data`
    // must outlive the returned object.
    static std::unique_ptr<GgufFile> parse(const uint8_t* data, size_t size, const std::string& name);
    ~GgufFile();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    size_t alignment() const { return alignment_; }
    size_t file_size() const { return size_; }
    uint64_t data_offset() const { return data_offset_; }  // absolute file offset of tensor data

    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
    const GgufValue* find(const std::string& key) const;
    // Typed getters: `required` variants throw nt::Error naming the missing key.
    std::string get_string(const std::string& key, const std::string& def) const;
    std::string require_string(const std::string& key) const;
    int64_t get_int(const std::string& key, int64_t def) const;
    int64_t require_int(const std::string& key) const;
    double get_float(const std::string& key, double def) const;
    bool get_bool(const std::string& key, bool def) const;
    const GgufArray* get_array(const std::string& key) const;

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    const GgufTensorInfo* tensor(const std::string& name) const;
    // Pointer into the mapped file; valid for the life of this object.
    const uint8_t* tensor_data(const GgufTensorInfo& t) const { return base_ + data_offset_ + t.offset; }
    const uint8_t* base() const { return base_; }

private:
    GgufFile() = default;
    std::string path_;
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    uint64_t data_offset_ = 0;
    bool mapped_ = false;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::map<std::string, size_t> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t> tensor_index_;
    friend class GgufParser;
};

// Writes GGUF v3. Tensors are added with their raw (already quantized) bytes.
class GgufWriter {
public:
    void set(const std::string& key, GgufValue value);
    void set_string(const std::string& key, const std::string& s);
    void set_u32(const std::string& key, uint32_t x);
    void set_i32(const std::string& key, int32_t x);
    void set_f32(const std::string& key, float x);
    void set_bool(const std::string& key, bool x);
    void set_string_array(const std::string& key, const std::vector<std::string>& items);
    void set_f32_array(const std::string& key, const std::vector<float>& items);
    void set_i32_array(const std::string& key, const std::vector<int32_t>& items);
    void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                    const void* data, size_t nbytes);
    void write(const std::string& path, size_t alignment = 32) const;  // throws nt::Error
    // The same file image in memory (tests, fuzz seeds).
    std::vector<uint8_t> to_bytes(size_t alignment = 32) const;

private:
    std::vector<std::pair<std::string, GgufValue>> kv_;
    struct Pending { std::string name; GgmlType type; std::vector<int64_t> ne; std::vector<uint8_t> bytes; };
    std::vector<Pending> tensors_;
};

}  // namespace nt
