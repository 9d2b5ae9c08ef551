// See Note [safe file access] in core/file_io.h.
#include "core/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "core/error.h"

namespace accel::file_io {

namespace {

// Attempts at a unique temporary name before giving up (a collision needs another process with
// the same pid and salt writing the same file: on a shared file system, another machine).
constexpr int kTempAttempts = 64;
// Longest part of the target name kept in a temporary's name (NAME_MAX is 255).
constexpr size_t kTempNameKeep = 160;
// remove_tree refuses to descend deeper than this (a checkpoint folder is one level deep).
constexpr int kMaxRemoveDepth = 256;

std::string errstr(int e) { return std::strerror(e); }

std::string join(const std::string& dir, const std::string& name) {
  if (dir == ".") return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// Components of a path, last first (so that the walk pops them in order); "" and "." dropped.
void push_components(const std::string& path, std::vector<std::string>& todo) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string c = path.substr(i, j - i);
    if (!c.empty() && c != ".") parts.push_back(std::move(c));
    i = j + 1;
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.push_back(std::move(*it));
}

// Note [safe file access]: a directory anyone may rewrite is not a place to create files in.
void check_dir(int fd, const std::string& shown, const std::string& path, const char* op) {
  struct stat st {};
  ACCEL_CHECK(::fstat(fd, &st) == 0, IoError, op, "cannot stat '", shown, "': ", errstr(errno));
  ACCEL_CHECK(!((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)), IoError, op, "'", shown,
              "' (on the way to '", path,
              "') is world-writable without the sticky bit: anyone could replace what lies below "
              "it, so accel creates no file there (chmod o-w or +t it, or use another folder)");
}

// Note [safe file access]: whose symbolic links are followed on the way to a directory.
void check_link(int dirfd, const struct stat& link, const std::string& shown,
                const std::string& path, const char* op) {
  struct stat dir {};
  ACCEL_CHECK(::fstat(dirfd, &dir) == 0, IoError, op, "cannot stat the folder of '", shown,
              "': ", errstr(errno));
  const uid_t me = ::geteuid();
  const bool shared = (dir.st_mode & S_IWOTH) && (dir.st_mode & S_ISVTX);  // /tmp and the like
  const bool trusted = link.st_uid == me || (shared ? link.st_uid == dir.st_uid : link.st_uid == 0);
  ACCEL_CHECK(trusted, IoError, op, "'", shown, "' (on the way to '", path,
              "') is a symbolic link that belongs to uid ", link.st_uid,
              ", neither this process's user (uid ", me, ") nor ",
              shared ? "the owner of the world-writable folder it is in" : "root",
              ": accel does not follow it to create files (resolve the link yourself if it is "
              "meant)");
}

std::string read_link(int dirfd, const std::string& name, const std::string& shown,
                      const char* op) {
  std::string buf(PATH_MAX + 1, '\0');
  const ssize_t n = ::readlinkat(dirfd, name.c_str(), buf.data(), buf.size());
  ACCEL_CHECK(n > 0 && size_t(n) < buf.size(), IoError, op, "cannot read the symbolic link '",
              shown, "': ", n < 0 ? errstr(errno) : std::string("empty or too long"));
  buf.resize(size_t(n));
  return buf;
}

std::string describe(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "a regular file of uid " + std::to_string(st.st_uid);
  return file_kind(st.st_mode);
}

void remove_tree_impl(int dirfd, const std::string& name, const std::string& shown, const char* op,
                      int depth) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    ACCEL_CHECK(errno == ENOENT, IoError, op, "cannot stat '", shown, "': ", errstr(errno));
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    ACCEL_CHECK(depth < kMaxRemoveDepth, IoError, op, "'", shown, "' is nested more than ",
                kMaxRemoveDepth, " folders deep; not removing it");
    Fd sub(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (sub) {
      for (const std::string& e : list_dir(sub.get(), shown, op))
        remove_tree_impl(sub.get(), e, shown + "/" + e, op, depth + 1);
      if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return;
      ACCEL_THROW(IoError, op, "cannot remove the folder '", shown, "': ", errstr(errno));
    }
    if (errno == ENOENT) return;
    // Replaced by a link or a file since the stat: removed below as what it is now.
    ACCEL_CHECK(errno == ELOOP || errno == ENOTDIR, IoError, op, "cannot open the folder '", shown,
                "': ", errstr(errno));
  }
  if (::unlinkat(dirfd, name.c_str(), 0) == 0 || errno == ENOENT) return;
  ACCEL_THROW(IoError, op, "cannot remove '", shown, "': ", errstr(errno));
}

uint64_t temp_salt() {
  static const uint64_t salt = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  return salt;
}

}  // namespace

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

