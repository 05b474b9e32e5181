// GGUF reader and writer: round trips over every value and tensor type, one generated malformed
// file per class of defect with its exact message, the real SmolLM2 file, and a comparison of
// every key, value and tensor against gguf-py's GGUFReader (tests/python/gguf_py_dump.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "core/error.h"
#include "gguf/gguf.h"

namespace nt {
namespace {

using VT = GgufValueType;

const std::string kSmolPath = NT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kPyDump = NT_SOURCE_DIR "/tests/python/gguf_py_dump.py";

// A file under the temp directory, removed when the test ends.
struct TempFile {
    std::string path;
    explicit TempFile(const std::string& tag) {
        path = (std::filesystem::temp_directory_path() /
                ("nt_test_gguf_" + std::to_string(getpid()) + "_" + tag + ".gguf"))
                   .string();
    }
    ~TempFile() { std::remove(path.c_str()); }
};

// ---- raw byte builder for hand-made (mostly malformed) files ----

struct Raw {
    std::vector<uint8_t> b;
    template <class T>
    Raw& put(T x) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(&x);
        b.insert(b.end(), p, p + sizeof x);
        return *this;
    }
    Raw& u32(uint32_t x) { return put(x); }
    Raw& u64(uint64_t x) { return put(x); }
    Raw& str(const std::string& s) {
        u64(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Raw& bytes(const Raw& r) {
        b.insert(b.end(), r.b.begin(), r.b.end());
        return *this;
    }
    Raw& zeros(size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
    Raw& pad_to(size_t align) { return zeros((align - b.size() % align) % align); }
    // One metadata entry.
    Raw& kv_str(const std::string& key, const std::string& v) {
        return str(key).u32(uint32_t(VT::STRING)).str(v);
    }
    Raw& kv_u32(const std::string& key, uint32_t v) {
        return str(key).u32(uint32_t(VT::UINT32)).u32(v);
    }
    // One tensor info.
    Raw& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(uint32_t(ne.size()));
        for (uint64_t x : ne) u64(x);
        return u32(type).u64(offset);
    }
};

constexpr uint32_t F32 = uint32_t(GgmlType::F32);
constexpr uint32_t Q8_0 = uint32_t(GgmlType::Q8_0);
constexpr uint32_t Q4_0 = uint32_t(GgmlType::Q4_0);

// header + metadata + tensor infos + padding to 32 + data_bytes of zeros.
std::vector<uint8_t> make_file(uint64_t n_kv, const Raw& kvs, uint64_t n_tensors, const Raw& infos,
                               size_t data_bytes, uint32_t version = 3) {
    Raw r;
    r.u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv).bytes(kvs).bytes(infos).pad_to(32);
    r.zeros(data_bytes);
    return r.b;
}

// A small valid file: one key, tensors "a" (32 f32, 128 bytes at 0) and "b" (2 rows of 32 q8_0,
// 68 bytes at 128).
Raw valid_kvs() {
    return Raw().kv_str("general.architecture", "llama");
}
Raw valid_infos() {
    return Raw().tensor("a", {32}, F32, 0).tensor("b", {32, 2}, Q8_0, 128);
}
std::vector<uint8_t> valid_file() {
    return make_file(1, valid_kvs(), 2, valid_infos(), 128 + 68);
}

std::string parse_error(const std::vector<uint8_t>& b) {
    try {
        GgufFile::parse(b.data(), b.size(), "bad.gguf");
    } catch (const Error& e) {
        return e.what();
    }
    return "(parsed without error)";
}

// Every message is one sentence naming the file; `fragment` pins down the problem.
void check_error(const std::vector<uint8_t>& b, const std::string& fragment) {
    const std::string msg = parse_error(b);
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos)
        << "message: " << msg << "\nwanted: " << fragment;
    EXPECT_EQ(msg.back(), '.') << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}
#define EXPECT_GGUF_ERROR(bytes, fragment) \
    do {                                   \
        SCOPED_TRACE(fragment);            \
        check_error(bytes, fragment);      \
    } while (0)

TEST(GgufMalformed, ValidBaseFileParses) {
    const std::vector<uint8_t> b = valid_file();
    auto f = GgufFile::parse(b.data(), b.size(), "ok.gguf");
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->data_offset() % 32, 0u);
    ASSERT_EQ(f->tensors().size(), 2u);
    EXPECT_EQ(f->tensor("b")->nbytes, 68u);
    EXPECT_EQ(f->tensor_data(*f->tensor("b")), b.data() + f->data_offset() + 128);
    EXPECT_EQ(f->get_string("general.architecture", ""), "llama");
}

TEST(GgufMalformed, BadMagic) {
    std::vector<uint8_t> b = valid_file();
    b[0] = 'X';
    EXPECT_EQ(parse_error(b), "bad.gguf: not a GGUF file (bad magic).");
    EXPECT_EQ(
        parse_error({'G', 'G'}),
        "bad.gguf: truncated file: the header needs 4 bytes at offset 0 but the file ends at 2.");
}

TEST(GgufMalformed, UnsupportedVersion) {
    EXPECT_GGUF_ERROR(make_file(1, valid_kvs(), 2, valid_infos(), 196, 1),
                      "unsupported GGUF version 1 (versions 2 and 3 are supported");
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 2, valid_infos(), 196, 4)),
              "bad.gguf: unsupported GGUF version 4 (versions 2 and 3 are supported).");
    EXPECT_GGUF_ERROR(make_file(1, valid_kvs(), 2, valid_infos(), 196, 0x03000000),
                      "unsupported GGUF version (the file is big-endian");
    // v2 has the same layout as v3 and is accepted.
    const std::vector<uint8_t> v2 = make_file(1, valid_kvs(), 2, valid_infos(), 196, 2);
    EXPECT_EQ(GgufFile::parse(v2.data(), v2.size(), "v2.gguf")->version(), 2u);
}

