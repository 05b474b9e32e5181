#include "server/metrics.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>

#include "core/error.h"

namespace nt::server {

void Metrics::count_request(const std::string& route, int status) {
    std::lock_guard<std::mutex> lk(mu_);
    requests_[{route, status}]++;
}

uint64_t process_resident_bytes() {
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, resident = 0;
    const int n = std::fscanf(f, "%llu %llu", &size, &resident);
    std::fclose(f);
    return n == 2 ? uint64_t(resident) * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
}

namespace {
void family(std::string& out, const char* name, const char* type, const char* help) {
    out += strfmt("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}
void sample(std::string& out, const char* name, double v, const std::string& labels = "") {
    out += name;
    if (!labels.empty()) out += "{" + labels + "}";
    // Integers print exactly; rates keep a few decimals.
    if (v == double(uint64_t(v)) && v < 1e15)
        out += strfmt(" %" PRIu64 "\n", uint64_t(v));
    else
        out += strfmt(" %.6g\n", v);
}
// Label values escape backslash, quote and newline.
std::string label_value(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '\\' || c == '"') o += '\\';
        if (c == '\n') {
            o += "\\n";
            continue;
        }
        o += c;
    }
    return o;
}
}  // namespace

std::string Metrics::render(const SchedulerStats& s) const {
    std::string o;
    family(o, "nt_requests_total", "counter", "HTTP requests answered, by route and status code.");
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const auto& [k, n] : requests_)
            sample(o, "nt_requests_total", double(n),
                   strfmt("route=\"%s\",code=\"%d\"", label_value(k.first).c_str(), k.second));
    }
    family(o, "nt_generations_total", "counter", "Generations finished, by how they ended.");
    for (int r = int(FinishReason::Stop); r <= int(FinishReason::Error); r++)
        sample(o, "nt_generations_total", double(s.finished_by_reason[r]),
               strfmt("reason=\"%s\"", finish_reason_name(FinishReason(r))));
    family(o, "nt_generations_rejected_total", "counter",
           "Generations refused because the queue was full (503).");
    sample(o, "nt_generations_rejected_total", double(s.jobs_rejected));
    family(o, "nt_prompt_tokens_total", "counter",
           "Prompt tokens evaluated (tokens in), reused prefixes excluded.");
    sample(o, "nt_prompt_tokens_total", double(s.prompt_tokens));
    family(o, "nt_prompt_tokens_cached_total", "counter",
           "Prompt tokens whose KV cache was reused from an earlier request.");
    sample(o, "nt_prompt_tokens_cached_total", double(s.prompt_tokens_cached));
    family(o, "nt_generated_tokens_total", "counter", "Tokens generated (tokens out).");
    sample(o, "nt_generated_tokens_total", double(s.generated_tokens));
    family(o, "nt_generated_tokens_per_second", "gauge",
           "Generated tokens per second over the last 10 s, all requests.");
    sample(o, "nt_generated_tokens_per_second", s.generated_per_second);
    family(o, "nt_prompt_tokens_per_second", "gauge",
           "Prompt tokens evaluated per second over the last 10 s.");
    sample(o, "nt_prompt_tokens_per_second", s.prompt_per_second);
    family(o, "nt_queue_depth", "gauge", "Requests waiting for a slot.");
    sample(o, "nt_queue_depth", double(s.queued));
    family(o, "nt_slots_busy", "gauge", "Slots running a request.");
    sample(o, "nt_slots_busy", double(s.active));
    family(o, "nt_slots_total", "gauge", "Parallel slots (sequences sharing the KV cache).");
    sample(o, "nt_slots_total", double(s.slots));
    family(o, "nt_steps_total", "counter", "Batched forward steps.");
    sample(o, "nt_steps_total", double(s.steps));
    family(o, "nt_step_tokens_total", "counter",
           "Tokens evaluated in forward steps (prompt chunks and decode).");
    sample(o, "nt_step_tokens_total", double(s.step_tokens));
    family(o, "nt_step_seconds_total", "counter", "Time spent in forward steps and sampling.");
    sample(o, "nt_step_seconds_total", s.step_seconds);
    static const char* const kTiers[3] = {"vram", "ram", "disk"};
    family(o, "nt_weight_bytes", "gauge", "Model weight bytes held in each memory tier.");
    for (int t = 0; t < 3; t++)
        sample(o, "nt_weight_bytes", double(facts_.tier_bytes[t]), strfmt("tier=\"%s\"", kTiers[t]));
    family(o, "nt_weight_bytes_read_total", "counter",
           "Weight bytes read by forward steps, by the tier they came from.");
    for (int t = 0; t < 3; t++)
        sample(o, "nt_weight_bytes_read_total", double(facts_.step_bytes[t]) * double(s.steps),
               strfmt("tier=\"%s\"", kTiers[t]));
    family(o, "nt_kv_cache_bytes", "gauge", "Bytes of the KV cache (all slots).");
    sample(o, "nt_kv_cache_bytes", double(facts_.kv_cache_bytes));
    family(o, "nt_context_tokens", "gauge", "Context size of each slot, in tokens.");
    sample(o, "nt_context_tokens", double(facts_.n_ctx));
    family(o, "nt_process_resident_bytes", "gauge", "Resident memory of the server process.");
    sample(o, "nt_process_resident_bytes", double(process_resident_bytes()));
    return o;
}

}  // namespace nt::server
