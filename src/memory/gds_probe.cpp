#include "memory/gds_probe.h"

#include <dlfcn.h>

#include "core/error.h"

namespace nt::mem {

namespace {
// cufile.h: typedef struct CUfileError { CUfileOpError err; CUresult cu_err; } CUfileError_t;
struct CuFileError {
    int err;
    int cu_err;
};
using DriverFn = CuFileError (*)();
}  // namespace

GdsProbe probe_gds() {
    GdsProbe p;
    void* lib = nullptr;
    for (const char* name : {"libcufile.so.0", "libcufile.so", "libcufile.so.1"})
        if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) {
        p.detail = "libcufile.so is not installed (GPUDirect Storage is part of the full CUDA toolkit "
                   "and needs the nvidia-fs driver); disk reads use O_DIRECT into pinned memory";
        return p;
    }
    p.library = true;
    auto open_fn = reinterpret_cast<DriverFn>(dlsym(lib, "cuFileDriverOpen"));
    if (!open_fn) open_fn = reinterpret_cast<DriverFn>(dlsym(lib, "cuFileDriverOpen_v2"));
    auto close_fn = reinterpret_cast<DriverFn>(dlsym(lib, "cuFileDriverClose"));
    if (!close_fn) close_fn = reinterpret_cast<DriverFn>(dlsym(lib, "cuFileDriverClose_v2"));
    if (!open_fn) {
        p.detail = "libcufile.so has no cuFileDriverOpen; the installed GDS library is not usable";
    } else {
        const CuFileError e = open_fn();
        if (e.err == 0) {
            p.driver = true;
            p.detail = "cuFileDriverOpen succeeded: GPUDirect Storage is usable on this machine";
            if (close_fn) close_fn();
        } else {
            p.detail = strfmt("cuFileDriverOpen failed (cuFile error %d, CUDA error %d): the nvidia-fs "
                              "kernel module is probably not loaded; disk reads use O_DIRECT into "
                              "pinned memory",
                              e.err, e.cu_err);
        }
    }
    dlclose(lib);
    return p;
}

}  // namespace nt::mem
