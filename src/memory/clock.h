// One host timeline for everything the memory pipeline measures: disk reads (host threads),
// copies and kernels (device events anchored to this clock), so stats and traces line up.
#pragma once
#include <chrono>

namespace nt::mem {

// Seconds on the steady clock since the first call in this process.
inline double now_seconds() {
    using clock = std::chrono::steady_clock;
    static const clock::time_point epoch = clock::now();
    return std::chrono::duration<double>(clock::now() - epoch).count();
}

}  // namespace nt::mem
