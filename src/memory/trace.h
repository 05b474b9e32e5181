// Chrome-trace JSON (chrome://tracing, ui.perfetto.dev) of the memory pipeline: one row per
// lane (compute stream, copy stream, each disk reader thread, the host), one box per layer
// computed, layer copied, chunk read or host wait.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace nt::mem {

enum TraceLane : int { kLaneHost = 1, kLaneCompute = 2, kLaneCopy = 3, kLaneDisk = 10 };

class TraceWriter {
public:
    static constexpr size_t kMaxEvents = 4u << 20;  // a long run keeps its first 4M boxes

    void name_lane(int lane, const std::string& name);
    // A box from t0 to t1 (seconds on mem::now_seconds()); `args` are shown beside it.
    void add(const std::string& name, const char* category, int lane, double t0, double t1,
             const std::vector<std::pair<std::string, double>>& args = {});
    size_t size() const { return events_.size(); }
    size_t dropped() const { return dropped_; }
    std::string json() const;
    void write(const std::string& path) const;  // throws nt::Error naming the file

private:
    struct Event {
        std::string name;
        const char* category;
        int lane;
        double t0, t1;
        std::vector<std::pair<std::string, double>> args;
    };
    std::vector<Event> events_;
    std::map<int, std::string> lanes_;
    size_t dropped_ = 0;
};

std::string json_escape(const std::string& s);

}  // namespace nt::mem
