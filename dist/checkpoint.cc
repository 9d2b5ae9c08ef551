// See Note [atomic checkpoints] in dist/checkpoint.h.
#include "dist/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
  ACCEL_CHECK(fd >= 0, IoError, "checkpoint", "cannot open '", path, "' to fsync: ", std::strerror(errno));
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

void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& final_dir) {
  fsync_path(tmp_dir);
  std::error_code ec;
  std::string old;
  if (fs::exists(final_dir)) {
    // rename() cannot replace a non-empty directory: move the old one aside first.
    old = checkpoint_tmp_dir(final_dir) + ".old";
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    ACCEL_CHECK(!ec, IoError, "save_state", "cannot move old '", final_dir, "' aside: ", ec.message());
  }
  fs::rename(tmp_dir, final_dir, ec);
  ACCEL_CHECK(!ec, IoError, "save_state", "rename '", tmp_dir, "' -> '", final_dir, "' failed: ",
              ec.message());
  fsync_path(parent_of(fs::path(final_dir).lexically_normal().string()));
  if (!old.empty()) fs::remove_all(old, ec);
}

void write_latest(const std::string& parent, const std::string& name) {
  write_file_durable((fs::path(parent) / kLatestFile).string(), name + "\n");
}

std::optional<std::string> read_latest(const std::string& parent) {
  fs::path p = fs::path(parent) / kLatestFile;
  if (!fs::exists(p)) return std::nullopt;
  std::string s = read_file(p.string());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  ACCEL_CHECK(!s.empty() && s.find('/') == std::string::npos, IoError, "load_state", "'",
              p.string(), "' does not name a checkpoint directory: '", s, "'");
  return s;
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  if (fs::exists(fs::path(dir) / kCheckpointStateFile)) return dir;
  if (auto name = read_latest(dir)) {
    std::string target = (fs::path(dir) / *name).string();
    ACCEL_CHECK(fs::exists(fs::path(target) / kCheckpointStateFile), IoError, "load_state", "'",
                dir, "/latest' names '", *name, "', which is not a complete checkpoint (no ",
                kCheckpointStateFile, ")");
    return target;
  }
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
    ACCEL_CHECK(!ec, IoError, "save_state", "cannot delete old checkpoint '", dir, "': ", ec.message());
    --excess;
  }
}

}  // namespace accel::dist
