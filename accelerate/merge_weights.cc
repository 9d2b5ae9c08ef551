#include "accelerate/merge_weights.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "accelerate/checkpoint.h"
#include "core/error.h"
#include "core/file_io.h"
#include "io/safetensors.h"
#include "parallel/checkpoint/legacy.h"
#include "parallel/checkpoint/reader.h"

namespace accel::merge {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOp = "merge_weights";

// One tensor of the output: its state-dict name, dtype, shape and bytes.
struct Item {
  std::string name;
  DType dtype = kFloat32;
  Shape shape;
  uint64_t bytes = 0;
};
// The values of an item, as a contiguous CPU tensor of its dtype and shape.
using Fetch = std::function<Tensor(const Item&)>;

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

// model-NNNNN-of-NNNNN.safetensors
std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}
bool is_shard_name(const std::string& n) {
  const std::string head = "model-", mid = "-of-", tail = ".safetensors";
  if (n.size() <= head.size() + tail.size() || n.rfind(head, 0) != 0 ||
      n.compare(n.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  const std::string core = n.substr(head.size(), n.size() - head.size() - tail.size());
  const size_t at = core.find(mid);
  return at != std::string::npos && all_digits(core.substr(0, at)) &&
         all_digits(core.substr(at + mid.size()));
}
bool is_output_name(const std::string& n) {
  return n == kSingleFile || n == kIndexFile || is_shard_name(n);
}

struct Target {
  bool folder = false;
  bool exists = false;  // the folder exists and holds files of an earlier output
};

// Note [merge-weights]: what `out` is, and whether it may be replaced. IoError otherwise.
Target check_target(const std::string& out, bool sharded) {
  struct stat st {};
  Target t;
  if (::lstat(out.c_str(), &st) != 0) {
    ACCEL_CHECK(errno == ENOENT, IoError, kOp, "cannot inspect '", out,
                "': ", std::strerror(errno));
    const bool file_name = fs::path(out).extension() == ".safetensors";
    ACCEL_CHECK(!(sharded && file_name), ValueError, kOp, "'", out,
                "' names a file; a set of shards (--max_shard_size) is written into a folder");
    t.folder = !file_name;
    return t;
  }
  ACCEL_CHECK(!S_ISLNK(st.st_mode), IoError, kOp, "'", out,
              "' is a symbolic link; give the file or folder itself (refusing to replace a link)");
  if (S_ISREG(st.st_mode)) {
    ACCEL_CHECK(!sharded, IoError, kOp, "'", out,
                "' is a file; a set of shards (--max_shard_size) is written into a folder");
    return t;
  }
  ACCEL_CHECK(S_ISDIR(st.st_mode), IoError, kOp, "'", out, "' is ", file_io::file_kind(st.st_mode),
              ", not a file or folder to write");
  t.folder = true;
  file_io::Fd d = file_io::open_dir(out, /*create=*/false, kOp);
  for (const std::string& name : file_io::list_dir(d.get(), out, kOp)) {
    struct stat e {};
    const bool regular =
        ::fstatat(d.get(), name.c_str(), &e, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(e.st_mode);
    ACCEL_CHECK(regular && is_output_name(name), IoError, kOp, "'", out, "' holds '", name,
                "', which merge-weights does not write; refusing to replace the folder (give a "
                "new or empty folder, or remove it)");
    t.exists = true;
  }
  return t;
}

// renameat2(RENAME_EXCHANGE) (as in accelerate/checkpoint.cc); false with errno set where the
// kernel or filesystem cannot.
bool exchange_paths(const std::string& a, const std::string& b) {
#if defined(SYS_renameat2)
  constexpr unsigned kRenameExchange = 1u << 1;  // RENAME_EXCHANGE in <linux/fs.h>
  return ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange) == 0;
#else
  errno = ENOSYS;
  return false;
#endif
}

// A new folder beside `out` (mode 0777 less the umask, as mkdir gives), named at random.
std::string staging_folder(const std::string& out) {
  fs::path p = fs::path(out).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  fs::create_directories(parent);
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char tag[32];
    std::snprintf(tag, sizeof tag, "%08x", unsigned(rd()));
    const std::string tmp = (parent / (".tmp-" + p.filename().string() + "-" + tag)).string();
    if (::mkdir(tmp.c_str(), 0777) == 0) return tmp;
    ACCEL_CHECK(errno == EEXIST, IoError, kOp, "cannot create the folder '", tmp,
                "': ", std::strerror(errno));
  }
  ACCEL_THROW(IoError, kOp, "cannot create a staging folder beside '", out, "'");
}

// The staging folder becomes `out`: renamed onto a missing or empty one, or swapped with an
// earlier output in one step (which is then deleted); where the filesystem cannot swap, the
// earlier output is deleted first.
void commit_folder(const std::string& tmp, const std::string& out, const Target& t) {
  {
    file_io::Fd d = file_io::open_dir(tmp, /*create=*/false, kOp);
    file_io::fsync_fd(d.get(), tmp, kOp);
  }
  if (t.exists) {
    if (exchange_paths(tmp, out)) {
      file_io::remove_tree(tmp, kOp);  // now the earlier output
      return;
    }
    file_io::remove_tree(out, kOp);
  }
  ACCEL_CHECK(::rename(tmp.c_str(), out.c_str()) == 0, IoError, kOp, "cannot rename '", tmp,
              "' to '", out, "': ", std::strerror(errno));
  fs::path parent = fs::path(out).lexically_normal().parent_path();
  file_io::Fd d = file_io::open_dir(parent.empty() ? "." : parent.string(), false, kOp);
  file_io::fsync_fd(d.get(), parent.string(), kOp);
}

// Note [merge-weights]: the items in shards, each file written one tensor at a time.
Written write_output(const std::string& out, const std::vector<Item>& items,
                     const io::Metadata& common, const std::map<std::string, std::string>& aliases,
                     uint64_t cap, const Fetch& fetch) {
  const Target target = check_target(out, cap > 0);
  std::vector<std::vector<size_t>> shards(1);
  Written w;
  w.path = out;
  uint64_t in_shard = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (cap > 0 && in_shard + items[i].bytes > cap && !shards.back().empty()) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += items[i].bytes;
    w.total_bytes += items[i].bytes;
  }
  w.tensors = items.size();
  w.indexed = shards.size() > 1;
  auto write_file = [&](const std::string& path, const std::vector<size_t>& which) {
    std::vector<io::SafetensorsWriter::Entry> entries;
    std::set<std::string> here;
    for (size_t i : which) {
      entries.push_back({items[i].name, items[i].dtype, items[i].shape});
      here.insert(items[i].name);
    }
    io::Metadata meta = common;
    for (const auto& [alias, kept] : aliases)
      if (here.count(kept)) meta.emplace(alias, kept);
    io::SafetensorsWriter writer(path, entries, meta);
    for (size_t i : which) writer.write(fetch(items[i]));
    writer.commit();
  };
  if (!target.folder) {
    const fs::path parent = fs::path(out).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    write_file(out, shards[0]);
    w.files.push_back(out);
    return w;
  }
  const std::string tmp = staging_folder(out);
  try {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name = w.indexed ? shard_name(s, shards.size()) : kSingleFile;
      write_file((fs::path(tmp) / name).string(), shards[s]);
      w.files.push_back(name);
      for (size_t i : shards[s]) weight_map[items[i].name] = name;
    }
    if (w.indexed) {
      const nlohmann::json index = {{"metadata", {{"total_size", w.total_bytes}}},
                                    {"weight_map", weight_map}};
      file_io::write_file_atomic((fs::path(tmp) / kIndexFile).string(), index.dump(2) + "\n", kOp);
      w.files.push_back(kIndexFile);
    }
    commit_folder(tmp, out, target);
  } catch (...) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(tmp, ec))) file_io::remove_tree(tmp, kOp);
    throw;
  }
  return w;
}

