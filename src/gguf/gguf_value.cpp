// GgufValue accessors and builders, type names, and the display form used by `ntransformer info`.
#include <charconv>
#include <cinttypes>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace nt {

const char* gguf_type_name(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
            return "uint8";
        case GgufValueType::INT8:
            return "int8";
        case GgufValueType::UINT16:
            return "uint16";
        case GgufValueType::INT16:
            return "int16";
        case GgufValueType::UINT32:
            return "uint32";
        case GgufValueType::INT32:
            return "int32";
        case GgufValueType::FLOAT32:
            return "float32";
        case GgufValueType::BOOL:
            return "bool";
        case GgufValueType::STRING:
            return "string";
        case GgufValueType::ARRAY:
            return "array";
        case GgufValueType::UINT64:
            return "uint64";
        case GgufValueType::INT64:
            return "int64";
        case GgufValueType::FLOAT64:
            return "float64";
    }
    return "unknown";
}

bool GgufValue::is_int() const {
    return std::holds_alternative<uint64_t>(v) || std::holds_alternative<int64_t>(v);
}

bool GgufValue::is_float() const {
    return std::holds_alternative<double>(v);
}

int64_t GgufValue::as_int() const {
    if (const int64_t* i = std::get_if<int64_t>(&v)) return *i;
    if (const uint64_t* u = std::get_if<uint64_t>(&v)) {
        if (*u > uint64_t(std::numeric_limits<int64_t>::max()))
            fail("GGUF value %" PRIu64 " does not fit in a signed 64-bit integer.", *u);
        return int64_t(*u);
    }
    fail("GGUF value of type %s is not an integer.", gguf_type_name(type));
}

double GgufValue::as_float() const {
    if (const double* d = std::get_if<double>(&v)) return *d;
    if (const int64_t* i = std::get_if<int64_t>(&v)) return double(*i);
    if (const uint64_t* u = std::get_if<uint64_t>(&v)) return double(*u);
    fail("GGUF value of type %s is not a number.", gguf_type_name(type));
}

const std::string& GgufValue::as_string() const {
    if (const std::string* s = std::get_if<std::string>(&v)) return *s;
    fail("GGUF value of type %s is not a string.", gguf_type_name(type));
}

const GgufArray& GgufValue::as_array() const {
    const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v);
    if (a && *a) return **a;
    fail("GGUF value of type %s is not an array.", gguf_type_name(type));
}

GgufValue GgufValue::of_uint(GgufValueType t, uint64_t x) {
    uint64_t max = 0;
    switch (t) {
        case GgufValueType::UINT8:
            max = UINT8_MAX;
            break;
        case GgufValueType::UINT16:
            max = UINT16_MAX;
            break;
        case GgufValueType::UINT32:
            max = UINT32_MAX;
            break;
        case GgufValueType::UINT64:
            max = UINT64_MAX;
            break;
        default:
            fail("GGUF type %s is not an unsigned integer type.", gguf_type_name(t));
    }
    if (x > max) fail("GGUF value %" PRIu64 " does not fit in %s.", x, gguf_type_name(t));
    GgufValue r;
    r.type = t;
    r.v = x;
    return r;
}

GgufValue GgufValue::of_int(GgufValueType t, int64_t x) {
    int64_t lo = 0, hi = 0;
    switch (t) {
        case GgufValueType::INT8:
            lo = INT8_MIN, hi = INT8_MAX;
            break;
        case GgufValueType::INT16:
            lo = INT16_MIN, hi = INT16_MAX;
            break;
        case GgufValueType::INT32:
            lo = INT32_MIN, hi = INT32_MAX;
            break;
        case GgufValueType::INT64:
            lo = INT64_MIN, hi = INT64_MAX;
            break;
        default:
            fail("GGUF type %s is not a signed integer type.", gguf_type_name(t));
    }
    if (x < lo || x > hi) fail("GGUF value %" PRId64 " does not fit in %s.", x, gguf_type_name(t));
    GgufValue r;
    r.type = t;
    r.v = x;
    return r;
}

