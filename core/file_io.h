// How the library and accel-run create, replace and read files, so that an entry planted in the
// file system cannot redirect a write, hang a read or exhaust memory. Std-only (POSIX): accel-run
// (launcher/) compiles file_io.cc into its own library too (docs/layers.md).
//
// Note [safe file access]
// Writes. A file accel writes is always created new and never opened through a link:
//   * a file that replaces another (checkpoint files, `latest`, safetensors, error.json, config
//     files, token files) is written to a temporary with a unique name, created
//     O_CREAT|O_EXCL|O_NOFOLLOW inside the opened target directory, then renamed over the target
//     with renameat() relative to that directory (AtomicFile). A link planted at a fixed temporary
//     name (`latest.tmp`) is never opened, and a link at the target name is replaced, not
//     followed;
//   * a file written in place (logs) is created exclusively after an old regular file of ours is
//     removed; a link, FIFO, device or another user's file there is an IoError (create_file).
//     Appending (metrics.jsonl) opens O_APPEND|O_NOFOLLOW and checks that what it opened is a
//     regular file of ours with one name (no hard link into another file).
// Directories. The directory a file is created in is opened one component at a time (openat with
// O_NOFOLLOW from / or the working directory), and missing components are created with mkdirat
// when asked (open_dir). On the way:
//   * a directory that is world-writable without the sticky bit is refused: anyone could replace
//     what lies below it;
//   * a symbolic link is followed only when it belongs to us or to root, and inside a
//     world-writable sticky directory such as /tmp only when it belongs to us or to the owner of
//     that directory (the kernel's fs.protected_symlinks rule): a link another user planted on a
//     shared file system is refused, whoever runs the job;
//   * at most kMaxLinks links are followed.
// Removal (remove_tree) works relative to opened directories and never follows a link (a link is
// removed itself), so swapping a directory for a link while it is deleted deletes only the link.
// Reads (open_read, read_file). Files are opened O_RDONLY|O_NONBLOCK (opening a FIFO does not
// block), fstat'ed, and must be regular files no larger than the caller's cap for that kind of
// file: a FIFO, a device such as /dev/zero, a socket or a directory is an IoError before a byte is
// read. Links are followed where a link to a regular file is legitimate (data sets; safetensors
// files in a Hugging Face cache are links into blobs/) and refused (O_NOFOLLOW) where accel wrote
// the file itself and a link can only be tampering (checkpoint metadata, worker error files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace accel::file_io {

// Symbolic links followed while opening one directory path (Linux's own limit is 40).
inline constexpr int kMaxLinks = 40;
// No cap on the size of a file that is read (the caller bounds what it allocates otherwise).
inline constexpr uint64_t kNoSizeCap = ~uint64_t(0);

// Owns a file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// "<dir>", "<name>" of a path to a file: dir "." for a bare name. IoError (naming op) when the
// name is empty, "." or ".." (a path ending in '/').
std::pair<std::string, std::string> split_path(const std::string& path, const char* op);

// ---- directories ----

// Opens the directory `path` as Note [safe file access] says, creating missing components
// (mode 0755, less the umask) when `create`. IoError naming op, the path and what is wrong.
Fd open_dir(const std::string& path, bool create, const char* op);

// Entries of an opened directory ("." and ".." left out), unsorted.
std::vector<std::string> list_dir(int dirfd, const std::string& shown, const char* op);

// Removes `name` in the directory dirfd and everything under it; never follows a link. Absent is
// fine. IoError naming `shown` on failure.
void remove_tree(int dirfd, const std::string& name, const std::string& shown, const char* op);
// The same for a path: its parent is opened with open_dir.
void remove_tree(const std::string& path, const char* op);

// fsync of an opened file or directory; IoError naming `shown`.
void fsync_fd(int fd, const std::string& shown, const char* op);

// ---- writing ----

// A file that replaces `path` atomically (Note [safe file access]). The temporary is created in
// the constructor; write() appends to it; commit() flushes it (fsync when durable), renames it
// over `path` and fsyncs the directory (when durable). Destroyed without commit(), it removes the
// temporary and leaves `path` untouched. Write errors are IoErrors naming `path` and op.
class AtomicFile {
 public:
  // The directory must exist unless create_dirs.
  AtomicFile(const std::string& path, const char* op, bool create_dirs = false,
             unsigned mode = 0644);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit(bool durable = true);
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_, op_, name_, tmp_;
  Fd dir_, fd_;
  bool committed_ = false;
};

// write + commit of an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view data, const char* op,
                       bool durable = true, bool create_dirs = false);

enum class CreateMode { kReplace, kAppend };
// A file written in place (logs), opened for writing (Note [safe file access]): kReplace removes
// an old regular file of ours at `path` and creates the file exclusively; kAppend appends to one
// (creating it when missing). IoError for a link, FIFO, device, another user's file or a file
// with several hard links there.
Fd create_file(const std::string& path, const char* op, CreateMode how, bool create_dirs = false,
               unsigned mode = 0644);

// Writes all n bytes (retrying short writes and EINTR); false with errno set on error.
bool write_all(int fd, const void* data, size_t n);

// ---- reading ----

enum class Links { kFollow, kRefuse };

struct ReadableFile {
  Fd fd;
  uint64_t size = 0;
};

// Opens a regular file of at most max_bytes for reading, without blocking on a FIFO
// (Note [safe file access]). IoError naming op and the file otherwise: missing, a link (with
// kRefuse), not a regular file (saying what it is), larger than the cap.
ReadableFile open_read(const std::string& path, const char* op, uint64_t max_bytes = kNoSizeCap,
                       Links links = Links::kFollow);

// The whole file, at most max_bytes (open_read, then exactly its size: a file that shrinks while
// it is read is an IoError).
std::string read_file(const std::string& path, const char* op, uint64_t max_bytes,
                      Links links = Links::kFollow);

// Reads exactly n bytes at offset; false at end of file (errno 0) or on error (errno set).
bool pread_all(int fd, void* dst, size_t n, uint64_t offset);

// "a FIFO", "a character device", "a directory", ... for st_mode; for messages.
const char* file_kind(unsigned st_mode);

}  // namespace accel::file_io