// The checkpoint to read: format 2 (index.json), or format 1 through `latest` as load_state
// resolves it (Note [atomic checkpoints] in accelerate/checkpoint.h).
std::unique_ptr<dist::ckpt::CheckpointSource> open_source(const std::string& dir) {
  std::error_code ec;
  const std::string path = dist::resolve_checkpoint_dir(dir);
  if (fs::exists(fs::symlink_status(fs::path(path) / dist::ckpt::kIndexFile, ec)) &&
      !fs::exists(fs::symlink_status(fs::path(path) / dist::kCheckpointStateFile, ec)))
    return dist::ckpt::open_checkpoint(path);
  return dist::ckpt::open_legacy(path);
}

uint64_t tensor_bytes(DType dtype, const Shape& shape) {
  uint64_t n = dtype_size(dtype);
  for (int64_t s : shape) n *= uint64_t(s);
  return n;
}

}  // namespace

uint64_t parse_size(const std::string& text) {
  auto fail = [&]() -> uint64_t {
    ACCEL_THROW(ValueError, kOp, "size '", text,
                "' is not a byte count or an integer with a unit (5GB, 500MiB, 100KB)");
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 15) return fail();
  const uint64_t value = std::stoull(text.substr(0, digits));
  std::string unit = text.substr(digits);
  const bool bits = unit.size() == 2 && unit[1] == 'b';
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, uint64_t> kUnits = {{"", 1},
                                                         {"B", 1},
                                                         {"KB", 1000},
                                                         {"MB", 1000000},
                                                         {"GB", 1000000000},
                                                         {"TB", 1000000000000},
                                                         {"KIB", 1 << 10},
                                                         {"MIB", 1 << 20},
                                                         {"GIB", uint64_t(1) << 30},
                                                         {"TIB", uint64_t(1) << 40}};
  const auto it = kUnits.find(unit);
  if (it == kUnits.end() || value == 0) return fail();
  const uint64_t bytes = value * it->second;
  return bits ? bytes / 8 : bytes;
}

