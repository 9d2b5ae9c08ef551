// See Note [atomic checkpoints] in accelerate/checkpoint.h.
#include "core/env_contract.h"
#include "accelerate/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "parallel/checkpoint/index.h"

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

void write_file_durable(const std::string& path, const std::string& data) {
  file_io::write_file_atomic(path, data, "checkpoint");
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  // accel wrote every checkpoint file itself, never as a link (Note [safe file access]).
  return file_io::read_file(path, "checkpoint", max_bytes, file_io::Links::kRefuse);
}

std::string checkpoint_tmp_dir(const std::string& final_dir) {
  fs::path p(final_dir);
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();
  return (fs::path(parent_of(fs::path(final_dir).lexically_normal().string())) / (".tmp-" + name))
      .string();
}

void begin_checkpoint_dir(const std::string& tmp_dir) {
  const auto [parent, name] = file_io::split_path(tmp_dir, "save_state");
  const file_io::Fd p = file_io::open_dir(parent, /*create=*/true, "save_state");
  file_io::remove_tree(p.get(), name, tmp_dir, "save_state");
  ACCEL_CHECK(::mkdirat(p.get(), name.c_str(), 0755) == 0, IoError, "save_state", "cannot create '",
              tmp_dir, "': ", std::strerror(errno));
  write_file_durable((fs::path(tmp_dir) / kCheckpointMarker).string(),
                     "accel checkpoint folder (Note [what save_state replaces] in "
                     "accelerate/checkpoint.h)\n");
}

namespace {
// tp0, tp1, ...: the folder of one tensor-parallel index of a format-1 checkpoint (Note
// [format-1 checkpoints as pieces] in parallel/checkpoint/legacy.h).
bool is_tp_folder_name(const std::string& name) {
  static const std::regex kTp(R"(tp\d{1,6})");
  return std::regex_match(name, kTp);
}
}  // namespace