TEST(GgufMalformed, TruncatedHeaderMetadataTensorInfosData) {
    const std::vector<uint8_t> full = valid_file();
    auto cut = [&](size_t n) { return std::vector<uint8_t>(full.begin(), full.begin() + n); };
    EXPECT_EQ(
        parse_error(cut(20)),
        "bad.gguf: truncated file: the header needs 8 bytes at offset 16 but the file ends at 20.");
    EXPECT_EQ(parse_error(cut(24 + 5)),
              "bad.gguf: truncated file: metadata key #0 needs 8 bytes at offset 24 but the file "
              "ends at 29.");
    // Inside the value: key "general.architecture" (20 bytes) + type, then the string length.
    EXPECT_EQ(
        parse_error(cut(24 + 8 + 20 + 4 + 3)),
        "bad.gguf: truncated file: metadata key 'general.architecture' needs 8 bytes at offset 56 "
        "but the file ends at 59.");
    const size_t infos_at = 24 + valid_kvs().b.size();
    EXPECT_GGUF_ERROR(cut(infos_at + 2), "truncated file: tensor info #0 needs 8 bytes");
    EXPECT_GGUF_ERROR(cut(infos_at + 8 + 1 + 4 + 3), "truncated file: tensor 'a' needs 8 bytes");
    // The data section: "b" (68 bytes at data offset 128) loses its last byte.
    const size_t data_at = full.size() - 196;
    EXPECT_EQ(parse_error(cut(full.size() - 1)),
              "bad.gguf: truncated file: tensor 'b' needs 68 bytes at data offset 128 but the data "
              "section holds only 195 bytes.");
    // Cut inside the padding before the data section.
    EXPECT_GGUF_ERROR(cut(data_at - 1), "truncated file: the tensor data section starts at offset");
}

TEST(GgufMalformed, OffsetsPastTheEnd) {
    Raw infos = Raw().tensor("a", {32}, F32, 0).tensor("far", {32}, F32, uint64_t(1) << 62);
    EXPECT_EQ(
        parse_error(make_file(1, valid_kvs(), 2, infos, 256)),
        "bad.gguf: tensor 'far' has data offset 4611686018427387904, past the end of the file "
        "(the data section holds 256 bytes).");
    // An offset that is inside the file but whose size runs past the end.
    infos = Raw().tensor("a", {32}, F32, 0).tensor("b", {32, 1000}, F32, 128);
    EXPECT_GGUF_ERROR(make_file(1, valid_kvs(), 2, infos, 256),
                      "truncated file: tensor 'b' needs 128000 bytes at data offset 128");
}

TEST(GgufMalformed, DimensionOverflow) {
    Raw infos = Raw().tensor("big", {uint64_t(1) << 32, uint64_t(1) << 32, 4}, F32, 0);
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 1, infos, 64)),
              "bad.gguf: tensor 'big' has dimensions whose product overflows 64 bits.");
    // 2^62 elements fit int64, but as f32 they need 2^64 bytes.
    infos = Raw().tensor("big", {uint64_t(1) << 31, uint64_t(1) << 31}, F32, 0);
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 1, infos, 64)),
              "bad.gguf: tensor 'big' has a size in bytes that overflows 64 bits.");
}

TEST(GgufMalformed, BadDims) {
    EXPECT_EQ(
        parse_error(make_file(1, valid_kvs(), 1, Raw().tensor("t", {1, 1, 1, 1, 32}, F32, 0), 128)),
        "bad.gguf: tensor 't' has 5 dimensions (1 to 4 are supported).");
    EXPECT_GGUF_ERROR(make_file(1, valid_kvs(), 1, Raw().tensor("t", {}, F32, 0), 128),
                      "tensor 't' has 0 dimensions");
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 1, Raw().tensor("t", {32, 0}, F32, 0), 128)),
              "bad.gguf: tensor 't' has dimension ne[1] = 0 (dimensions must be positive).");
    EXPECT_GGUF_ERROR(make_file(1, valid_kvs(), 1, Raw().tensor("t", {UINT64_MAX, 2}, F32, 0), 128),
                      "tensor 't' has dimension ne[0] = -1 (dimensions must be positive)");
}

TEST(GgufMalformed, UnknownTensorType) {
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 1, Raw().tensor("w", {32}, 99, 0), 128)),
              "bad.gguf: tensor 'w' has unknown type id 99.");
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 1, Raw().tensor("w", {256}, 16, 0), 128)),
              "bad.gguf: tensor 'w' has unsupported type iq2_xxs (type id 16).");
}

TEST(GgufMalformed, RowLengthNotMultipleOfBlock) {
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 1, Raw().tensor("w", {33, 2}, Q4_0, 0), 128)),
              "bad.gguf: tensor 'w' has row length 33, which is not a multiple of the q4_0 block "
              "size 32.");
}

TEST(GgufMalformed, DuplicateKeysAndTensors) {
    Raw kvs = Raw().kv_u32("x.n", 1).kv_str("x.s", "a").kv_u32("x.n", 2);
    EXPECT_EQ(parse_error(make_file(3, kvs, 2, valid_infos(), 196)),
              "bad.gguf: duplicate metadata key 'x.n'.");
    Raw infos = Raw().tensor("a", {32}, F32, 0).tensor("a", {32}, F32, 128);
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 2, infos, 256)),
              "bad.gguf: duplicate tensor name 'a'.");
}