Written merge_weights(const std::string& checkpoint, const std::string& out, const Options& opts) {
  check_target(out, opts.max_shard_bytes > 0);  // before the checkpoint is opened
  auto src = open_source(checkpoint);
  const std::string prefix = "model." + std::to_string(opts.model) + ".";
  std::vector<Item> items;
  for (const std::string& g : src->names()) {
    if (g.rfind(prefix, 0) != 0) continue;
    const dist::ckpt::TensorRecord& r = src->tensor(g);
    items.push_back({g.substr(prefix.size()), r.dtype, r.shape, tensor_bytes(r.dtype, r.shape)});
  }
  // How many models the checkpoint holds: state.json's num_models (format 1), the index's
  // counts (format 2), else what its names say.
  const nlohmann::json& meta = src->meta();
  size_t models = 0;
  if (meta.contains("num_models") && meta["num_models"].is_number_unsigned()) {
    models = meta["num_models"].get<size_t>();
  } else if (meta.contains("counts") && meta["counts"].is_object() &&
             meta["counts"].value("models", nlohmann::json()).is_number_unsigned()) {
    models = meta["counts"]["models"].get<size_t>();
  } else {
    for (const std::string& g : src->names())
      if (g.rfind("model.", 0) == 0) {
        const size_t dot = g.find('.', 6);
        const std::string i = g.substr(6, dot == std::string::npos ? 0 : dot - 6);
        if (all_digits(i) && i.size() < 9) models = std::max(models, size_t(std::stoul(i)) + 1);
      }
  }
  ACCEL_CHECK(opts.model < models, ValueError, kOp, "checkpoint '", checkpoint, "' holds ", models,
              " model(s); there is no model ", opts.model, " (--model)");
  std::map<std::string, std::string> aliases;
  if (meta.contains("aliases") && meta["aliases"].is_object())
    for (auto it = meta["aliases"].begin(); it != meta["aliases"].end(); ++it)
      if (it.key().rfind(prefix, 0) == 0 && it->is_string() &&
          it->get<std::string>().rfind(prefix, 0) == 0)
        aliases[it.key().substr(prefix.size())] = it->get<std::string>().substr(prefix.size());
  const Fetch fetch = [&](const Item& item) {
    Tensor t = empty(item.shape, TensorOptions(item.dtype, kCPU));
    src->read(prefix + item.name, dist::Region::whole(item.shape), t);
    return t;
  };
  return write_output(out, items, {{"format", "pt"}}, aliases, opts.max_shard_bytes, fetch);
}

Written split_weights(const std::string& file, const std::string& out_dir,
                      uint64_t max_shard_bytes) {
  ACCEL_CHECK(max_shard_bytes > 0, ValueError, kOp,
              "--split needs a size cap (--max_shard_size 5GB)");
  check_target(out_dir, true);  // before the input is opened
  const io::SafetensorsFile in(file);
  std::vector<Item> items;
  for (const std::string& n : in.names()) {
    const io::SafetensorsFile::Info& info = in.info(n);
    items.push_back({n, info.dtype, info.shape, tensor_bytes(info.dtype, info.shape)});
  }
  // Note [tied tensors in files]: a key that is no tensor naming one is a tied alias.
  io::Metadata common{{"format", "pt"}};
  std::map<std::string, std::string> aliases;
  for (const auto& [k, v] : in.metadata()) {
    if (!in.contains(k) && in.contains(v))
      aliases[k] = v;
    else
      common[k] = v;
  }
  const Fetch fetch = [&](const Item& item) { return in.read(item.name); };
  return write_output(out_dir, items, common, aliases, max_shard_bytes, fetch);
}

}  // namespace accel::merge