GgufValue GgufValue::of_float(GgufValueType t, double x) {
    if (t != GgufValueType::FLOAT32 && t != GgufValueType::FLOAT64)
        fail("GGUF type %s is not a floating-point type.", gguf_type_name(t));
    GgufValue r;
    r.type = t;
    // A float32 value holds exactly what the file will hold, so a round trip compares equal.
    r.v = t == GgufValueType::FLOAT32 ? double(float(x)) : x;
    return r;
}

GgufValue GgufValue::of_bool(bool x) {
    GgufValue r;
    r.type = GgufValueType::BOOL;
    r.v = x;
    return r;
}

GgufValue GgufValue::of_string(std::string s) {
    GgufValue r;
    r.type = GgufValueType::STRING;
    r.v = std::move(s);
    return r;
}

GgufValue GgufValue::of_array(GgufValueType elem_type, std::vector<GgufValue> items) {
    if (uint32_t(elem_type) > uint32_t(GgufValueType::FLOAT64))
        fail("GGUF array element type %u is unknown.", unsigned(elem_type));
    for (size_t i = 0; i < items.size(); i++) {
        if (items[i].type != elem_type)
            fail("GGUF array of %s holds a %s at index %zu.", gguf_type_name(elem_type),
                 gguf_type_name(items[i].type), i);
    }
    auto a = std::make_shared<GgufArray>();
    a->elem_type = elem_type;
    a->items = std::move(items);
    GgufValue r;
    r.type = GgufValueType::ARRAY;
    r.v = std::move(a);
    return r;
}

// ---- display ----

static void append_escaped(std::string& out, const std::string& s, size_t max_bytes) {
    out += '"';
    const size_t n = s.size() < max_bytes ? s.size() : max_bytes;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    out += strfmt("\\x%02x", c);
                } else {
                    out += char(c);  // UTF-8 bytes pass through for the terminal to show
                }
        }
    }
    out += '"';
    if (n < s.size()) out += strfmt("... (%zu bytes)", s.size());
}

static void append_value(std::string& out, const GgufValue& v, size_t max_items,
                         size_t max_string_bytes) {
    char buf[64];
    if (const uint64_t* u = std::get_if<uint64_t>(&v.v)) {
        out += std::to_string(*u);
    } else if (const int64_t* i = std::get_if<int64_t>(&v.v)) {
        out += std::to_string(*i);
    } else if (const double* d = std::get_if<double>(&v.v)) {
        // Shortest text that reads back to the same value, at the width the file stores.
        std::to_chars_result r = v.type == GgufValueType::FLOAT32
                                     ? std::to_chars(buf, buf + sizeof buf, float(*d))
                                     : std::to_chars(buf, buf + sizeof buf, *d);
        out.append(buf, r.ptr);
    } else if (const bool* b = std::get_if<bool>(&v.v)) {
        out += *b ? "true" : "false";
    } else if (const std::string* s = std::get_if<std::string>(&v.v)) {
        append_escaped(out, *s, max_string_bytes);
    } else {
        const auto& a = std::get<std::shared_ptr<GgufArray>>(v.v);
        if (!a) {
            out += "[]";
            return;
        }
        out += '[';
        const size_t n = a->items.size();
        const size_t shown = n < max_items ? n : max_items;
        for (size_t k = 0; k < shown; k++) {
            if (k) out += ", ";
            append_value(out, a->items[k], max_items, max_string_bytes);
        }
        if (shown < n)
            out += shown ? ", ...]" : "...]";
        else
            out += ']';
        if (shown < n) out += strfmt(" (%zu items of %s)", n, gguf_type_name(a->elem_type));
    }
}

std::string describe_value(const GgufValue& v, size_t max_items, size_t max_string_bytes) {
    std::string out;
    append_value(out, v, max_items, max_string_bytes);
    return out;
}

}  // namespace nt