const char* file_kind(unsigned st_mode) {
  if (S_ISREG(st_mode)) return "a regular file";
  if (S_ISDIR(st_mode)) return "a directory";
  if (S_ISLNK(st_mode)) return "a symbolic link";
  if (S_ISFIFO(st_mode)) return "a FIFO";
  if (S_ISCHR(st_mode)) return "a character device";
  if (S_ISBLK(st_mode)) return "a block device";
  if (S_ISSOCK(st_mode)) return "a socket";
  return "not a regular file";
}

std::pair<std::string, std::string> split_path(const std::string& path, const char* op) {
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  ACCEL_CHECK(!name.empty() && name != "." && name != "..", IoError, op, "'", path,
              "' does not name a file");
  return {std::move(dir), std::move(name)};
}

Fd open_dir(const std::string& path, bool create, const char* op) {
  ACCEL_CHECK(!path.empty(), IoError, op, "empty folder path");
  std::vector<std::string> todo;
  push_components(path, todo);
  std::string walked = path[0] == '/' ? "/" : ".";
  Fd cur(::open(walked.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ACCEL_CHECK(cur, IoError, op, "cannot open '", walked, "': ", errstr(errno));
  check_dir(cur.get(), walked, path, op);
  int links = 0;
  while (!todo.empty()) {
    const std::string c = std::move(todo.back());
    todo.pop_back();
    const std::string here = join(walked, c);
    constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = ::openat(cur.get(), c.c_str(), kFlags);
    if (fd < 0 && errno == ENOENT && create) {
      ACCEL_CHECK(::mkdirat(cur.get(), c.c_str(), 0755) == 0 || errno == EEXIST, IoError, op,
                  "cannot create the folder '", here, "': ", errstr(errno));
      fd = ::openat(cur.get(), c.c_str(), kFlags);
    }
    if (fd < 0 && (errno == ELOOP || errno == ENOTDIR)) {
      const int err = errno;
      struct stat st {};
      if (::fstatat(cur.get(), c.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        check_link(cur.get(), st, here, path, op);
        ACCEL_CHECK(++links <= kMaxLinks, IoError, op, "more than ", kMaxLinks,
                    " symbolic links on the way to '", path, "'");
        const std::string target = read_link(cur.get(), c, here, op);
        if (target[0] == '/') {
          walked = "/";
          cur = Fd(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
          ACCEL_CHECK(cur, IoError, op, "cannot open '/': ", errstr(errno));
          check_dir(cur.get(), walked, path, op);
        }
        push_components(target, todo);
        continue;
      }
      ACCEL_THROW(IoError, op, "'", here, "' (on the way to '", path, "') is ",
                  st.st_mode ? file_kind(st.st_mode) : errstr(err).c_str(), ", not a folder");
    }
    ACCEL_CHECK(fd >= 0, IoError, op, "cannot open the folder '", here, "': ", errstr(errno));
    cur = Fd(fd);
    walked = here;
    check_dir(cur.get(), walked, path, op);
  }
  return cur;
}

std::vector<std::string> list_dir(int dirfd, const std::string& shown, const char* op) {
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ACCEL_CHECK(fd >= 0, IoError, op, "cannot list '", shown, "': ", errstr(errno));
  DIR* d = ::fdopendir(fd);
  if (!d) {
    const int err = errno;
    ::close(fd);
    ACCEL_THROW(IoError, op, "cannot list '", shown, "': ", errstr(err));
  }
  std::vector<std::string> out;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  ACCEL_CHECK(err == 0, IoError, op, "cannot list '", shown, "': ", errstr(err));
  return out;
}

void remove_tree(int dirfd, const std::string& name, const std::string& shown, const char* op) {
  remove_tree_impl(dirfd, name, shown, op, 0);
}

void remove_tree(const std::string& path, const char* op) {
  const auto [dir, name] = split_path(path, op);
  Fd d = open_dir(dir, false, op);
  remove_tree(d.get(), name, path, op);
}

void fsync_fd(int fd, const std::string& shown, const char* op) {
  ACCEL_CHECK(::fsync(fd) == 0, IoError, op, "fsync of '", shown, "' failed: ", errstr(errno));
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

bool pread_all(int fd, void* dst, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {
      errno = 0;
      return false;
    }
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
  return true;
}

// ---- AtomicFile ----

AtomicFile::AtomicFile(const std::string& path, const char* op, bool create_dirs, unsigned mode)
    : path_(path), op_(op) {
  auto [dir, name] = split_path(path, op);
  name_ = std::move(name);
  dir_ = open_dir(dir, create_dirs, op);
  static std::atomic<uint64_t> counter{0};
  int err = 0;
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    char id[64];
    std::snprintf(id, sizeof(id), ".tmp-%ld-%06llx-%llu", long(::getpid()),
                  static_cast<unsigned long long>(temp_salt() & 0xffffff),
                  static_cast<unsigned long long>(counter++));
    tmp_.assign(1, '.');
    tmp_.append(name_, 0, kTempNameKeep);
    tmp_.append(id);
    const int fd = ::openat(dir_.get(), tmp_.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) {
      fd_ = Fd(fd);
      return;
    }
    err = errno;
    if (err != EEXIST) break;
  }
  tmp_.clear();
  ACCEL_THROW(IoError, op, "cannot create a temporary file in '", dir, "' for '", path,
              "': ", errstr(err));
}

AtomicFile::~AtomicFile() {
  fd_.reset();
  if (!committed_ && !tmp_.empty() && dir_) ::unlinkat(dir_.get(), tmp_.c_str(), 0);
}

void AtomicFile::fail(const std::string& what, int err) {
  fd_.reset();
  if (!tmp_.empty() && dir_) ::unlinkat(dir_.get(), tmp_.c_str(), 0);
  tmp_.clear();
  ACCEL_THROW(IoError, op_.c_str(), "'", path_, "': ", what, ": ", errstr(err));
}

void AtomicFile::write(const void* data, size_t n) {
  ACCEL_CHECK(fd_ && !committed_, IoError, op_.c_str(), "'", path_, "': the file is closed");
  if (!write_all(fd_.get(), data, n)) fail("write failed", errno);
}

void AtomicFile::commit(bool durable) {
  ACCEL_CHECK(fd_ && !committed_, IoError, op_.c_str(), "'", path_, "': the file is closed");
  if (durable && ::fsync(fd_.get()) != 0) fail("fsync failed", errno);
  if (::close(fd_.release()) != 0) fail("close failed", errno);
  if (::renameat(dir_.get(), tmp_.c_str(), dir_.get(), name_.c_str()) != 0)
    fail("cannot rename the temporary file over it", errno);
  committed_ = true;
  if (durable) fsync_fd(dir_.get(), split_path(path_, op_.c_str()).first, op_.c_str());
}

void write_file_atomic(const std::string& path, std::string_view data, const char* op, bool durable,
                       bool create_dirs) {
  AtomicFile f(path, op, create_dirs);
  f.write(data);
  f.commit(durable);
}

// ---- files written in place ----

Fd create_file(const std::string& path, const char* op, CreateMode how, bool create_dirs,
               unsigned mode) {
  const auto [dir, name] = split_path(path, op);
  Fd d = open_dir(dir, create_dirs, op);
  const uid_t me = ::geteuid();
  struct stat st {};
  const bool exists = ::fstatat(d.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (exists) {
    ACCEL_CHECK(S_ISREG(st.st_mode) && st.st_uid == me, IoError, op, "'", path,
                "' already exists and is ", describe(st), ": accel ",
                how == CreateMode::kAppend ? "appends to" : "replaces",
                " only a regular file of its own user (uid ", me,
                ") there; remove it or use another folder");
  }
  if (how == CreateMode::kAppend) {
    Fd f(::openat(d.get(), name.c_str(),
                  O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                  mode));
    ACCEL_CHECK(f, IoError, op, "cannot open '", path, "' to append: ", errstr(errno));
    // Checked again on what was opened: the entry may have changed since the stat.
    ACCEL_CHECK(::fstat(f.get(), &st) == 0, IoError, op, "cannot stat '", path,
                "': ", errstr(errno));
    ACCEL_CHECK(S_ISREG(st.st_mode) && st.st_uid == me && st.st_nlink == 1, IoError, op, "'", path,
                "' is ", describe(st), st.st_nlink > 1 ? " with several hard links" : "",
                ": accel appends only to a regular file of its own user (uid ", me,
                ") with one name; remove it or use another folder");
    const int fl = ::fcntl(f.get(), F_GETFL);
    ACCEL_CHECK(fl >= 0 && ::fcntl(f.get(), F_SETFL, fl & ~O_NONBLOCK) == 0, IoError, op,
                "cannot set up '", path, "': ", errstr(errno));
    return f;
  }
  if (exists) {
    ACCEL_CHECK(::unlinkat(d.get(), name.c_str(), 0) == 0 || errno == ENOENT, IoError, op,
                "cannot replace '", path, "': ", errstr(errno));
  }
  Fd f(::openat(d.get(), name.c_str(),
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, mode));
  ACCEL_CHECK(f, IoError, op, "cannot create '", path, "': ", errstr(errno),
              errno == EEXIST ? " (it was created again while accel replaced it)" : "");
  return f;
}

// ---- reading ----

ReadableFile open_read(const std::string& path, const char* op, uint64_t max_bytes, Links links) {
  const int flags =
      O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (links == Links::kRefuse ? O_NOFOLLOW : 0);
  ReadableFile out;
  out.fd = Fd(::open(path.c_str(), flags));
  if (!out.fd) {
    const int err = errno;
    struct stat st {};
    const bool link = links == Links::kRefuse && err == ELOOP && ::lstat(path.c_str(), &st) == 0 &&
                      S_ISLNK(st.st_mode);
    ACCEL_CHECK(!link, IoError, op, "'", path,
                "' is a symbolic link: accel writes this file itself and never as a link, so it "
                "does not follow one there");
    ACCEL_THROW(IoError, op, "cannot open '", path, "': ", errstr(err));
  }
  struct stat st {};
  ACCEL_CHECK(::fstat(out.fd.get(), &st) == 0, IoError, op, "cannot stat '", path,
              "': ", errstr(errno));
  ACCEL_CHECK(S_ISREG(st.st_mode), IoError, op, "'", path, "' is ", file_kind(st.st_mode),
              ", not a regular file");
  out.size = uint64_t(st.st_size);
  ACCEL_CHECK(out.size <= max_bytes, IoError, op, "'", path, "' is ", out.size,
              " bytes, more than the ", max_bytes, " bytes this kind of file may hold");
  // Regular files ignore O_NONBLOCK; cleared all the same, so the descriptor reads as usual.
  const int fl = ::fcntl(out.fd.get(), F_GETFL);
  if (fl >= 0) ::fcntl(out.fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  return out;
}

std::string read_file(const std::string& path, const char* op, uint64_t max_bytes, Links links) {
  ReadableFile f = open_read(path, op, max_bytes, links);
  std::string out(size_t(f.size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(f.fd.get(), out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    ACCEL_CHECK(r >= 0, IoError, op, "error reading '", path, "': ", errstr(errno));
    if (r == 0) break;
    got += size_t(r);
  }
  ACCEL_CHECK(got == out.size(), IoError, op, "'", path, "' shrank while it was read: ", f.size,
              " bytes expected, ", got, " read");
  return out;
}

}  // namespace accel::file_io
