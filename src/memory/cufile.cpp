#include "memory/cufile.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "memory/io_reader.h"
#include "memory/planner.h"

namespace nt::mem {

namespace {

constexpr int kHandleTypeOpaqueFd = 1;    // CU_FILE_HANDLE_TYPE_OPAQUE_FD
constexpr int kDriverAlreadyOpen = 5026;  // CU_FILE_DRIVER_ALREADY_OPEN

// The cuFile statuses a user is likely to meet, by name (cufile.h's CUfileOpError).
const char* status_name(int err) {
    switch (err) {
        case 5001: return "driver not initialized";
        case 5007: return "platform not supported";
        case 5008: return "I/O not supported on this file";
        case 5009: return "device not supported";
        case 5010: return "nvidia-fs driver error";
        case 5011: return "CUDA driver error";
        case 5018: return "file type not supported";
        case 5020: return "O_DIRECT not set";
        case 5025: return "permission denied";
        case 5030: return "internal error, see cufile.log";
        case 5034: return "I/O disabled by cufile.json";
        case 5036: return "GPU memory pinning failed";
        case 5044: return "I/O error";
        default: return nullptr;
    }
}

std::string not_installed(const char* name) {
    return strfmt("%s (GPUDirect Storage) is not installed: install the CUDA toolkit's GDS package (libcufile, "
                  "and the nvidia-fs driver for direct DMA); disk-tier layers are read with O_DIRECT into "
                  "pinned memory instead",
                  name);
}

std::string status_text(const CuFileStatus& s) {
    const char* name = status_name(s.err);
    std::string t = name ? strfmt("cuFile error %d, %s", s.err, name) : strfmt("cuFile error %d", s.err);
    if (s.cu_err) t += strfmt(", CUDA error %d", s.cu_err);
    return t;
}

}  // namespace

const CuFileApi* load_cufile_library(const char* name, std::string* why) {
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        *why = not_installed(name);
        return nullptr;
    }
    auto sym = [&](const char* a, const char* b) -> void* {
        void* p = dlsym(lib, a);
        return p || !b ? p : dlsym(lib, b);
    };
    auto* api = new CuFileApi{};  // lives as long as the process (the library stays loaded)
    api->driver_open = reinterpret_cast<CuFileStatus (*)()>(sym("cuFileDriverOpen", "cuFileDriverOpen_v2"));
    api->handle_register =
        reinterpret_cast<CuFileStatus (*)(void**, CuFileDescr*)>(sym("cuFileHandleRegister", nullptr));
    api->handle_deregister = reinterpret_cast<void (*)(void*)>(sym("cuFileHandleDeregister", nullptr));
    api->buf_register =
        reinterpret_cast<CuFileStatus (*)(const void*, size_t, int)>(sym("cuFileBufRegister", nullptr));
    api->buf_deregister = reinterpret_cast<CuFileStatus (*)(const void*)>(sym("cuFileBufDeregister", nullptr));
    api->read = reinterpret_cast<ssize_t (*)(void*, void*, size_t, off_t, off_t)>(sym("cuFileRead", nullptr));
    const char* missing = !api->driver_open         ? "cuFileDriverOpen"
                          : !api->handle_register   ? "cuFileHandleRegister"
                          : !api->handle_deregister ? "cuFileHandleDeregister"
                          : !api->buf_register      ? "cuFileBufRegister"
                          : !api->buf_deregister    ? "cuFileBufDeregister"
                          : !api->read              ? "cuFileRead"
                                                    : nullptr;
    if (missing) {
        delete api;
        dlclose(lib);
        *why = strfmt("%s has no %s, so it is not a usable GPUDirect Storage library: reinstall the CUDA "
                      "toolkit's GDS package; disk-tier layers are read with O_DIRECT into pinned memory "
                      "instead",
                      name, missing);
        return nullptr;
    }
    return api;
}

const CuFileApi* cufile_api(std::string* why) {
    static std::mutex mu;
    static const CuFileApi* api = nullptr;
    static std::string failure;
    static bool tried = false;
    std::lock_guard<std::mutex> lk(mu);
    if (!tried) {
        tried = true;
        for (const char* name : {"libcufile.so.0", "libcufile.so", "libcufile.so.1"}) {
            std::string w;
            if ((api = load_cufile_library(name, &w))) break;
            if (w.find("has no") != std::string::npos) failure = w;  // there, but broken
        }
        if (!api && failure.empty()) failure = not_installed("libcufile.so");
    }
    if (!api) *why = failure;
    return api;
}

