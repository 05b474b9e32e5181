#include "memory/trace.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace nt::mem {

std::string json_escape(const std::string& s) {
    std::string o;
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += char(c);
        } else if (c < 0x20) {
            o += strfmt("\\u%04x", c);
        } else {
            o += char(c);
        }
    }
    return o;
}

void TraceWriter::name_lane(int lane, const std::string& name) { lanes_[lane] = name; }

void TraceWriter::add(const std::string& name, const char* category, int lane, double t0, double t1,
                      const std::vector<std::pair<std::string, double>>& args) {
    if (events_.size() >= kMaxEvents) {
        dropped_++;
        return;
    }
    events_.push_back({name, category, lane, t0, std::max(t1, t0), args});
}

std::string TraceWriter::json() const {
    std::string o = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    bool first = true;
    auto sep = [&] {
        if (!first) o += ",\n";
        first = false;
    };
    sep();
    o += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": {\"name\": "
         "\"ntransformer memory pipeline\"}}";
    for (const auto& [lane, name] : lanes_) {
        sep();
        o += strfmt("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": "
                    "{\"name\": \"%s\"}}",
                    lane, json_escape(name).c_str());
        sep();
        o += strfmt("{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, "
                    "\"args\": {\"sort_index\": %d}}",
                    lane, lane);
    }
    for (const Event& e : events_) {
        sep();
        // Microseconds with sub-microsecond digits: boxes a few µs long stay visible.
        o += strfmt("{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, "
                    "\"ts\": %.3f, \"dur\": %.3f",
                    json_escape(e.name).c_str(), e.category, e.lane, e.t0 * 1e6, (e.t1 - e.t0) * 1e6);
        if (!e.args.empty()) {
            o += ", \"args\": {";
            for (size_t i = 0; i < e.args.size(); i++) {
                const double v = std::isfinite(e.args[i].second) ? e.args[i].second : 0.0;
                o += strfmt("%s\"%s\": %.6g", i ? ", " : "", json_escape(e.args[i].first).c_str(), v);
            }
            o += "}";
        }
        o += "}";
    }
    o += "\n]";
    if (dropped_) o += strfmt(", \"otherData\": {\"dropped_events\": %zu}", dropped_);
    o += "}\n";
    return o;
}

void TraceWriter::write(const std::string& path) const {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) fail("cannot write the trace to '%s': %s.", path.c_str(), std::strerror(errno));
    const std::string s = json();
    const size_t n = std::fwrite(s.data(), 1, s.size(), f);
    const bool ok = n == s.size() && std::fclose(f) == 0;
    if (!ok) fail("writing the trace to '%s' failed: %s.", path.c_str(), std::strerror(errno));
}

}  // namespace nt::mem
