#include "memory/io_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "memory/clock.h"

namespace nt::mem {

namespace {

int64_t mtime_ns(const struct stat& st) {
    return int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec);
}

}  // namespace

std::string filesystem_name(const std::string& path) {
    struct statfs s {};
    if (statfs(path.c_str(), &s) != 0) return "unknown";
    switch (static_cast<unsigned long>(s.f_type)) {
        case 0xEF53: return "ext4";
        case 0x58465342: return "xfs";
        case 0x01021994: return "tmpfs";
        case 0x9123683E: return "btrfs";
        case 0x6969: return "nfs";
        case 0x794C7630: return "overlayfs";
        case 0xF2F52010: return "f2fs";
        case 0x2FC12FC1: return "zfs";
        case 0x65735546: return "fuse";
        case 0x5346544E: return "ntfs";
        case 0x4D44: return "vfat";
        default: return strfmt("unknown (0x%lx)", static_cast<unsigned long>(s.f_type));
    }
}

FileReader::FileReader(const std::string& path, const ReaderOptions& opt) : path_(path), opt_(opt) {
    if (opt_.threads < 1) opt_.threads = 1;
    opt_.chunk_bytes = std::max<size_t>(kBlobAlign, align_up(opt_.chunk_bytes, kBlobAlign));
    pread_ = [](int fd, void* buf, size_t n, off_t off) { return ::pread(fd, buf, n, off); };
    auto open_fn = opt_.open_for_testing ? opt_.open_for_testing
                                         : [](const char* p, int flags) { return ::open(p, flags); };
    fd_buffered_ = open_fn(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_buffered_ < 0) fail("cannot open '%s': %s.", path.c_str(), std::strerror(errno));
    struct stat st {};
    if (fstat(fd_buffered_, &st) != 0) {
        const int e = errno;
        ::close(fd_buffered_);
        fail("cannot stat '%s': %s.", path.c_str(), std::strerror(e));
    }
    size_ = uint64_t(st.st_size);
    mtime_ns_ = mtime_ns(st);
    inode_ = uint64_t(st.st_ino);

    if (opt_.direct) {
        fd_direct_ = open_fn(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd_direct_ < 0) {
            fallback_ = strfmt(
                "the %s file system holding '%s' refuses O_DIRECT (%s); reading through the page "
                "cache instead (put the model on an ext4 or xfs NVMe file system for direct reads)",
                filesystem_name(path).c_str(), path.c_str(), std::strerror(errno));
        } else if (size_ >= kBlobAlign) {
            // Some file systems accept the flag but fail the reads: probe one block.
            void* probe = std::aligned_alloc(kBlobAlign, kBlobAlign);
            const ssize_t n = probe ? ::pread(fd_direct_, probe, kBlobAlign, 0) : -1;
            const int e = errno;
            std::free(probe);
            if (n < 0) {
                ::close(fd_direct_);
                fd_direct_ = -1;
                fallback_ = strfmt(
                    "O_DIRECT reads of '%s' (%s) fail (%s); reading through the page cache "
                    "instead",
                    path.c_str(), filesystem_name(path).c_str(), std::strerror(e));
            }
        }
    } else {
        fallback_ = "direct reads were not requested";
    }
    if (opt_.gds) gds_ = GdsFile::open(path, opt_.gds, &gds_reason_);
    for (int i = 0; i < opt_.threads; i++) workers_.emplace_back([this, i] { worker(i); });
}

FileReader::~FileReader() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const Chunk& c : queue_) {
            State& s = tickets_[c.ticket];
            if (s.error.empty()) s.error = "the read was cancelled";
            s.pending--;
        }
        queue_.clear();
        stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    if (fd_direct_ >= 0) ::close(fd_direct_);
    if (fd_buffered_ >= 0) ::close(fd_buffered_);
}

bool FileReader::direct() const {
    std::lock_guard<std::mutex> lk(mu_);
    return fd_direct_ >= 0;
}

std::string FileReader::fallback_reason() const {
    std::lock_guard<std::mutex> lk(mu_);
    return fd_direct_ >= 0 ? std::string() : fallback_;
}

