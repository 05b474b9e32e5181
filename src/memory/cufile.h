// GPUDirect Storage: the few cuFile calls the disk tier uses to read layers from the file
// straight into VRAM. libcufile is optional (not every CUDA install has it, and it needs the
// nvidia-fs driver or cuFile's compatibility mode), so it is loaded at run time with dlopen and
// nothing links against it; the ABI types below are declared here from cufile.h's public layout.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace nt::mem {

// cufile.h's CUfileError_t: a cuFile status (0: success, 5000+: CUfileOpError) and a CUresult.
struct CuFileStatus {
    int err;
    int cu_err;
};

// cufile.h's CUfileDescr_t for a Linux descriptor (type CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1).
struct CuFileDescr {
    int type;
    union {
        int fd;
        void* handle;
    } handle;
    const void* fs_ops;
};

// The functions, as libcufile exports them (or as a test fakes them).
struct CuFileApi {
    CuFileStatus (*driver_open)();
    CuFileStatus (*handle_register)(void** fh, CuFileDescr* descr);
    void (*handle_deregister)(void* fh);
    CuFileStatus (*buf_register)(const void* base, size_t length, int flags);
    CuFileStatus (*buf_deregister)(const void* base);
    // Bytes read; -1 with errno set for file system errors; -CUfileOpError for cuFile's own.
    ssize_t (*read)(void* fh, void* base, size_t size, off_t file_offset, off_t base_offset);
};

// libcufile's functions, loaded once per process; null, with one sentence in `why` saying what is
// missing and what to do, when the library is not installed or lacks a function.
const CuFileApi* cufile_api(std::string* why);
// The same from a named library, not cached (tests: a library that is not there).
const CuFileApi* load_cufile_library(const char* name, std::string* why);

// Opens the cuFile driver once per process for `api` (it stays open: several readers may share
// it). False, with `why`, when the driver cannot be opened.
bool cufile_driver_open(const CuFileApi* api, std::string* why);

// What a failed cuFileRead means for the caller.
enum class GdsReadFailure {
    Retry,      // interrupted: issue it again
    DiskError,  // the medium failed (EIO and the like): the same clear error as an O_DIRECT read
    FallBack,   // cuFile itself cannot do this read; O_DIRECT into pinned memory can
};
GdsReadFailure classify_gds_read_failure(ssize_t ret, int err);
// "cuFile error 5008" or the errno text, for messages.
std::string describe_gds_read_failure(ssize_t ret, int err);

// A cuFileRead that cuFile cannot do here (not a failure of the disk): the disk tier goes back
// to O_DIRECT reads into pinned staging.
struct GdsReadError : Error {
    explicit GdsReadError(const std::string& msg) : Error(msg) {}
};

// One file opened for cuFile reads: the driver open, an O_DIRECT descriptor of its own (cuFile
// requires one) and the cuFile handle registered on it, plus the device buffers registered for
// direct DMA.
class GdsFile {
public:
    // Null, with one sentence in `why`, when cuFile cannot read this file (driver, O_DIRECT or
    // the handle registration refused: a file system GDS does not support).
    static std::unique_ptr<GdsFile> open(const std::string& path, const CuFileApi* api, std::string* why);
    ~GdsFile();  // deregisters the buffers and the handle; the driver stays open
    GdsFile(const GdsFile&) = delete;
    GdsFile& operator=(const GdsFile&) = delete;

    // Registers device memory once (cuFileBufRegister). False, with `why`, when refused (a BAR1
    // aperture smaller than the buffer, say): reads into it then go unregistered, through
    // cuFile's own bounce buffers, which is slower but correct.
    bool register_buffer(void* base, size_t bytes, std::string* why);
    // cuFileRead of `n` bytes at `file_offset` into device memory at `dst` (inside a registered
    // buffer or not). Returns what cuFileRead returns, errno as it left it.
    ssize_t read(void* dst, size_t n, uint64_t file_offset);

private:
    GdsFile() = default;
    struct Region {
        char* base;
        size_t bytes;
    };
    const CuFileApi* api_ = nullptr;
    int fd_ = -1;
    void* handle_ = nullptr;
    std::vector<Region> regions_;
};

}  // namespace nt::mem
