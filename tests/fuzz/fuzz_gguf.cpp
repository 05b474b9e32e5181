// libFuzzer target for the GGUF reader and writer. Any input must either be refused with
// nt::Error or parse into something every consumer can use safely; whatever parses must also
// survive a writer -> reader round trip unchanged. Anything else (crash, leak, UB, another
// exception, a mismatch) is a bug.
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "gguf/gguf.h"

namespace {

bool same(const nt::GgufValue& a, const nt::GgufValue& b) {
    if (a.type != b.type || a.v.index() != b.v.index()) return false;
    if (a.type == nt::GgufValueType::ARRAY) {
        const nt::GgufArray &x = a.as_array(), &y = b.as_array();
        if (x.elem_type != y.elem_type || x.items.size() != y.items.size()) return false;
        for (size_t k = 0; k < x.items.size(); k++)
            if (!same(x.items[k], y.items[k])) return false;
        return true;
    }
    if (const double* p = std::get_if<double>(&a.v)) {  // bit for bit: NaN payloads, -0
        const double q = std::get<double>(b.v);
        return std::memcmp(p, &q, sizeof q) == 0;
    }
    return a.v == b.v;
}

// What a consumer does with a parsed file: getters, display, reading every tensor byte range.
void use(const nt::GgufFile& f, const uint8_t* data, size_t size) {
    for (const auto& [key, v] : f.metadata()) {
        (void)nt::describe_value(v, 4, 32);
        try {
            (void)f.get_int(key, 0);
        } catch (const nt::Error&) {
        }
        try {
            (void)f.get_string(key, "");
        } catch (const nt::Error&) {
        }
        try {
            (void)f.get_float(key, 0);
        } catch (const nt::Error&) {
        }
        if (f.find(key) != &v) __builtin_trap();
    }
    volatile uint8_t sink = 0;
    for (const nt::GgufTensorInfo& t : f.tensors()) {
        const uint8_t* p = f.tensor_data(t);
        // The reader promised the whole range lies inside the input; ASan checks the bytes too.
        if (t.nbytes == 0 || p < data || p + t.nbytes > data + size) __builtin_trap();
        if (size_t(t.nelements()) / size_t(nt::traits(t.type).block_elems) *
                size_t(nt::traits(t.type).block_bytes) !=
            t.nbytes)
            __builtin_trap();
        sink = sink + p[0] + p[t.nbytes - 1];
        if (t.rows() <= 0 || f.tensor(t.name) != &t) __builtin_trap();
    }
}

void round_trip(const nt::GgufFile& f) {
    nt::GgufWriter w;
    for (const auto& [key, v] : f.metadata()) w.set(key, v);
    for (const nt::GgufTensorInfo& t : f.tensors())
        w.add_tensor(t.name, t.type, t.ne, f.tensor_data(t), t.nbytes);
    const std::vector<uint8_t> bytes = w.to_bytes(f.alignment());
    auto g = nt::GgufFile::parse(bytes.data(), bytes.size(), "round-trip.gguf");
    if (g->alignment() != f.alignment() || g->metadata().size() != f.metadata().size() ||
        g->tensors().size() != f.tensors().size())
        __builtin_trap();
    for (size_t k = 0; k < f.metadata().size(); k++) {
        if (g->metadata()[k].first != f.metadata()[k].first) __builtin_trap();
        if (!same(g->metadata()[k].second, f.metadata()[k].second)) __builtin_trap();
    }
    for (size_t k = 0; k < f.tensors().size(); k++) {
        const nt::GgufTensorInfo &a = f.tensors()[k], &b = g->tensors()[k];
        if (a.name != b.name || a.type != b.type || a.ne != b.ne || a.nbytes != b.nbytes)
            __builtin_trap();
        if (std::memcmp(f.tensor_data(a), g->tensor_data(b), a.nbytes) != 0) __builtin_trap();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<nt::GgufFile> f;
    try {
        f = nt::GgufFile::parse(data, size, "fuzz.gguf");
    } catch (const nt::Error& e) {
        // Refusals must still be one sentence naming the file.
        if (std::strncmp(e.what(), "fuzz.gguf: ", 11) != 0) __builtin_trap();
        return 0;
    }
    use(*f, data, size);
    round_trip(*f);  // an nt::Error here escapes and is reported as a crash: it is a bug
    return 0;
}