TEST(GgufMalformed, AbsurdCounts) {
    // A string length of 2^60 in a small file: refused before any allocation.
    Raw kvs = Raw().str("k").u32(uint32_t(VT::STRING)).u64(uint64_t(1) << 60);
    EXPECT_GGUF_ERROR(make_file(1, kvs, 0, Raw(), 0),
                      "metadata key 'k' has an absurd string length (1152921504606846976 in a ");
    kvs = Raw().str("k").u32(uint32_t(VT::ARRAY)).u32(uint32_t(VT::INT32)).u64(uint64_t(1) << 40);
    EXPECT_GGUF_ERROR(make_file(1, kvs, 0, Raw(), 0), "metadata key 'k' has an absurd array count");
    // Key length itself.
    kvs = Raw().u64(UINT64_MAX);
    EXPECT_GGUF_ERROR(make_file(1, kvs, 0, Raw(), 0),
                      "metadata key #0 has an absurd string length");
    EXPECT_GGUF_ERROR(make_file(uint64_t(1) << 50, valid_kvs(), 2, valid_infos(), 196),
                      "the header has an absurd metadata key count");
    EXPECT_GGUF_ERROR(make_file(1, valid_kvs(), UINT64_MAX, valid_infos(), 196),
                      "the header has an absurd tensor count");
    // A string that is not absurd for the file but longer than what is left is a truncation.
    Raw r;
    r.u32(0x46554747).u32(3).u64(0).u64(1).str("k").u32(uint32_t(VT::STRING)).u64(100).zeros(60);
    EXPECT_EQ(parse_error(r.b),
              "bad.gguf: truncated file: metadata key 'k' has a string length of 100 "
              "but only 60 bytes are left at offset 45.");
}

TEST(GgufMalformed, MetadataValueBudget) {
    // 2^24 + 1 one-byte items are really there, but would cost ~800 MB as GgufValues.
    const uint64_t n = (uint64_t(1) << 24) + 1;
    Raw kvs = Raw().str("big").u32(uint32_t(VT::ARRAY)).u32(uint32_t(VT::UINT8)).u64(n);
    std::vector<uint8_t> b = make_file(1, kvs, 0, Raw(), 0);
    b.resize(b.size() + n);
    EXPECT_GGUF_ERROR(b, "metadata key 'big' brings the metadata to more than 16777216 values");
}

TEST(GgufMalformed, MisalignedAndOverlappingTensors) {
    Raw infos = Raw().tensor("a", {32}, F32, 0).tensor("b", {32}, F32, 130);
    EXPECT_EQ(
        parse_error(make_file(1, valid_kvs(), 2, infos, 512)),
        "bad.gguf: tensor 'b' has data offset 130, which is not a multiple of the alignment 32.");
    infos = Raw().tensor("a", {64}, F32, 0).tensor("b", {32}, F32, 128).tensor("c", {32}, F32, 224);
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 3, infos, 512)),
              "bad.gguf: tensors 'a' and 'b' overlap in the data section.");
    // Touching is fine; listed out of order is fine.
    infos = Raw().tensor("b", {32}, F32, 256).tensor("a", {64}, F32, 0);
    EXPECT_EQ(parse_error(make_file(1, valid_kvs(), 2, infos, 512)), "(parsed without error)");
}

TEST(GgufMalformed, BadAlignment) {
    EXPECT_EQ(
        parse_error(make_file(1, Raw().kv_u32("general.alignment", 48), 2, valid_infos(), 196)),
        "bad.gguf: general.alignment is 48, which is not a power of two from 1 to 2^31.");
    EXPECT_GGUF_ERROR(make_file(1, Raw().kv_u32("general.alignment", 0), 2, valid_infos(), 196),
                      "general.alignment is 0, which is not a power of two from 1 to 2^31");
    EXPECT_GGUF_ERROR(
        make_file(1,
                  Raw().str("general.alignment").u32(uint32_t(VT::UINT64)).u64(uint64_t(1) << 32),
                  2, valid_infos(), 196),
        "general.alignment is 4294967296, which is not a power of two from 1 to 2^31");
    EXPECT_EQ(
        parse_error(make_file(1, Raw().kv_str("general.alignment", "64"), 2, valid_infos(), 196)),
        "bad.gguf: general.alignment is a string, expected an unsigned integer.");
    // A valid custom alignment moves the data section and is enforced on offsets.
    Raw kvs = Raw().kv_u32("general.alignment", 256);
    Raw infos = Raw().tensor("a", {32}, F32, 0).tensor("b", {32}, F32, 128);
    std::vector<uint8_t> b = make_file(1, kvs, 2, infos, 0);
    b.resize(256 + 512, 0);
    EXPECT_GGUF_ERROR(
        b, "tensor 'b' has data offset 128, which is not a multiple of the alignment 256");
    infos = Raw().tensor("a", {32}, F32, 0).tensor("b", {32}, F32, 256);
    b = make_file(1, kvs, 2, infos, 0);
    b.resize(256 + 512, 0);
    auto f = GgufFile::parse(b.data(), b.size(), "ok.gguf");
    EXPECT_EQ(f->alignment(), 256u);
    EXPECT_EQ(f->data_offset(), 256u);
}

TEST(GgufMalformed, UnknownValueTypeAndDeepNesting) {
    Raw kvs = Raw().str("k").u32(13).u32(0);
    EXPECT_EQ(parse_error(make_file(1, kvs, 0, Raw(), 0)),
              "bad.gguf: metadata key 'k' has unknown value type 13.");
    kvs = Raw().str("k").u32(uint32_t(VT::ARRAY)).u32(77).u64(0);
    EXPECT_GGUF_ERROR(make_file(1, kvs, 0, Raw(), 0), "metadata key 'k' has unknown value type 77");
    // 17 nested arrays, each holding the next one.
    kvs = Raw().str("deep").u32(uint32_t(VT::ARRAY));
    for (int i = 0; i < 17; i++) kvs.u32(uint32_t(VT::ARRAY)).u64(1);
    kvs.u32(uint32_t(VT::UINT8)).u64(0);
    EXPECT_EQ(parse_error(make_file(1, kvs, 0, Raw(), 0)),
              "bad.gguf: metadata key 'deep' nests arrays more than 16 levels deep.");
}