bool cufile_driver_open(const CuFileApi* api, std::string* why) {
    static std::mutex mu;
    static std::vector<const CuFileApi*> open;
    std::lock_guard<std::mutex> lk(mu);
    if (std::find(open.begin(), open.end(), api) != open.end()) return true;
    const CuFileStatus s = api->driver_open();
    if (s.err != 0 && s.err != kDriverAlreadyOpen) {
        *why = strfmt("cuFileDriverOpen failed (%s): load the nvidia-fs kernel module (modprobe nvidia-fs) or "
                      "enable cuFile's compatibility mode (\"allow_compat_mode\": true in /etc/cufile.json); "
                      "disk-tier layers are read with O_DIRECT into pinned memory instead",
                      status_text(s).c_str());
        return false;
    }
    open.push_back(api);  // never closed: readers share it, and the library closes it at exit
    return true;
}

GdsReadFailure classify_gds_read_failure(ssize_t ret, int err) {
    // -CUfileOpError: cuFile's own trouble. Even CU_FILE_IO_ERROR goes back to O_DIRECT, which
    // then either reads the data or ends in the disk's own error, stated plainly.
    if (ret != -1) return GdsReadFailure::FallBack;
    switch (err) {
        case EINTR: return GdsReadFailure::Retry;
        case EIO:
        case ENODATA:
        case ENXIO:
        case EBADMSG:
        case EREMOTEIO: return GdsReadFailure::DiskError;
        default: return GdsReadFailure::FallBack;  // EINVAL, EFAULT, ENOMEM, EOPNOTSUPP, ...
    }
}

std::string describe_gds_read_failure(ssize_t ret, int err) {
    if (ret == -1) return std::strerror(err ? err : EIO);
    return status_text({int(-ret), 0});
}

std::unique_ptr<GdsFile> GdsFile::open(const std::string& path, const CuFileApi* api, std::string* why) {
    if (!cufile_driver_open(api, why)) return nullptr;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) {
        *why = strfmt("GPUDirect Storage needs O_DIRECT, which the %s file system holding '%s' refuses (%s): "
                      "put the model on an ext4 or xfs NVMe file system for GPUDirect Storage",
                      filesystem_name(path).c_str(), path.c_str(), std::strerror(errno));
        return nullptr;
    }
    CuFileDescr d{};
    d.type = kHandleTypeOpaqueFd;
    d.handle.fd = fd;
    d.fs_ops = nullptr;
    void* fh = nullptr;
    const CuFileStatus s = api->handle_register(&fh, &d);
    if (s.err != 0) {
        ::close(fd);
        *why = strfmt("cuFile cannot read '%s' on its %s file system (cuFileHandleRegister: %s): put the model "
                      "on an ext4 or xfs NVMe file system that GPUDirect Storage supports; disk-tier layers are "
                      "read with O_DIRECT into pinned memory instead",
                      path.c_str(), filesystem_name(path).c_str(), status_text(s).c_str());
        return nullptr;
    }
    std::unique_ptr<GdsFile> f(new GdsFile());
    f->api_ = api;
    f->fd_ = fd;
    f->handle_ = fh;
    return f;
}

GdsFile::~GdsFile() {
    for (const Region& r : regions_) api_->buf_deregister(r.base);
    if (handle_) api_->handle_deregister(handle_);
    if (fd_ >= 0) ::close(fd_);
}

bool GdsFile::register_buffer(void* base, size_t bytes, std::string* why) {
    const CuFileStatus s = api_->buf_register(base, bytes, 0);
    if (s.err != 0) {
        *why = strfmt("cuFileBufRegister refused the %s of VRAM slots (%s), so cuFile reads them through its own "
                      "bounce buffers (slower): a GPU with a larger BAR1 aperture (resizable BAR on) registers "
                      "them",
                      format_gib(bytes).c_str(), status_text(s).c_str());
        return false;
    }
    regions_.push_back({static_cast<char*>(base), bytes});
    return true;
}

ssize_t GdsFile::read(void* dst, size_t n, uint64_t file_offset) {
    // Registered buffers are named by their base and an offset into them (cuFile's rule).
    char* p = static_cast<char*>(dst);
    for (const Region& r : regions_)
        if (p >= r.base && p < r.base + r.bytes)
            return api_->read(handle_, r.base, n, off_t(file_offset), off_t(p - r.base));
    return api_->read(handle_, dst, n, off_t(file_offset), 0);
}

}  // namespace nt::mem
