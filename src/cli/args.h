// Command-line parsing for the subcommands: flags follow llama.cpp's where they overlap.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace nt::cli {

struct Opt {
    std::string names;     // "-m,--model"
    std::string value;     // value placeholder ("FILE"); empty for a switch
    std::string help;
    std::string def;       // default shown in --help; empty for none
};

class Args {
public:
    Args(std::string command, std::vector<Opt> opts) : command_(std::move(command)), opts_(std::move(opts)) {}
    // Parses argv[start..]; returns false when --help was asked (usage already printed).
    bool parse(int argc, char** argv, int start);
    void usage(const std::string& summary) const;
    void set_summary(std::string s) { summary_ = std::move(s); }

    bool has(const std::string& name) const;  // any alias, e.g. "--model"
    std::string str(const std::string& name, const std::string& def = "") const;
    int integer(const std::string& name, int def) const;
    double number(const std::string& name, double def) const;
    uint64_t u64(const std::string& name, uint64_t def) const;
    size_t bytes(const std::string& name, size_t def) const;  // "24G", "512M", "1.5G", plain bytes
    const std::vector<std::string>& positional() const { return positional_; }

private:
    const Opt* find(const std::string& flag) const;
    std::string key_of(const Opt& o) const;
    std::string command_, summary_;
    std::vector<Opt> opts_;
    std::map<std::string, std::string> values_;
    std::vector<std::string> positional_;
};

// Options shared by the subcommands that load a model.
std::vector<Opt> model_opts();
std::vector<Opt> sampling_opts();
SamplerParams sampler_params(const Args& a);
std::string read_file(const std::string& path);  // throws nt::Error naming the file

}  // namespace nt::cli