TEST(GgufMalformed, NamesInMessagesAreEscapedAndShort) {
    Raw infos = Raw().tensor(std::string("a\nb'") + std::string(200, 'x'), {33}, Q4_0, 0);
    const std::string msg = parse_error(make_file(1, valid_kvs(), 1, infos, 128));
    EXPECT_NE(msg.find("tensor 'a\\x0ab\\x27xxxx"), std::string::npos) << msg;
    EXPECT_NE(msg.find("xxx...' has row length 33"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 250u) << msg;
}

TEST(GgufFileOpen, MissingDirectoryAndEmpty) {
    try {
        GgufFile::open("/nonexistent/model.gguf");
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(),
                     "/nonexistent/model.gguf: cannot open the file (No such file or directory).");
    }
    const std::string dir = std::filesystem::temp_directory_path().string();
    try {
        GgufFile::open(dir);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), dir + ": not a regular file.");
    }
    TempFile empty("empty");
    std::ofstream(empty.path).close();
    try {
        GgufFile::open(empty.path);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), empty.path +
                                             ": truncated file: the header needs 4 bytes at "
                                             "offset 0 but the file ends at 0.");
    }
}

// ---- getters ----

TEST(GgufGetters, RequiredAndTypeMismatch) {
    Raw kvs = Raw().kv_u32("n", 30).kv_str("s", "llama");
    kvs.str("big").u32(uint32_t(VT::UINT64)).u64(UINT64_MAX);
    kvs.str("neg").u32(uint32_t(VT::INT8)).put<int8_t>(-5);
    kvs.str("flag").u32(uint32_t(VT::BOOL)).put<uint8_t>(1);
    kvs.str("x").u32(uint32_t(VT::FLOAT32)).put<float>(0.25f);
    const std::vector<uint8_t> b = make_file(6, kvs, 0, Raw(), 0);
    auto f = GgufFile::parse(b.data(), b.size(), "m.gguf");
    EXPECT_EQ(f->require_int("n"), 30);
    EXPECT_EQ(f->get_int("neg", 0), -5);
    EXPECT_EQ(f->get_int("absent", 7), 7);
    EXPECT_EQ(f->require_string("s"), "llama");
    EXPECT_EQ(f->get_string("absent", "d"), "d");
    EXPECT_TRUE(f->get_bool("flag", false));
    EXPECT_EQ(f->get_float("x", 0), 0.25);
    EXPECT_EQ(f->get_float("n", 0), 30.0);  // integers convert
    EXPECT_EQ(f->get_array("absent"), nullptr);

    auto err = [](auto fn) -> std::string {
        try {
            fn();
        } catch (const Error& e) {
            return e.what();
        }
        return "(no error)";
    };
    EXPECT_EQ(err([&] { f->require_int("llama.block_count"); }),
              "m.gguf: missing required key 'llama.block_count'.");
    EXPECT_EQ(err([&] { f->require_string("general.architecture"); }),
              "m.gguf: missing required key 'general.architecture'.");
    EXPECT_EQ(err([&] { f->require_string("n"); }),
              "m.gguf: key 'n' is a uint32, expected a string.");
    EXPECT_EQ(err([&] { f->require_int("s"); }),
              "m.gguf: key 's' is a string, expected an integer.");
    EXPECT_EQ(err([&] { f->get_int("x", 0); }),
              "m.gguf: key 'x' is a float32, expected an integer.");
    EXPECT_EQ(err([&] { f->get_bool("n", false); }),
              "m.gguf: key 'n' is a uint32, expected a bool.");
    EXPECT_EQ(err([&] { f->get_float("s", 0); }),
              "m.gguf: key 's' is a string, expected a number.");
    EXPECT_EQ(err([&] { f->get_array("s"); }), "m.gguf: key 's' is a string, expected an array.");
    EXPECT_EQ(err([&] { f->get_int("big", 0); }),
              "m.gguf: key 'big' = 18446744073709551615 does not fit in a signed 64-bit integer.");
}

// ---- writer -> reader round trip ----

GgufValue u(VT t, uint64_t x) {
    return GgufValue::of_uint(t, x);
}
GgufValue i(VT t, int64_t x) {
    return GgufValue::of_int(t, x);
}
GgufValue fl(VT t, double x) {
    return GgufValue::of_float(t, x);
}
GgufValue arr(VT t, std::vector<GgufValue> items) {
    return GgufValue::of_array(t, std::move(items));
}

// Every value type, the extremes of each width, nested and empty arrays.
std::vector<std::pair<std::string, GgufValue>> all_values() {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    return {
        {"general.architecture", GgufValue::of_string("llama")},
        {"t.u8", u(VT::UINT8, 255)},
        {"t.i8", i(VT::INT8, -128)},
        {"t.u16", u(VT::UINT16, 65535)},
        {"t.i16", i(VT::INT16, -32768)},
        {"t.u32", u(VT::UINT32, 4294967295u)},
        {"t.i32", i(VT::INT32, INT32_MIN)},
        {"t.u64", u(VT::UINT64, UINT64_MAX)},
        {"t.i64", i(VT::INT64, INT64_MIN)},
        {"t.f32", fl(VT::FLOAT32, 1e-5)},
        {"t.f32_neg0", fl(VT::FLOAT32, -0.0)},
        {"t.f64", fl(VT::FLOAT64, 0.1)},
        {"t.f64_inf", fl(VT::FLOAT64, -inf)},
        {"t.f64_nan", fl(VT::FLOAT64, nan)},
        {"t.true", GgufValue::of_bool(true)},
        {"t.false", GgufValue::of_bool(false)},
        {"t.str", GgufValue::of_string(std::string("h\xc3\xa9llo\0world\n", 13))},
        {"t.empty_str", GgufValue::of_string("")},
        {"t.a_u8", arr(VT::UINT8, {u(VT::UINT8, 0), u(VT::UINT8, 200)})},
        {"t.a_i8", arr(VT::INT8, {i(VT::INT8, -1), i(VT::INT8, 127)})},
        {"t.a_u16", arr(VT::UINT16, {u(VT::UINT16, 1), u(VT::UINT16, 65535)})},
        {"t.a_i16", arr(VT::INT16, {i(VT::INT16, -300)})},
        {"t.a_u32", arr(VT::UINT32, {u(VT::UINT32, 7), u(VT::UINT32, 1u << 31)})},
        {"t.a_i32", arr(VT::INT32, {i(VT::INT32, -7), i(VT::INT32, 1 << 30)})},
        {"t.a_u64", arr(VT::UINT64, {u(VT::UINT64, uint64_t(1) << 63)})},
        {"t.a_i64", arr(VT::INT64, {i(VT::INT64, -(int64_t(1) << 62)), i(VT::INT64, 5)})},
        {"t.a_f32", arr(VT::FLOAT32, {fl(VT::FLOAT32, 0.5), fl(VT::FLOAT32, -3.25e-7)})},
        {"t.a_f64", arr(VT::FLOAT64, {fl(VT::FLOAT64, 1e300), fl(VT::FLOAT64, -2.5)})},
        {"t.a_bool", arr(VT::BOOL, {GgufValue::of_bool(true), GgufValue::of_bool(false)})},
        {"t.a_str", arr(VT::STRING, {GgufValue::of_string("a"), GgufValue::of_string(""),
                                     GgufValue::of_string("\xc3\xbc")})},
        {"t.a_empty", arr(VT::INT32, {})},
        {"t.a_nested", arr(VT::ARRAY, {arr(VT::INT16, {i(VT::INT16, 1), i(VT::INT16, 2)}),
                                       arr(VT::INT16, {}), arr(VT::INT16, {i(VT::INT16, 3)})})},
        {"t.a_nested3",
         arr(VT::ARRAY, {arr(VT::ARRAY, {arr(VT::STRING, {GgufValue::of_string("deep")})})})},
    };
}