void FileReader::set_pread_for_testing(PreadFn fn) {
    std::lock_guard<std::mutex> lk(mu_);
    pread_ = std::move(fn);
}

void FileReader::set_recording(bool on) {
    std::lock_guard<std::mutex> lk(mu_);
    recording_ = on;
}

std::vector<ReadRecord> FileReader::take_records() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<ReadRecord> r;
    r.swap(records_);
    return r;
}

FileReader::Ticket FileReader::submit(const std::vector<FileExtent>& extents, void* dst) {
    return enqueue(extents, dst, false);
}

FileReader::Ticket FileReader::submit_device(const std::vector<FileExtent>& extents, void* dst) {
    if (!gds_) fail("file reader: cuFile reads of '%s' were not set up.", path_.c_str());
    return enqueue(extents, dst, true);
}

bool FileReader::gds_register(void* base, size_t bytes, std::string* why) {
    if (!gds_) fail("file reader: cuFile reads of '%s' were not set up.", path_.c_str());
    return gds_->register_buffer(base, bytes, why);
}

FileReader::Ticket FileReader::enqueue(const std::vector<FileExtent>& extents, void* dst, bool device) {
    std::vector<Chunk> chunks;
    for (const FileExtent& e : extents)
        for (uint64_t off = 0; off < e.length; off += opt_.chunk_bytes)
            chunks.push_back({0, e.file_offset + off, std::min<uint64_t>(opt_.chunk_bytes, e.length - off),
                              static_cast<uint8_t*>(dst) + e.blob_offset + off, device});
    Ticket t;
    {
        std::lock_guard<std::mutex> lk(mu_);
        t = next_ticket_++;
        State& s = tickets_[t];
        s.pending = int(chunks.size());
        for (Chunk& c : chunks) {
            c.ticket = t;
            queue_.push_back(c);
        }
    }
    work_cv_.notify_all();
    return t;
}

bool FileReader::done(Ticket t) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = tickets_.find(t);
    return it == tickets_.end() || it->second.pending == 0;
}

void FileReader::wait(Ticket t) {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = tickets_.find(t);
    if (it == tickets_.end()) fail("file reader: unknown or already collected read %llu.", (unsigned long long)t);
    done_cv_.wait(lk, [&] { return it->second.pending == 0; });
    const std::string err = it->second.error;
    const bool gds_failed = it->second.gds_failed;
    tickets_.erase(it);
    if (gds_failed) throw GdsReadError(err);
    if (!err.empty()) throw Error(err);
}

void FileReader::worker(int index) {
    if (opt_.thread_init) opt_.thread_init();
    for (;;) {
        Chunk c;
        {
            std::unique_lock<std::mutex> lk(mu_);
            work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping
            c = queue_.front();
            queue_.pop_front();
        }
        std::string err;
        bool gds_failed = false;
        const double t0 = now_seconds();
        try {
            if (c.device) read_device_chunk(c);
            else read_chunk(c, index);
        } catch (const GdsReadError& e) {
            err = e.what();
            gds_failed = true;
        } catch (const Error& e) {
            err = e.what();
        }
        const double t1 = now_seconds();
        bool last = false;
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (recording_) records_.push_back({index, t0, t1, c.offset, c.length, c.device});
            State& s = tickets_[c.ticket];
            if (!err.empty() && s.error.empty()) {
                s.error = err;
                s.gds_failed = gds_failed;
            }
            last = s.pending == 1 && s.error.empty();
            if (!last) s.pending--;
        }
        if (last) {
            // Data read while the file was being rewritten would be garbage: a finished read
            // counts only if the file is still the one that was opened.
            try {
                check_unchanged();
            } catch (const Error& e) {
                err = e.what();
            }
            std::lock_guard<std::mutex> lk(mu_);
            State& s = tickets_[c.ticket];
            if (!err.empty() && s.error.empty()) s.error = err;
            s.pending--;
        }
        done_cv_.notify_all();
    }
}

