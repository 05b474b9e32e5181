#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace nt::cli {

namespace {
std::vector<std::string> split_names(const std::string& names) {
    std::vector<std::string> out;
    std::stringstream ss(names);
    std::string s;
    while (std::getline(ss, s, ',')) out.push_back(s);
    return out;
}
}  // namespace

const Opt* Args::find(const std::string& flag) const {
    for (const Opt& o : opts_)
        for (const std::string& n : split_names(o.names))
            if (n == flag) return &o;
    return nullptr;
}

std::string Args::key_of(const Opt& o) const {
    auto names = split_names(o.names);
    return names.back();
}

bool Args::parse(int argc, char** argv, int start) {
    for (int i = start; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            usage(summary_);
            return false;
        }
        if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit((unsigned char)a[1]) || a[1] == '.'))) {
            std::string val;
            bool has_val = false;
            const size_t eq = a.find('=');
            if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
                val = a.substr(eq + 1);
                a = a.substr(0, eq);
                has_val = true;
            }
            const Opt* o = find(a);
            if (!o)
                fail("unknown option '%s' for '%s'; see 'ntransformer %s --help'.", a.c_str(), command_.c_str(),
                     command_.c_str());
            if (o->value.empty()) {
                if (has_val) fail("option '%s' takes no value.", a.c_str());
                values_[key_of(*o)] = std::string(1, '1');  // not a literal: gcc 12 -Wrestrict false positive
            } else {
                if (!has_val) {
                    if (i + 1 >= argc) fail("option '%s' needs a value (%s).", a.c_str(), o->value.c_str());
                    val = argv[++i];
                }
                values_[key_of(*o)] = val;
            }
        } else {
            positional_.push_back(a);
        }
    }
    return true;
}

void Args::usage(const std::string& summary) const {
    std::printf("usage: ntransformer %s [options]\n", command_.c_str());
    if (!summary.empty()) std::printf("\n%s\n", summary.c_str());
    std::printf("\noptions:\n");
    for (const Opt& o : opts_) {
        std::string l2 = "  ";
        for (char c : o.names) l2 += c == ',' ? std::string(", ") : std::string(1, c);
        if (!o.value.empty()) l2 += " " + o.value;
        std::string help = o.help;
        if (!o.def.empty()) help += " (default: " + o.def + ")";
        if (l2.size() < 30)
            std::printf("%-30s %s\n", l2.c_str(), help.c_str());
        else
            std::printf("%s\n%-30s %s\n", l2.c_str(), "", help.c_str());
    }
    std::printf("  -h, --help                   show this help\n");
}

bool Args::has(const std::string& name) const {
    const Opt* o = find(name);
    return o && values_.count(key_of(*o));
}

std::string Args::str(const std::string& name, const std::string& def) const {
    const Opt* o = find(name);
    if (!o) return def;
    auto it = values_.find(key_of(*o));
    return it == values_.end() ? def : it->second;
}

int Args::integer(const std::string& name, int def) const {
    if (!has(name)) return def;
    const std::string s = str(name);
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0 || v < -2147483647L || v > 2147483647L)
        fail("invalid value '%s' for %s: expected an integer.", s.c_str(), name.c_str());
    return int(v);
}

uint64_t Args::u64(const std::string& name, uint64_t def) const {
    if (!has(name)) return def;
    const std::string s = str(name);
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (s.empty() || s[0] == '-' || *end != '\0' || errno != 0)
        fail("invalid value '%s' for %s: expected a non-negative integer.", s.c_str(), name.c_str());
    return uint64_t(v);
}

double Args::number(const std::string& name, double def) const {
    if (!has(name)) return def;
    const std::string s = str(name);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v))
        fail("invalid value '%s' for %s: expected a number.", s.c_str(), name.c_str());
    return v;
}