// Exact equality, floats compared bit for bit (NaN, -0).
bool same(const GgufValue& a, const GgufValue& b) {
    if (a.type != b.type || a.v.index() != b.v.index()) return false;
    if (a.type == VT::ARRAY) {
        const GgufArray &x = a.as_array(), &y = b.as_array();
        if (x.elem_type != y.elem_type || x.items.size() != y.items.size()) return false;
        for (size_t k = 0; k < x.items.size(); k++)
            if (!same(x.items[k], y.items[k])) return false;
        return true;
    }
    if (a.type == VT::FLOAT32 || a.type == VT::FLOAT64) {
        const double p = std::get<double>(a.v), q = std::get<double>(b.v);
        return std::memcmp(&p, &q, sizeof p) == 0;
    }
    return a.v == b.v;
}

struct SampleTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
};

// One tensor of every type our type table knows, with random bytes.
std::vector<SampleTensor> all_tensor_types(bool with_q8_1 = true) {
    std::mt19937 rng(42);
    std::vector<SampleTensor> out;
    for (uint32_t id = 0; id < 64; id++) {
        const TypeTraits* tr = type_traits(id);
        if (!tr || (id == uint32_t(GgmlType::Q8_1) && !with_q8_1)) continue;
        SampleTensor t{std::string("t.") + tr->name, GgmlType(id), {tr->block_elems * 2, 3}, {}};
        t.bytes.resize(row_bytes(t.type, t.ne[0]) * 3);
        for (uint8_t& x : t.bytes) x = uint8_t(rng());
        out.push_back(std::move(t));
    }
    return out;
}

GgufWriter sample_writer() {
    GgufWriter w;
    for (auto& [k, v] : all_values()) w.set(k, v);
    for (const SampleTensor& t : all_tensor_types())
        w.add_tensor(t.name, t.type, t.ne, t.bytes.data(), t.bytes.size());
    return w;
}

void check_round_trip(const GgufFile& f, size_t alignment) {
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    auto want = all_values();
    if (alignment != 32)
        want.emplace_back("general.alignment", GgufValue::of_uint(VT::UINT32, alignment));
    ASSERT_EQ(f.metadata().size(), want.size());
    for (size_t k = 0; k < want.size(); k++) {  // order is kept
        EXPECT_EQ(f.metadata()[k].first, want[k].first);
        EXPECT_TRUE(same(f.metadata()[k].second, want[k].second)) << want[k].first;
    }
    const auto sample = all_tensor_types();
    ASSERT_EQ(f.tensors().size(), sample.size());
    ASSERT_GE(sample.size(), 15u);  // every type in quant/types.h
    for (size_t k = 0; k < sample.size(); k++) {
        const GgufTensorInfo& t = f.tensors()[k];
        EXPECT_EQ(t.name, sample[k].name);
        EXPECT_EQ(t.type, sample[k].type);
        EXPECT_EQ(t.ne, sample[k].ne);
        EXPECT_EQ(t.nbytes, sample[k].bytes.size());
        EXPECT_EQ(t.offset % alignment, 0u);
        EXPECT_EQ(std::memcmp(f.tensor_data(t), sample[k].bytes.data(), t.nbytes), 0) << t.name;
        EXPECT_EQ(f.tensor(t.name), &t);
    }
}

TEST(GgufRoundTrip, EveryValueAndTensorTypeThroughAFile) {
    for (size_t alignment : {size_t(32), size_t(1), size_t(64), size_t(4096)}) {
        SCOPED_TRACE(alignment);
        TempFile tmp("rt" + std::to_string(alignment));
        sample_writer().write(tmp.path, alignment);
        auto f = GgufFile::open(tmp.path);
        check_round_trip(*f, alignment);
        EXPECT_EQ(f->file_size(), std::filesystem::file_size(tmp.path));
        // The same image in memory, and as v2.
        std::vector<uint8_t> b = sample_writer().to_bytes(alignment);
        ASSERT_EQ(b.size(), f->file_size());
        EXPECT_EQ(std::memcmp(b.data(), f->base(), b.size()), 0);
        b[4] = 2;
        auto g = GgufFile::parse(b.data(), b.size(), "v2");
        EXPECT_EQ(g->version(), 2u);
        EXPECT_EQ(g->tensors().size(), f->tensors().size());
    }
}

TEST(GgufRoundTrip, MetadataOnlyFileEndsAfterTheMetadata) {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    const std::vector<uint8_t> b = w.to_bytes(4096);  // no tensors: no padding to 4096
    // header 24 + architecture (8 + 20 + 4 + 8 + 5) + general.alignment (8 + 17 + 4 + 4)
    EXPECT_EQ(b.size(), 24u + 45u + 33u);
    auto f = GgufFile::parse(b.data(), b.size(), "meta.gguf");
    EXPECT_EQ(f->alignment(), 4096u);
    EXPECT_TRUE(f->tensors().empty());
    EXPECT_EQ(f->get_int("general.alignment", 0), 4096);
}

