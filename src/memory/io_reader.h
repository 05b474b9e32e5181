// Reads file ranges into (pinned) memory with several requests in flight: a small pool of
// threads issuing pread on an O_DIRECT descriptor, so the NVMe controller DMAs straight into
// the destination and the page cache is left alone. Where the file system refuses O_DIRECT
// (tmpfs, some network and overlay file systems) it falls back to buffered reads and says so.
// Short reads, I/O errors and a file that changes underneath end in one clear nt::Error,
// never in garbage handed on. With GPUDirect Storage the same threads read into device memory
// through cuFile (submit_device).
#pragma once
#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "memory/cufile.h"
#include "memory/layer_blob.h"

namespace nt::mem {

struct ReaderOptions {
    int threads = 8;                          // requests in flight
    size_t chunk_bytes = size_t(8) << 20;     // one pread (a multiple of 4 KiB)
    bool direct = true;                       // try O_DIRECT
    // Tests: replaces open(2) (a file system that refuses O_DIRECT).
    std::function<int(const char* path, int flags)> open_for_testing;
    // cuFile functions for submit_device (null: host reads only). Where cuFile cannot read the
    // file, gds() is false and gds_reason() says why.
    const CuFileApi* gds = nullptr;
    // Runs first on each reader thread (the streamer binds its GPU there for cuFile).
    std::function<void()> thread_init;
};

// One pread as it happened (stats and traces), on the mem::now_seconds() clock.
struct ReadRecord {
    int thread = 0;
    double t0 = 0, t1 = 0;
    uint64_t offset = 0, bytes = 0;
    bool device = false;  // a cuFile read into device memory
};

class FileReader {
public:
    using Ticket = uint64_t;
    // Opens `path`; throws nt::Error naming the file when it cannot be opened.
    FileReader(const std::string& path, const ReaderOptions& opt = {});
    ~FileReader();  // waits for the reads in flight (they write into the caller's memory)
    FileReader(const FileReader&) = delete;
    FileReader& operator=(const FileReader&) = delete;

    const std::string& path() const { return path_; }
    uint64_t size() const { return size_; }
    bool direct() const;                 // O_DIRECT in use (false after a fallback)
    std::string fallback_reason() const;  // why O_DIRECT is not in use; empty when it is
    int threads() const { return int(workers_.size()); }
    bool gds() const { return gds_ != nullptr; }                 // submit_device available
    const std::string& gds_reason() const { return gds_reason_; }  // why not, when it was asked for

    // Reads each extent to dst + blob_offset. With O_DIRECT, dst must be 4 KiB-aligned. Bytes
    // of an extent past the end of the file (its 4 KiB-rounded tail) read as zeros.
    Ticket submit(const std::vector<FileExtent>& extents, void* dst);
    // The same into device memory with cuFile (gds() must be true). A read cuFile cannot do ends
    // in GdsReadError from wait() (read it again with submit); disk errors are submit's.
    Ticket submit_device(const std::vector<FileExtent>& extents, void* dst);
    // Registers device memory for cuFile's DMA once, before reads into it; false, with `why`,
    // when refused (reads into it still work, through cuFile's bounce buffers).
    bool gds_register(void* base, size_t bytes, std::string* why);
    bool done(Ticket t);  // finished (successfully or not); wait() tells which
    // Blocks until the ticket's reads are done; throws nt::Error describing the first failure.
    void wait(Ticket t);

    // Tests: replaces pread (fault injection: short reads, EIO).
    using PreadFn = std::function<ssize_t(int fd, void* buf, size_t n, off_t off)>;
    void set_pread_for_testing(PreadFn fn);

    void set_recording(bool on);
    std::vector<ReadRecord> take_records();

private:
    struct Chunk {
        Ticket ticket = 0;
        uint64_t offset = 0, length = 0;
        uint8_t* dst = nullptr;
        bool device = false;
    };
    struct State {
        int pending = 0;
        std::string error;
        bool gds_failed = false;  // the error is a GdsReadError
    };
    Ticket enqueue(const std::vector<FileExtent>& extents, void* dst, bool device);
    void worker(int index);
    void read_chunk(const Chunk& c, int index);  // throws nt::Error
    void read_device_chunk(const Chunk& c);      // throws nt::Error or GdsReadError
    void check_unchanged();                      // throws nt::Error

    std::string path_;
    ReaderOptions opt_;
    int fd_direct_ = -1, fd_buffered_ = -1;
    uint64_t size_ = 0;
    int64_t mtime_ns_ = 0;
    uint64_t inode_ = 0;
    std::string fallback_;  // guarded by mu_
    std::unique_ptr<GdsFile> gds_;
    std::string gds_reason_;

    mutable std::mutex mu_;
    std::condition_variable work_cv_, done_cv_;
    std::deque<Chunk> queue_;
    std::map<Ticket, State> tickets_;
    Ticket next_ticket_ = 1;
    bool stop_ = false;
    bool recording_ = false;
    std::vector<ReadRecord> records_;
    PreadFn pread_;
    std::vector<std::thread> workers_;
};

// Name of the file system type holding `path` ("ext4", "xfs", "tmpfs", ...; "unknown").
std::string filesystem_name(const std::string& path);

}  // namespace nt::mem
