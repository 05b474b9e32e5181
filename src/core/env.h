// On/off switches read from the environment (A/B runs: NT_CUDA_GRAPHS, NT_PDL, ...).
#pragma once
#include <cstdlib>
#include <cstring>

namespace nt {

// True unless the variable is set to "0".
inline bool env_switch(const char* name) {
    const char* v = std::getenv(name);
    return !(v && std::strcmp(v, "0") == 0);
}

}  // namespace nt