// Tensor data is served from a read-only file mapping, not a copy.
TEST(GgufRoundTrip, TensorDataIsMappedFromTheFile) {
    TempFile tmp("map");
    sample_writer().write(tmp.path);
    auto f = GgufFile::open(tmp.path);
    const uintptr_t p = uintptr_t(f->tensor_data(f->tensors().back()));
    const std::string real = std::filesystem::canonical(tmp.path).string();
    std::ifstream maps("/proc/self/maps");
    bool found = false;
    for (std::string line; std::getline(maps, line);) {
        if (line.size() < real.size() ||
            line.compare(line.size() - real.size(), real.size(), real) != 0)
            continue;
        unsigned long lo = 0, hi = 0;
        char perms[5] = {};
        ASSERT_EQ(std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms), 3);
        if (p >= lo && p < hi) {
            found = true;
            EXPECT_EQ(perms[0], 'r');
            EXPECT_EQ(perms[1], '-') << "mapping must be read-only: " << line;
        }
    }
    EXPECT_TRUE(found) << "tensor data is not inside a mapping of " << real;
}

TEST(GgufWriter, RefusesWhatTheReaderWouldRefuse) {
    auto err = [](auto fn) -> std::string {
        try {
            fn();
        } catch (const Error& e) {
            return e.what();
        }
        return "(no error)";
    };
    EXPECT_EQ(err([] { GgufValue::of_uint(VT::UINT8, 256); }),
              "GGUF value 256 does not fit in uint8.");
    EXPECT_EQ(err([] { GgufValue::of_int(VT::INT16, -32769); }),
              "GGUF value -32769 does not fit in int16.");
    EXPECT_EQ(err([] { GgufValue::of_uint(VT::INT32, 1); }),
              "GGUF type int32 is not an unsigned integer type.");
    EXPECT_EQ(err([] {
                  arr(VT::INT32, {i(VT::INT32, 1), u(VT::UINT32, 2)});
              }),
              "GGUF array of int32 holds a uint32 at index 1.");
    GgufWriter w;
    GgufValue bad;  // claims uint8 but holds a string
    bad.type = VT::UINT8;
    bad.v = std::string("x");
    EXPECT_EQ(err([&] { w.set("k", bad); }),
              "GGUF writer: key 'k' (uint8) does not hold an unsigned integer.");
    std::vector<uint8_t> data(200);
    EXPECT_EQ(err([&] {
                  w.add_tensor("q", GgmlType::Q4_0, {32, 2}, data.data(), 37);
              }),
              "GGUF writer: tensor 'q' is given 37 bytes but its shape and type need 36.");
    EXPECT_EQ(
        err([&] { w.add_tensor("q", GgmlType::Q4_0, {48}, data.data(), 27); }),
        "GGUF writer: tensor 'q' has row length 48, not a multiple of the q4_0 block size 32.");
    EXPECT_EQ(err([&] {
                  w.add_tensor("q", GgmlType::F32, {1, 1, 1, 1, 1}, data.data(), 4);
              }),
              "GGUF writer: tensor 'q' has 5 dimensions (1 to 4 are supported).");
    w.add_tensor("q", GgmlType::F32, {2}, data.data(), 8);
    EXPECT_EQ(err([&] { w.add_tensor("q", GgmlType::F32, {2}, data.data(), 8); }),
              "GGUF writer: tensor 'q' is added twice.");
    EXPECT_EQ(err([&] { w.to_bytes(48); }),
              "GGUF writer: alignment 48 is not a power of two from 1 to 2^31.");
    w.set_u32("general.alignment", 64);
    EXPECT_EQ(err([&] { w.to_bytes(32); }),
              "GGUF writer: general.alignment is 64 but the file is written with alignment 32.");
    EXPECT_EQ(err([&] { w.write("/nonexistent/dir/x.gguf", 64); }),
              "/nonexistent/dir/x.gguf: cannot create the file (No such file or directory).");
    // Setting a key again replaces it in place.
    w.set_string("s", "a");
    w.set_string("s", "b");
    const std::vector<uint8_t> b = w.to_bytes(64);
    auto f = GgufFile::parse(b.data(), b.size(), "w.gguf");
    EXPECT_EQ(f->metadata().size(), 2u);
    EXPECT_EQ(f->get_string("s", ""), "b");
}

// ---- describe_value ----

TEST(GgufDescribe, RendersValuesForInfo) {
    EXPECT_EQ(describe_value(u(VT::UINT32, 30), 4), "30");
    EXPECT_EQ(describe_value(i(VT::INT64, -5), 4), "-5");
    EXPECT_EQ(describe_value(fl(VT::FLOAT32, 1e-5), 4), "1e-05");  // shortest float32 text
    EXPECT_EQ(describe_value(fl(VT::FLOAT64, 0.1), 4), "0.1");
    EXPECT_EQ(describe_value(GgufValue::of_bool(true), 4), "true");
    EXPECT_EQ(describe_value(GgufValue::of_string("a\"b\n\x01"), 4), "\"a\\\"b\\n\\x01\"");
    EXPECT_EQ(describe_value(GgufValue::of_string("hello world"), 4, 5), "\"hello\"... (11 bytes)");
    std::vector<GgufValue> five;
    for (int k = 1; k <= 5; k++) five.push_back(i(VT::INT32, k));
    EXPECT_EQ(describe_value(arr(VT::INT32, five), 3), "[1, 2, 3, ...] (5 items of int32)");
    EXPECT_EQ(describe_value(arr(VT::INT32, five), 5), "[1, 2, 3, 4, 5]");
    EXPECT_EQ(describe_value(arr(VT::INT32, five), 0), "[...] (5 items of int32)");
    EXPECT_EQ(describe_value(arr(VT::INT32, {}), 3), "[]");
    EXPECT_EQ(describe_value(
                  arr(VT::STRING, {GgufValue::of_string("<s>"), GgufValue::of_string("</s>")}), 1),
              "[\"<s>\", ...] (2 items of string)");
    EXPECT_EQ(describe_value(all_values().back().second, 4), "[[[\"deep\"]]]");
}