size_t Args::bytes(const std::string& name, size_t def) const {
    if (!has(name)) return def;
    const std::string s = str(name);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    double mul = 1;
    std::string suf = end ? std::string(end) : "";
    if (suf == "K" || suf == "KiB" || suf == "k") mul = 1024.0;
    else if (suf == "M" || suf == "MiB") mul = 1024.0 * 1024;
    else if (suf == "G" || suf == "GiB" || suf == "g") mul = 1024.0 * 1024 * 1024;
    else if (suf == "T" || suf == "TiB") mul = 1024.0 * 1024 * 1024 * 1024;
    else if (!suf.empty()) fail("invalid size '%s' for %s: use a number with K, M, G or T (e.g. 24G).", s.c_str(), name.c_str());
    if (s.empty() || !std::isfinite(v) || v < 0) fail("invalid size '%s' for %s.", s.c_str(), name.c_str());
    return size_t(v * mul);
}

std::vector<Opt> model_opts() {
    return {
        {"-m,--model", "FILE", "GGUF model file", ""},
        {"-c,--ctx-size", "N", "context size in tokens (0: the model's, capped at 4096)", "0"},
        {"-t,--threads", "N", "CPU threads (0: all cores)", "0"},
        {"--device", "NAME", "cpu, cuda or auto", "auto"},
        {"--exact", "",
         "GPU prompts with the CPU's arithmetic too (bit-identical results; slower prompts)", ""},
        {"-b,--batch-size", "N", "tokens per forward step while reading a prompt", "512"},
        // Tiered memory (GPU backends): where weights may live and how they stream.
        {"--vram-budget", "SIZE", "GPU memory the engine may use, e.g. 24G (default: what is free)",
         ""},
        {"--ram-budget", "SIZE",
         "pinned RAM for streamed layers, e.g. 48G (default: available - 10%)", ""},
        {"--slots", "N", "VRAM ring slots for streamed layers", "3"},
        {"--prefetch", "N", "disk-tier layers read ahead into pinned staging", "3"},
        {"--io-threads", "N", "disk reads in flight", "8"},
        {"--no-direct-io", "", "read the disk tier through the page cache instead of O_DIRECT", ""},
        {"--stream", "", "stream layers even when the model fits in VRAM (measurements)", ""},
        {"--gds", "",
         "read the disk tier with cuFile (GPUDirect Storage) into VRAM; else O_DIRECT, saying why",
         ""},
        {"--trace", "FILE", "write a Chrome trace of the streaming pipeline (generate, bench)", ""},
    };
}

std::vector<Opt> sampling_opts() {
    return {
        {"--temp", "T", "temperature (0: greedy)", "0.8"},
        {"--top-k", "N", "top-k sampling (0: off)", "40"},
        {"--top-p", "P", "top-p sampling (1: off)", "0.95"},
        {"--min-p", "P", "min-p sampling (0: off)", "0.05"},
        {"--repeat-penalty", "X", "penalty for repeated tokens (1: off)", "1.0"},
        {"--repeat-last-n", "N", "tokens considered for penalties", "64"},
        {"--frequency-penalty", "X", "frequency penalty", "0"},
        {"--presence-penalty", "X", "presence penalty", "0"},
        {"-s,--seed", "N", "random seed (default: random)", ""},
    };
}

SamplerParams sampler_params(const Args& a) {
    SamplerParams p;
    p.temperature = float(a.number("--temp", p.temperature));
    p.top_k = a.integer("--top-k", p.top_k);
    p.top_p = float(a.number("--top-p", p.top_p));
    p.min_p = float(a.number("--min-p", p.min_p));
    p.repeat_penalty = float(a.number("--repeat-penalty", p.repeat_penalty));
    p.repeat_last_n = a.integer("--repeat-last-n", p.repeat_last_n);
    p.frequency_penalty = float(a.number("--frequency-penalty", p.frequency_penalty));
    p.presence_penalty = float(a.number("--presence-penalty", p.presence_penalty));
    p.seed = a.u64("--seed", p.seed);
    if (p.top_p <= 0 || p.top_p > 1) fail("--top-p must be in (0, 1].");
    if (p.min_p < 0 || p.min_p >= 1) fail("--min-p must be in [0, 1).");
    if (p.top_k < 0) fail("--top-k must be 0 or more.");
    if (p.temperature < 0) fail("--temp must be 0 or more.");
    if (p.repeat_penalty <= 0) fail("--repeat-penalty must be positive.");
    return p;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open '%s': %s.", path.c_str(), std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace nt::cli
