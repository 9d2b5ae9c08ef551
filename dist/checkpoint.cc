// See Note [atomic checkpoints] in dist/checkpoint.h.
#include "core/env_contract.h"
#include "dist/checkpoint.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace accel::dist {

namespace fs = std::filesystem;

namespace {
CheckpointHook g_hook;

std::string parent_of(const std::string& p) {
  fs::path parent = fs::path(p).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}
}  // namespace

void set_checkpoint_hook(CheckpointHook hook) { g_hook = std::move(hook); }
void run_checkpoint_hook(const std::string& stage) {
  if (g_hook) g_hook(stage);
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ACCEL_CHECK(fd >= 0, IoError, "checkpoint", "cannot open '", path,
              "' to fsync: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  ACCEL_CHECK(rc == 0, IoError, "checkpoint", "fsync of '", path, "' failed: ", std::strerror(err));
}

void write_file_durable(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ACCEL_CHECK(fd >= 0, IoError, "checkpoint", "cannot create '", tmp, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ACCEL_THROW(IoError, "checkpoint", "write to '", tmp, "' failed: ", std::strerror(err));
    }
    done += size_t(n);
  }
  int rc = ::fsync(fd);
  ::close(fd);
  ACCEL_CHECK(rc == 0, IoError, "checkpoint", "fsync of '", tmp, "' failed");
  ACCEL_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, IoError, "checkpoint", "rename '", tmp,
              "' -> '", path, "' failed: ", std::strerror(errno));
  fsync_path(parent_of(path));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ACCEL_CHECK(f.good(), IoError, "checkpoint", "cannot read '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string checkpoint_tmp_dir(const std::string& final_dir) {
  fs::path p(final_dir);
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();
  return (fs::path(parent_of(fs::path(final_dir).lexically_normal().string())) / (".tmp-" + name))
      .string();
}

void begin_checkpoint_dir(const std::string& tmp_dir) {
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  ACCEL_CHECK(!ec, IoError, "save_state", "cannot create '", tmp_dir, "': ", ec.message());
}

namespace {
// renameat2(RENAME_EXCHANGE): swaps two paths atomically (Linux 3.15; ext4, xfs, btrfs, tmpfs,
// ...). False with errno set where the kernel or filesystem cannot (EINVAL, ENOSYS, ENOTSUP).
bool exchange_paths(const std::string& a, const std::string& b) {
#if defined(SYS_renameat2)
  constexpr unsigned kRenameExchange = 1u << 1;  // RENAME_EXCHANGE in <linux/fs.h>
  return ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange) == 0;
#else
  errno = ENOSYS;
  return false;
#endif
}

// Env ACCEL_CHECKPOINT_NO_EXCHANGE=1 (test-only) takes the fallback path below.
bool no_exchange_for_tests() {
  const char* v = std::getenv(env::kCheckpointNoExchange);
  return v && *v && std::string(v) != "0";
}

bool has_state(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kCheckpointStateFile, ec);
}
}  // namespace

std::string checkpoint_aside_dir(const std::string& final_dir) {
  return checkpoint_tmp_dir(final_dir) + ".old";
}

void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& final_dir) {
  fsync_path(tmp_dir);
  const std::string parent = parent_of(fs::path(final_dir).lexically_normal().string());
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    fs::rename(tmp_dir, final_dir, ec);
    ACCEL_CHECK(!ec, IoError, "save_state", "rename '", tmp_dir, "' -> '", final_dir,
                "' failed: ", ec.message());
    fsync_path(parent);
    run_checkpoint_hook("commit_swap");
  } else if (!no_exchange_for_tests() && exchange_paths(tmp_dir, final_dir)) {
    // final_dir is the new checkpoint and tmp_dir the old one, in one step: there is no instant
    // at which final_dir is missing or partial.
    fsync_path(parent);
    run_checkpoint_hook("commit_swap");
    fs::remove_all(tmp_dir, ec);
  } else {
    // No atomic exchange here: move the old checkpoint aside, then the new one in. Between the
    // two renames final_dir is missing; resolve_checkpoint_dir() then loads the aside copy,
    // which is complete (Note [atomic checkpoints]).
    const std::string old = checkpoint_aside_dir(final_dir);
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    ACCEL_CHECK(!ec, IoError, "save_state", "cannot move old '", final_dir,
                "' aside: ", ec.message());
    fsync_path(parent);
    run_checkpoint_hook("commit_swap");
    fs::rename(tmp_dir, final_dir, ec);
    ACCEL_CHECK(!ec, IoError, "save_state", "rename '", tmp_dir, "' -> '", final_dir,
                "' failed: ", ec.message());
    fsync_path(parent);
  }
  // A previous save killed between the fallback's renames leaves an aside copy behind.
  fs::remove_all(checkpoint_aside_dir(final_dir), ec);
}

void write_latest(const std::string& parent, const std::string& name) {
  write_file_durable((fs::path(parent) / kLatestFile).string(), name + "\n");
}

std::optional<std::string> read_latest(const std::string& parent) {
  fs::path p = fs::path(parent) / kLatestFile;
  if (!fs::exists(p)) return std::nullopt;
  std::string s = read_file(p.string());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  // It must name a directory inside `parent`: not absolute, no separators, not . or ..
  const bool plain = !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
                     s.find('\\') == std::string::npos && s.find('\0') == std::string::npos &&
                     s.find('\n') == std::string::npos;
  ACCEL_CHECK(plain, IoError, "load_state", "'", p.string(),
              "' must name a checkpoint directory inside '", parent, "', not '", s, "'");
  return s;
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  if (has_state(dir)) return dir;
  if (auto name = read_latest(dir)) {
    std::string target = (fs::path(dir) / *name).string();
    if (has_state(target)) return target;
    // A save killed between the fallback renames of commit_checkpoint_dir().
    if (has_state(checkpoint_aside_dir(target))) return checkpoint_aside_dir(target);
    ACCEL_THROW(IoError, "load_state", "'", dir, "/latest' names '", *name,
                "', which is not a complete checkpoint (no ", kCheckpointStateFile, ")");
  }
  if (has_state(checkpoint_aside_dir(dir))) return checkpoint_aside_dir(dir);
  ACCEL_THROW(IoError, "load_state", "'", dir, "' is not a checkpoint: it has neither ",
              kCheckpointStateFile, " nor a '", kLatestFile, "' pointer");
}

std::vector<std::string> list_checkpoints(const std::string& parent) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return {};
  const std::string prefix = kCheckpointPrefix;
  for (auto& e : fs::directory_iterator(parent, ec)) {
    if (!e.is_directory()) continue;
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    std::string digits = name.substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    found.emplace_back(std::stoll(digits), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

void rotate_checkpoints(const std::string& parent, int total_limit, const std::string& keep) {
  if (total_limit <= 0) return;
  auto all = list_checkpoints(parent);
  const std::string keep_norm = fs::path(keep).lexically_normal().string();
  int64_t excess = int64_t(all.size()) - total_limit;
  for (const std::string& dir : all) {
    if (excess <= 0) break;
    if (fs::path(dir).lexically_normal().string() == keep_norm) continue;
    std::error_code ec;
    fs::remove_all(dir, ec);
    ACCEL_CHECK(!ec, IoError, "save_state", "cannot delete old checkpoint '", dir,
                "': ", ec.message());
    --excess;
  }
}

}  // namespace accel::dist