// ---- speed ----

TEST(GgufSpeed, LargeVocabularyParsesInMilliseconds) {
    const int n = 150000;
    std::vector<std::string> tokens, merges;
    std::vector<float> scores;
    std::vector<int32_t> types;
    for (int k = 0; k < n; k++) {
        // Built by appending: prefix + std::to_string(k) trips gcc 12's -Wrestrict (a false
        // positive in basic_string's insert).
        std::string tok = "tok", merge = "m";
        tok += std::to_string(k);
        merge += std::to_string(k);
        merge += " x";
        tokens.push_back(tok);
        merges.push_back(merge);
        scores.push_back(float(-k));
        types.push_back(1);
    }
    GgufWriter w;
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_string_array("tokenizer.ggml.merges", merges);
    const std::vector<uint8_t> b = w.to_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    auto f = GgufFile::parse(b.data(), b.size(), "vocab.gguf");
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("parse of 4 x %d metadata items (%zu bytes): %.1f ms\n", n, b.size(), ms);
    ASSERT_EQ(f->get_array("tokenizer.ggml.tokens")->items.size(), size_t(n));
    EXPECT_EQ(f->get_array("tokenizer.ggml.tokens")->items[n - 1].as_string(), "tok149999");
    EXPECT_EQ(f->get_array("tokenizer.ggml.scores")->items[7].as_float(), -7.0);
    EXPECT_LT(ms, 1000.0);  // ~10-30 ms in practice; seconds would mean something quadratic
}

// ---- the real model ----

TEST(GgufRealFile, SmolLM2) {
    if (!std::filesystem::exists(kSmolPath)) GTEST_SKIP() << kSmolPath << " not present";
    const auto t0 = std::chrono::steady_clock::now();
    auto f = GgufFile::open(kSmolPath);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("open + parse of SmolLM2-135M: %.1f ms\n", ms);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->require_string("general.architecture"), "llama");
    EXPECT_EQ(f->require_int("llama.block_count"), 30);
    EXPECT_EQ(f->require_int("llama.embedding_length"), 576);
    EXPECT_EQ(f->require_int("llama.attention.head_count"), 9);
    EXPECT_EQ(f->require_int("llama.attention.head_count_kv"), 3);
    EXPECT_FLOAT_EQ(float(f->get_float("llama.rope.freq_base", 0)), 100000.0f);
    EXPECT_EQ(f->require_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f->require_string("tokenizer.ggml.pre"), "smollm");
    ASSERT_NE(f->get_array("tokenizer.ggml.tokens"), nullptr);
    EXPECT_EQ(f->get_array("tokenizer.ggml.tokens")->items.size(), 49152u);
    EXPECT_EQ(f->get_array("tokenizer.ggml.tokens")->items[1].as_string(), "<|im_start|>");
    EXPECT_EQ(f->get_array("tokenizer.ggml.merges")->items.size(), 48900u);
    EXPECT_EQ(f->metadata().size(), 33u);

    ASSERT_EQ(f->tensors().size(), 272u);
    int n_q4_1 = 0, n_f32 = 0, n_q8_0 = 0;
    for (const GgufTensorInfo& t : f->tensors()) {
        n_q4_1 += t.type == GgmlType::Q4_1;
        n_f32 += t.type == GgmlType::F32;
        n_q8_0 += t.type == GgmlType::Q8_0;
    }
    EXPECT_EQ(n_q4_1, 210);
    EXPECT_EQ(n_f32, 61);
    EXPECT_EQ(n_q8_0, 1);
    const GgufTensorInfo* emb = f->tensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->type, GgmlType::Q8_0);
    EXPECT_EQ(emb->ne, (std::vector<int64_t>{576, 49152}));
    EXPECT_EQ(emb->rows(), 49152);
    EXPECT_EQ(emb->nbytes, 30081024u);
    EXPECT_EQ(f->data_offset(), 1785664u);
    EXPECT_EQ(f->tensor("output.weight"), nullptr);  // tied embeddings
    const GgufTensorInfo* last = &f->tensors().back();
    EXPECT_LE(f->data_offset() + last->offset + last->nbytes, f->file_size());
}

// ---- against gguf-py ----

std::string hex(const void* p, size_t n) {
    static const char* d = "0123456789abcdef";
    std::string s(2 * n, '0');
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (size_t k = 0; k < n; k++) s[2 * k] = d[b[k] >> 4], s[2 * k + 1] = d[b[k] & 15];
    return s;
}

