// GET /metrics: the server's counters and gauges in the Prometheus text format (version 0.0.4).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "server/scheduler.h"

namespace nt::server {

// What does not change while the server runs.
struct ModelFacts {
    std::string model_name;
    // Weight bytes held in each tier (vram, ram, disk) and read from each by one forward step.
    // Resident models read everything from where it lives; with streaming, pinned-RAM and disk
    // layers are copied once per step whatever the batch (the tier planner's figures).
    uint64_t tier_bytes[3] = {0, 0, 0};
    uint64_t step_bytes[3] = {0, 0, 0};
    uint64_t kv_cache_bytes = 0;
    int n_ctx = 0, n_slots = 0;
};

class Metrics {
  public:
    explicit Metrics(ModelFacts facts) : facts_(std::move(facts)) {}
    // One finished HTTP exchange; `route` is a known route or "other".
    void count_request(const std::string& route, int status);
    std::string render(const SchedulerStats& s) const;

  private:
    ModelFacts facts_;
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
};

// Resident set size of this process in bytes (0 where /proc is unavailable).
uint64_t process_resident_bytes();

}  // namespace nt::server
