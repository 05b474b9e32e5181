// Whether GPUDirect Storage (cuFile) is usable here: the library is loaded at run time (it is
// optional and not part of every CUDA install) and its driver opened (it stays open, as the disk
// tier's cuFile reads would open it anyway).
#pragma once
#include <string>

namespace nt::mem {

struct GdsProbe {
    bool library = false;  // libcufile.so found
    bool driver = false;   // cuFileDriverOpen succeeded (nvidia-fs or compatibility mode)
    std::string detail;    // one sentence: what was found, or what is missing and what to do
};

GdsProbe probe_gds();

}  // namespace nt::mem
