// Settings read from the environment (A/B runs: NT_CUDA_GRAPHS, NT_PDL, NT_TMA_RING, ...).
#pragma once
#include <cstdlib>
#include <cstring>

namespace nt {

// True unless the variable is set to "0".
inline bool env_switch(const char* name) {
    const char* v = std::getenv(name);
    return !(v && std::strcmp(v, "0") == 0);
}

// The variable's integer value (as atoll reads it), or `fallback` when it is not set.
inline long long env_int(const char* name, long long fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoll(v) : fallback;
}

}  // namespace nt