uint32_t crc32(const uint8_t* p, size_t n) {  // zlib's CRC-32
    static uint32_t table[256];
    static bool init = false;
    if (!init) {
        for (uint32_t k = 0; k < 256; k++) {
            uint32_t c = k;
            for (int j = 0; j < 8; j++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[k] = c;
        }
        init = true;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t k = 0; k < n; k++) c = table[(c ^ p[k]) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

// The canonical form documented in gguf_py_dump.py.
void canonical(std::string& out, const GgufValue& v) {
    out += std::to_string(uint32_t(v.type)) + ":";
    switch (v.type) {
        case VT::FLOAT32: {
            const float x = float(std::get<double>(v.v));
            out += hex(&x, 4);
            break;
        }
        case VT::FLOAT64:
            out += hex(&std::get<double>(v.v), 8);
            break;
        case VT::BOOL:
            out += std::get<bool>(v.v) ? "1" : "0";
            break;
        case VT::STRING:
            out += hex(v.as_string().data(), v.as_string().size());
            break;
        case VT::ARRAY: {
            const GgufArray& a = v.as_array();
            out +=
                std::to_string(uint32_t(a.elem_type)) + ":" + std::to_string(a.items.size()) + ":[";
            for (size_t k = 0; k < a.items.size(); k++) {
                if (k) out += ',';
                canonical(out, a.items[k]);
            }
            out += ']';
            break;
        }
        default:
            if (const uint64_t* x = std::get_if<uint64_t>(&v.v))
                out += std::to_string(*x);
            else
                out += std::to_string(std::get<int64_t>(v.v));
    }
}

std::vector<std::string> our_dump(const GgufFile& f) {
    std::vector<std::string> lines = {"version " + std::to_string(f.version()),
                                      "alignment " + std::to_string(f.alignment()),
                                      "data_offset " + std::to_string(f.data_offset()),
                                      "n_kv " + std::to_string(f.metadata().size()),
                                      "n_tensors " + std::to_string(f.tensors().size())};
    for (const auto& [key, v] : f.metadata()) {
        std::string s = "kv " + key + "=";
        canonical(s, v);
        lines.push_back(std::move(s));
    }
    for (const GgufTensorInfo& t : f.tensors()) {
        std::string ne;
        for (int64_t x : t.ne) {  // appended in two steps: "," + string trips gcc 12's -Wrestrict
            if (!ne.empty()) ne += ',';
            ne += std::to_string(x);
        }
        lines.push_back(strfmt("tensor %s type=%u ne=%s offset=%llu nbytes=%zu crc32=%08x",
                               t.name.c_str(), uint32_t(t.type), ne.c_str(),
                               (unsigned long long)(f.data_offset() + t.offset), t.nbytes,
                               crc32(f.tensor_data(t), t.nbytes)));
    }
    return lines;
}

bool have_gguf_py() {
    return std::system("python3 -c 'import gguf' >/dev/null 2>&1") == 0;
}

// Runs a command and returns its stdout split into lines; fails the test on a non-zero exit.
std::vector<std::string> run_lines(const std::string& cmd) {
    std::vector<std::string> lines;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) {
        ADD_FAILURE() << "popen failed: " << cmd;
        return lines;
    }
    std::string all;
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) all.append(buf, n);
    const int rc = pclose(p);
    EXPECT_EQ(rc, 0) << cmd;
    std::istringstream in(all);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

void compare_with_gguf_py(const std::string& path) {
    auto f = GgufFile::open(path);
    const std::vector<std::string> ours = our_dump(*f);
    const std::vector<std::string> theirs = run_lines("python3 '" + kPyDump + "' '" + path + "'");
    ASSERT_FALSE(theirs.empty());
    auto clip = [](const std::string& s) { return s.size() > 300 ? s.substr(0, 300) + "..." : s; };
    for (size_t k = 0; k < std::max(ours.size(), theirs.size()); k++) {
        const std::string a = k < ours.size() ? ours[k] : "(missing)";
        const std::string b = k < theirs.size() ? theirs[k] : "(missing)";
        if (a != b) {
            // Point at the first differing byte of a long line.
            size_t d = 0;
            while (d < a.size() && d < b.size() && a[d] == b[d]) d++;
            FAIL() << "line " << k << " differs at byte " << d << "\n  ours:    " << clip(a)
                   << "\n  gguf-py: " << clip(b)
                   << "\n  ours@d:    " << clip(a.substr(std::min(d, a.size())))
                   << "\n  gguf-py@d: " << clip(b.substr(std::min(d, b.size())));
        }
    }
    EXPECT_EQ(ours.size(), 5 + f->metadata().size() + f->tensors().size());
}

TEST(GgufVsGgufPy, SmolLM2EveryKeyValueAndTensor) {
    if (!std::filesystem::exists(kSmolPath)) GTEST_SKIP() << kSmolPath << " not present";
    if (!have_gguf_py()) GTEST_SKIP() << "python3 with the gguf package is not available";
    compare_with_gguf_py(kSmolPath);
}

TEST(GgufVsGgufPy, OurWriterEveryTypeReadByGgufPy) {
    if (!have_gguf_py()) GTEST_SKIP() << "python3 with the gguf package is not available";
    GgufWriter w;
    for (auto& [k, v] : all_values()) w.set(k, v);  // NaN, -0 and nested arrays included
    // gguf-py sizes q8_1 blocks at 40 bytes where ggml's C code (and quant/types.h) has 36; the
    // type is an activation format that never appears in model files, so it is left out here.
    for (const SampleTensor& t : all_tensor_types(false))
        w.add_tensor(t.name, t.type, t.ne, t.bytes.data(), t.bytes.size());
    TempFile tmp("ours_for_py");
    w.write(tmp.path, 64);
    compare_with_gguf_py(tmp.path);
}

TEST(GgufVsGgufPy, GgufPyWriterReadByUs) {
    if (!have_gguf_py()) GTEST_SKIP() << "python3 with the gguf package is not available";
    TempFile tmp("py_sample");
    run_lines("python3 '" + kPyDump + "' --write-sample '" + tmp.path + "'");
    compare_with_gguf_py(tmp.path);
    // A few values checked directly, so the comparison is not only self-consistency of dumps.
    auto f = GgufFile::open(tmp.path);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->get_int("test.u8", 0), 200);
    EXPECT_EQ(f->get_int("test.i64", 0), INT64_MIN);
    EXPECT_EQ(f->get_float("test.f64", 0), -1.0 / 3.0);
    EXPECT_EQ(f->get_float("test.f32", 0), double(0.1f));
    EXPECT_EQ(f->get_string("test.string", ""), "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c\n");
    const GgufArray* nested = f->get_array("test.arr_nested");
    ASSERT_NE(nested, nullptr);
    ASSERT_EQ(nested->items.size(), 3u);
    EXPECT_EQ(nested->items[1].as_array().items.at(0).as_int(), 4);
    EXPECT_EQ(f->tensor("q4_k")->ne, (std::vector<int64_t>{256, 1}));
    EXPECT_EQ(f->tensor("q8_0")->nbytes, 136u);
}

}  // namespace
}  // namespace nt