void refuse_checkpoint_links(const std::string& dir, const char* op) {
  const file_io::Fd d = file_io::open_dir(dir, false, op);
  for (const std::string& n : file_io::list_dir(d.get(), dir, op)) {
    struct stat st {};
    if (::fstatat(d.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const std::string path = (fs::path(dir) / n).string();
    ACCEL_CHECK(!S_ISLNK(st.st_mode), IoError, op, "'", path,
                "' is a symbolic link: accel never writes one into a checkpoint, so a checkpoint "
                "holding one is refused rather than followed");
    if (S_ISDIR(st.st_mode) && is_tp_folder_name(n)) refuse_checkpoint_links(path, op);
  }
}

namespace {
// renameat2(RENAME_EXCHANGE): swaps two paths atomically (Linux 3.15; ext4, xfs, btrfs, tmpfs,
// ...). False with errno set where the kernel or filesystem cannot (EINVAL, ENOSYS, ENOTSUP).
bool exchange_paths(int dirfd, const std::string& a, const std::string& b) {
#if defined(SYS_renameat2)
  constexpr unsigned kRenameExchange = 1u << 1;  // RENAME_EXCHANGE in <linux/fs.h>
  return ::syscall(SYS_renameat2, dirfd, a.c_str(), dirfd, b.c_str(), kRenameExchange) == 0;
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

// A complete checkpoint: state.json (format 1) or index.json (format 2) is its last file.
bool has_state(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kCheckpointStateFile, ec) ||
         fs::exists(fs::path(dir) / ckpt::kIndexFile, ec);
}

// What an earlier version without a manifest wrote into a checkpoint folder, and the
// temporaries of its writes (Note [what save_state replaces]).
bool legacy_checkpoint_name(const std::string& name) {
  static const std::regex kNames(
      R"((state\.json|(model|optimizer|scheduler)(_\d+)?\.safetensors|)"
      R"((grads|zero_optimizer|zero_grads|fsdp_model|fsdp_optimizer|fsdp_grads)(_\d+)?_rank\d+)"
      R"(\.safetensors|loader(_\d+)?(_rank\d+)?\.json|rng_rank\d+\.txt|custom_.+_rank\d+\.json))"
      R"((\.tmp(\.\d+\.\d+)?)?)");
  static const std::regex kNewTemp(R"(\.(.+)\.tmp-\d+-[0-9a-f]+-\d+)");
  std::smatch m;
  if (std::regex_match(name, m, kNewTemp)) return legacy_checkpoint_name(m[1].str());
  return std::regex_match(name, kNames);
}

std::string listing(std::vector<std::string> names) {
  constexpr size_t kShown = 8;
  std::sort(names.begin(), names.end());
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}
}  // namespace

std::optional<std::string> replace_refusal(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    return std::string("cannot be examined: ") + std::strerror(errno);
  }
  if (S_ISLNK(st.st_mode))
    return std::string(
        "is a symbolic link (the save would replace the link, not the folder it "
        "names; pass that folder)");
  if (!S_ISDIR(st.st_mode))
    return std::string("is ") + file_io::file_kind(st.st_mode) + ", not a folder";
  const file_io::Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!d) return std::string("cannot be opened: ") + std::strerror(errno);
  const std::vector<std::string> names = file_io::list_dir(d.get(), dir, "save_state");
  if (names.empty()) return std::nullopt;
  auto regular = [&](const std::string& n) {
    struct stat e {};
    return ::fstatat(d.get(), n.c_str(), &e, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(e.st_mode);
  };
  auto has = [&](const char* n) {
    return std::find(names.begin(), names.end(), n) != names.end() && regular(n);
  };
  const bool marker = has(kCheckpointMarker);
  bool accel_state = false;
  std::optional<std::set<std::string>> manifest;
  if (has(kCheckpointStateFile)) {
    try {
      const nlohmann::json s =
          nlohmann::json::parse(read_file((fs::path(dir) / kCheckpointStateFile).string()));
      accel_state = s.is_object() && s.contains("format") && s.contains("step");
      if (accel_state && s.contains("files") && s["files"].is_array()) {
        manifest.emplace();
        for (const auto& f : s["files"])
          if (f.is_string()) manifest->insert(f.get<std::string>());
      }
    } catch (const std::exception&) {  // not accel's state.json: judged by the rest below
    }
  }
  // Format 2: index.json lists the data files ("files") and the registered objects' files
  // ("extra_files"; Note [format-2 facade] in accelerate/accelerator_state.cc).
  if (!accel_state && has(ckpt::kIndexFile)) {
    try {
      const nlohmann::json s =
          nlohmann::json::parse(read_file((fs::path(dir) / ckpt::kIndexFile).string()));
      accel_state = s.is_object() && s.value("format", 0) == ckpt::kFormat;
      if (accel_state) {
        manifest.emplace();
        manifest->insert(ckpt::kIndexFile);
        for (const auto& f : s.value("files", nlohmann::json::array()))
          if (f.is_object() && f.contains("name") && f["name"].is_string())
            manifest->insert(f["name"].get<std::string>());
        for (const auto& f : s.value("extra_files", nlohmann::json::array()))
          if (f.is_string()) manifest->insert(f.get<std::string>());
      }
    } catch (const std::exception&) {  // not accel's index.json: judged by the rest below
    }
  }
  std::vector<std::string> shown;
  for (const std::string& n : names) {
    struct stat e {};
    const bool ok = ::fstatat(d.get(), n.c_str(), &e, AT_SYMLINK_NOFOLLOW) == 0;
    shown.push_back(n + (ok && S_ISDIR(e.st_mode)   ? "/"
                         : ok && S_ISLNK(e.st_mode) ? " (a symbolic link)"
                                                    : ""));
  }
  if (!marker && !accel_state)
    return "holds " + listing(shown) + ", and is not a checkpoint folder of accel's (no " +
           kCheckpointMarker + " marker, no " + kCheckpointStateFile + " of accel's)";
  // A format-1 tensor-parallel index's folder (parallel/checkpoint/legacy.h): a real
  // folder whose every entry is a regular file the manifest lists as "tp<t>/<file>". In an
  // unfinished save of ours (the marker, no state.json yet: a rank was killed while saving) any
  // regular file its ranks wrote: before, such a folder blocked every later save to the same
  // checkpoint_<N>, so a job restarted by --max_restarts died at each restart.
  const bool unfinished = marker && !accel_state;
  auto tp_folder_ok = [&](const std::string& n) {
    struct stat e {};
    if ((!manifest && !unfinished) || !is_tp_folder_name(n) ||
        ::fstatat(d.get(), n.c_str(), &e, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(e.st_mode))
      return false;
    const std::string sub = (fs::path(dir) / n).string();
    const file_io::Fd sd(::open(sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sd) return false;
    for (const std::string& f : file_io::list_dir(sd.get(), sub, "save_state")) {
      struct stat fe {};
      if (::fstatat(sd.get(), f.c_str(), &fe, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(fe.st_mode) ||
          (manifest && !manifest->count(n + "/" + f)))
        return false;
    }
    return true;
  };
  std::vector<std::string> foreign;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (tp_folder_ok(n)) continue;
    bool ok = regular(n);
    if (ok && n != kCheckpointStateFile && n != kCheckpointMarker &&
        !(manifest && n == ckpt::kIndexFile)) {
      if (manifest)
        ok = manifest->count(n) != 0;
      else if (!accel_state)
        ok = true;  // an unfinished save of ours: any of the files its ranks write
      else
        ok = legacy_checkpoint_name(n);
    }
    if (!ok) foreign.push_back(shown[i]);
  }
  if (!foreign.empty())
    return "is a checkpoint folder but also holds what accel did not write there: " +
           listing(foreign);
  return std::nullopt;
}

void check_save_target(const std::string& final_dir) {
  const std::pair<std::string, const char*> dirs[] = {
      {final_dir, ""},
      {checkpoint_tmp_dir(final_dir), " (the temporary folder of a save to it)"},
      {checkpoint_aside_dir(final_dir), " (where a save to it keeps the old copy)"}};
  for (const auto& [dir, role] : dirs) {
    if (auto why = replace_refusal(dir)) {
      ACCEL_THROW(IoError, "save_state", "'", dir, "'", role, " ", *why,
                  ". save_state replaces that folder as a whole, so it refuses: pass a new or "
                  "empty folder, or a checkpoint folder of accel's (docs/checkpointing.md)");
    }
  }
}

std::string checkpoint_aside_dir(const std::string& final_dir) {
  return checkpoint_tmp_dir(final_dir) + ".old";
}

void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& final_dir) {
  constexpr const char* kOp = "save_state";
  const auto [parent, tmp_name] = file_io::split_path(tmp_dir, kOp);
  const std::string final_name = file_io::split_path(final_dir, kOp).second;
  const std::string aside_name = file_io::split_path(checkpoint_aside_dir(final_dir), kOp).second;
  // Every step is relative to the opened parent (Note [safe file access]).
  const file_io::Fd p = file_io::open_dir(parent, false, kOp);
  {
    const file_io::Fd t(
        ::openat(p.get(), tmp_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    ACCEL_CHECK(t, IoError, kOp, "cannot open '", tmp_dir, "': ", std::strerror(errno));
    file_io::fsync_fd(t.get(), tmp_dir, kOp);
  }
  auto rename_in_parent = [&](const std::string& from, const std::string& to) {
    ACCEL_CHECK(::renameat(p.get(), from.c_str(), p.get(), to.c_str()) == 0, IoError, kOp,
                "rename '", parent, "/", from, "' -> '", to, "' failed: ", std::strerror(errno));
  };
  // Removing an old copy that is no longer named anywhere: a failure leaves it for the next save
  // to remove, and does not undo a complete commit.
  auto remove_quietly = [&](const std::string& name) {
    try {
      file_io::remove_tree(p.get(), name, parent + "/" + name, kOp);
    } catch (const IoError&) {
    }
  };
  struct stat st {};
  if (::fstatat(p.get(), final_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    ACCEL_CHECK(errno == ENOENT, IoError, kOp, "cannot stat '", final_dir,
                "': ", std::strerror(errno));
    rename_in_parent(tmp_name, final_name);
    file_io::fsync_fd(p.get(), parent, kOp);
    run_checkpoint_hook("commit_swap");
  } else if (!no_exchange_for_tests() && exchange_paths(p.get(), tmp_name, final_name)) {
    // final_dir is the new checkpoint and tmp_dir the old one, in one step: there is no instant
    // at which final_dir is missing or partial.
    file_io::fsync_fd(p.get(), parent, kOp);
    run_checkpoint_hook("commit_swap");
    remove_quietly(tmp_name);
  } else {
    // No atomic exchange here: move the old checkpoint aside, then the new one in. Between the
    // two renames final_dir is missing; resolve_checkpoint_dir() then loads the aside copy,
    // which is complete (Note [atomic checkpoints]).
    file_io::remove_tree(p.get(), aside_name, checkpoint_aside_dir(final_dir), kOp);
    rename_in_parent(final_name, aside_name);
    file_io::fsync_fd(p.get(), parent, kOp);
    run_checkpoint_hook("commit_swap");
    rename_in_parent(tmp_name, final_name);
    file_io::fsync_fd(p.get(), parent, kOp);
  }
  // A previous save killed between the fallback's renames leaves an aside copy behind.
  remove_quietly(aside_name);
}

void write_latest(const std::string& parent, const std::string& name) {
  write_file_durable((fs::path(parent) / kLatestFile).string(), name + "\n");
}

std::optional<std::string> read_latest(const std::string& parent) {
  fs::path p = fs::path(parent) / kLatestFile;
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;
  std::string s =
      file_io::read_file(p.string(), "load_state", kMaxLatestBytes, file_io::Links::kRefuse);
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
    // At most 18 digits: std::stoll of more could overflow (out_of_range).
    if (digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
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
  // Only checkpoint folders of accel's count and are deleted (Note [what save_state replaces]):
  // a checkpoint_<N> folder of the user's, or a link by that name, is left alone.
  std::vector<std::string> all;
  for (const std::string& dir : list_checkpoints(parent))
    if (!replace_refusal(dir)) all.push_back(dir);
  const std::string keep_norm = fs::path(keep).lexically_normal().string();
  int64_t excess = int64_t(all.size()) - total_limit;
  for (const std::string& dir : all) {
    if (excess <= 0) break;
    if (fs::path(dir).lexically_normal().string() == keep_norm) continue;
    file_io::remove_tree(dir, "save_state");
    --excess;
  }
}

}  // namespace accel::dist