void FileReader::read_chunk(const Chunk& c, int /*index*/) {
    PreadFn rd;
    {
        std::lock_guard<std::mutex> lk(mu_);
        rd = pread_;
    }
    uint64_t got = 0;
    while (got < c.length) {
        const uint64_t off = c.offset + got;
        if (off >= size_) {  // the aligned tail past the end of the file
            std::memset(c.dst + got, 0, c.length - got);
            return;
        }
        int fd;
        bool use_direct;
        {
            std::lock_guard<std::mutex> lk(mu_);
            // After a short read the rest may be unaligned: O_DIRECT would refuse it.
            use_direct = fd_direct_ >= 0 && off % kBlobAlign == 0 && (c.length - got) % kBlobAlign == 0 &&
                         reinterpret_cast<uintptr_t>(c.dst + got) % kBlobAlign == 0;
            fd = use_direct ? fd_direct_ : fd_buffered_;
        }
        errno = 0;
        const ssize_t n = rd(fd, c.dst + got, size_t(c.length - got), off_t(off));
        if (n < 0) {
            const int e = errno;
            if (e == EINTR) continue;
            if (e == EINVAL && use_direct) {
                std::lock_guard<std::mutex> lk(mu_);
                if (fd_direct_ >= 0) {
                    fallback_ = strfmt(
                        "O_DIRECT reads of '%s' (%s) fail with EINVAL at offset %llu; reading "
                        "through the page cache instead",
                        path_.c_str(), filesystem_name(path_).c_str(), (unsigned long long)off);
                    ::close(fd_direct_);
                    fd_direct_ = -1;
                }
                continue;
            }
            fail("reading '%s' failed at offset %llu: %s; check the disk (dmesg) or move the model "
                 "to a healthy drive.",
                 path_.c_str(), (unsigned long long)off, std::strerror(e ? e : EIO));
        }
        if (n == 0)
            fail("'%s' ended at byte %llu but %llu bytes were expected: it was truncated or replaced "
                 "while in use; restart to load it again.",
                 path_.c_str(), (unsigned long long)off, (unsigned long long)size_);
        got += uint64_t(n);
    }
}

void FileReader::read_device_chunk(const Chunk& c) {
    uint64_t got = 0;
    while (got < c.length) {
        const uint64_t off = c.offset + got;
        // The aligned tail past the end of the file holds no tensor's bytes: left as it is.
        if (off >= size_) return;
        const size_t want = size_t(std::min<uint64_t>(c.length - got, size_ - off));
        errno = 0;
        const ssize_t n = gds_->read(c.dst + got, want, off);
        if (n < 0) {
            const int e = errno;
            switch (classify_gds_read_failure(n, e)) {
                case GdsReadFailure::Retry: continue;
                case GdsReadFailure::DiskError:
                    fail("reading '%s' failed at offset %llu: %s; check the disk (dmesg) or move the model "
                         "to a healthy drive.",
                         path_.c_str(), (unsigned long long)off, std::strerror(e));
                case GdsReadFailure::FallBack:
                    throw GdsReadError(strfmt(
                        "a GPUDirect Storage read of '%s' failed at offset %llu (%s); disk-tier layers are "
                        "read with O_DIRECT into pinned staging from now on",
                        path_.c_str(), (unsigned long long)off, describe_gds_read_failure(n, e).c_str()));
            }
        }
        if (n == 0)
            fail("'%s' ended at byte %llu but %llu bytes were expected: it was truncated or replaced "
                 "while in use; restart to load it again.",
                 path_.c_str(), (unsigned long long)off, (unsigned long long)size_);
        got += uint64_t(n);
    }
}

void FileReader::check_unchanged() {
    struct stat st {};
    if (fstat(fd_buffered_, &st) != 0) fail("cannot stat '%s': %s.", path_.c_str(), std::strerror(errno));
    if (uint64_t(st.st_size) != size_ || mtime_ns(st) != mtime_ns_ || uint64_t(st.st_ino) != inode_)
        fail("'%s' changed while it was being read (size %llu -> %llu bytes or a new modification "
             "time); the data read may be mixed, restart to load it again.",
             path_.c_str(), (unsigned long long)size_, (unsigned long long)st.st_size);
}

}  // namespace nt::mem
