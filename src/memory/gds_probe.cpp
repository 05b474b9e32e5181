#include "memory/gds_probe.h"

#include "memory/cufile.h"

namespace nt::mem {

GdsProbe probe_gds() {
    GdsProbe p;
    const CuFileApi* api = cufile_api(&p.detail);
    if (!api) return p;
    p.library = true;
    if (!cufile_driver_open(api, &p.detail)) return p;
    p.driver = true;
    p.detail = "cuFileDriverOpen succeeded: GPUDirect Storage is usable on this machine (--gds)";
    return p;
}

}  // namespace nt::mem
