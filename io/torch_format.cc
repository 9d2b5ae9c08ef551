#include "io/torch_format.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "io/torch_file.h"
#include "core/file_io.h"

namespace accel::io {

namespace {

constexpr const char* kLoad = "load_pt";
constexpr const char* kSave = "save_pt";
// torch 1.13's kProducedFileFormatVersion.
constexpr const char* kFormatVersion = "3\n";

// Builds the PtValue of a walk of the unpickled graph (detail::walk_pickle), creating each tensor
// over its storage, which is read from the file the first time a tensor needs it.
class Builder final : public detail::PickleVisitor {
 public:
  Builder(const detail::ByteSource& src, const detail::TorchFile& f, const std::string& path)
      : src_(src), file_(f), path_(path) {}

  void none() override { add(PtValue()); }
  void boolean(bool v) override { add(PtValue(v)); }
  void integer(int64_t v) override { add(PtValue(v)); }
  void real(double v) override { add(PtValue(v)); }
  void string(const std::string& v) override { add(PtValue(v)); }
  void tensor(const detail::TensorRecord& t, const void* id) override {
    auto it = tensors_.find(id);  // the same tensor object again (a memo reference)
    if (it != tensors_.end()) {
      add(PtValue(it->second));
      return;
    }
    Shape sizes, strides;
    for (int64_t s : t.sizes) sizes.push_back(s);
    for (int64_t s : t.strides) strides.push_back(s);
    // The geometry was checked against the storage when it was unpickled (Note [restricted
    // unpickler]); the storage's size against its record (Note [torch file layouts]).
    Tensor x(make_intrusive<TensorImpl>(storage(t.storage_key), std::move(sizes),
                                        std::move(strides), t.offset, t.dtype));
    if (t.requires_grad && is_floating(t.dtype)) x.requires_grad_(true);
    tensors_.emplace(id, x);
    add(PtValue(x));
  }
  void begin_list(size_t n) override { push(PtValue::list(), n, 0); }
  void begin_tuple(size_t n) override { push(PtValue::tuple(), n, 0); }
  void begin_dict(bool ordered, size_t n_items, size_t n_attrs) override {
    push(ordered ? PtValue::ordered_dict() : PtValue::dict(), n_items, n_attrs);
  }
  void end() override {
    PtValue v = std::move(stack_.back().value);
    stack_.pop_back();
    add(std::move(v));
  }
  PtValue take() { return std::move(result_); }

 private:
  struct Frame {
    PtValue value;
    size_t n_items = 0, got = 0;
    bool has_key = false;
    PtValue key;
  };
  void push(PtValue v, size_t n_items, size_t n_attrs) {
    if (v.is_dict()) {
      v.entries().reserve(n_items);
      v.attributes().reserve(n_attrs);
    } else {
      v.items().reserve(n_items);
    }
    Frame f;
    f.value = std::move(v);
    f.n_items = n_items;
    stack_.push_back(std::move(f));
  }
  void add(PtValue v) {
    if (stack_.empty()) {
      result_ = std::move(v);
      return;
    }
    Frame& f = stack_.back();
    if (!f.value.is_dict()) {
      f.value.items().push_back(std::move(v));
      return;
    }
    if (!f.has_key) {
      f.key = std::move(v);
      f.has_key = true;
      return;
    }
    // Keys are distinct: the unpickler indexed them as Python's dict does.
    auto& dst = f.got < f.n_items ? f.value.entries() : f.value.attributes();
    dst.push_back({std::move(f.key), std::move(v)});
    f.has_key = false;
    ++f.got;
  }
  const StoragePtr& storage(const std::string& key) {
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    const detail::StorageData& s = file_.storages.at(key);
    // At most the file's size in all: the records read are disjoint (Note [torch zip archives]).
    StoragePtr st = make_intrusive<Storage>(size_t(s.nbytes), kCPU);
    detail::read_storage(src_, s, st->data(), key, path_);
    return storages_.emplace(key, std::move(st)).first->second;
  }

  const detail::ByteSource& src_;
  const detail::TorchFile& file_;
  const std::string& path_;
  std::vector<Frame> stack_;
  PtValue result_;
  std::map<std::string, StoragePtr> storages_;
  std::unordered_map<const void*, Tensor> tensors_;
};

// "a list", "an int", "an OrderedDict".
std::string a_type(const PtValue& v) {
  const std::string t = v.type_name();
  return (t[0] == 'i' || t[0] == 'O' ? "an " : "a ") + t;
}

// The reason `v` is not a dict of str -> Tensor, or "".
std::string not_a_tensor_dict(const PtValue& v) {
  if (!v.is_dict()) return "holds " + a_type(v) + ", not a dict of tensors";
  for (const PtEntry& e : v.entries()) {
    if (!e.key.is_string())
      return "has the key " + e.key.repr() + " of type " + e.key.type_name() + ", not str";
    if (!e.value.is_tensor())
      return "holds " + a_type(e.value) + " under '" + e.key.to_string() + "', not a tensor";
  }
  return "";
}

TensorDict tensor_dict_of(const PtValue& v) {
  TensorDict out;
  for (const PtEntry& e : v.entries()) out.emplace(e.key.to_string(), e.value.to_tensor());
  return out;
}

// The archive folder torch's writer names after the file: its base name up to the last '.'.
std::string archive_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = base.find_last_of('.');
  if (dot != std::string::npos) base.resize(dot);
  return base.empty() ? "archive" : base;
}

// Pickles a PtValue tree (Note [pickling like torch.save]) and collects the storages its tensors
// view, numbered in order of first use as torch.save numbers them.
class Writer {
 public:
  explicit Writer(const std::string& path) : path_(path) {}

  struct Stored {
    std::string key;
    StoragePtr storage;
  };

  void value(const PtValue& v, int depth, const std::string& where) {
    ACCEL_CHECK(depth <= detail::kPtMaxDepth, ValueError, kSave, "'", path_, "': ", where,
                " nests deeper than ", detail::kPtMaxDepth, " levels");
    using K = PtValue::Kind;
    switch (v.kind()) {
      case K::kNone: p_.none(); return;
      case K::kBool: p_.boolean(v.to_bool()); return;
      case K::kInt: p_.integer(v.to_int()); return;
      case K::kDouble: p_.real(v.to_double()); return;
      case K::kString: p_.string(v.to_string()); return;
      case K::kTensor: tensor(v.to_tensor(), where); return;
      case K::kList:
      case K::kTuple:
        if (v.is_list()) {
          p_.begin_list(v.size());
        } else {
          p_.begin_tuple(v.size());
        }
        for (size_t i = 0; i < v.size(); ++i)
          value(v.item(i), depth + 1, where + "[" + std::to_string(i) + "]");
        p_.end();
        return;
      case K::kDict: {
        p_.begin_dict(v.ordered(), v.size());
        for (const PtEntry& e : v.entries()) {
          value(e.key, depth + 1, where + " key");
          value(e.value, depth + 1, where + "[" + e.key.repr() + "]");
        }
        if (!v.attributes().empty()) {
          ACCEL_CHECK(v.ordered(), ValueError, kSave, "'", path_, "': ", where,
                      " is a plain dict with attributes; only an OrderedDict has them");
          p_.begin_attrs(v.attributes().size());
          for (const PtEntry& e : v.attributes()) {
            ACCEL_CHECK(e.key.is_string(), ValueError, kSave, "'", path_, "': ", where,
                        " has an attribute named by a ", e.key.type_name());
            value(e.key, depth + 1, where + " attribute");
            value(e.value, depth + 1, where + "." + e.key.to_string());
          }
        }
        p_.end();
        return;
      }
    }
  }

  std::string pickle() { return p_.finish(); }
  std::vector<Stored>& storages() { return storages_; }

 private:
  void tensor(const Tensor& t, const std::string& where) {
    ACCEL_CHECK(t.defined(), ValueError, kSave, "'", path_, "': ", where, " is undefined");
    const StoragePtr& s = t.storage();
    ACCEL_CHECK(s->allocated(), ValueError, kSave, "'", path_, "': ", where,
                " has no memory (a deferred or ZeRO-3 released parameter); materialize or "
                "gather it first");
    auto it = keys_.find(s.get());
    if (it == keys_.end()) {
      ACCEL_CHECK(s->nbytes() % t.element_size() == 0, ValueError, kSave, "'", path_, "': ", where,
                  " (", t.dtype(), ") views a storage of ", s->nbytes(),
                  " bytes, not a whole number of elements");
      it = keys_.emplace(s.get(), std::make_pair(std::to_string(keys_.size()), t.dtype())).first;
      storages_.push_back({it->second.first, s});
    }
    ACCEL_CHECK(it->second.second == t.dtype(), ValueError, kSave, "'", path_, "': ", where,
                " views as ", t.dtype(), " a storage another tensor views as ", it->second.second,
                "; torch cannot save that either (save a copy)");
    const std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
    const std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
    p_.tensor(it->second.first, t.dtype(), int64_t(s->nbytes() / t.element_size()), t.offset(),
              sizes, strides, t.requires_grad());
  }

  const std::string& path_;
  detail::Pickler p_;
  std::unordered_map<const Storage*, std::pair<std::string, DType>> keys_;
  std::vector<Stored> storages_;
};

}  // namespace

PtValue read_pt(const std::string& path) {
  // Non-blocking open of a regular file (Note [safe file access] in core/file_io.h); everything
  // is read with pread at offsets checked against its size.
  const file_io::ReadableFile file = file_io::open_read(path, kLoad);
  const int fd = file.fd.get();
  detail::ByteSource src;
  src.size = file.size;
  src.read = [fd](void* dst, size_t n, uint64_t off) {
    return file_io::pread_all(fd, dst, n, off);
  };
  return detail::read_pt_from(src, path);
}

PtValue detail::read_pt_from(const ByteSource& src, const std::string& path) {
  const TorchFile f = parse_torch_file(src, path);
  Builder b(src, f, path);
  walk_pickle(*f.pickle, f.root, b);
  return b.take();
}

TensorDict load_pt(const std::string& path) {
  const PtValue v = read_pt(path);
  const std::string why = not_a_tensor_dict(v);
  ACCEL_CHECK(why.empty(), IoError, kLoad, "'", path, "' is not a state dict: it ", why,
              " (read it with io::read_pt and pick the part that is, e.g. io::to_tensor_dict("
              "io::read_pt(path).at(\"model\")))");
  return tensor_dict_of(v);
}

TensorDict to_tensor_dict(const PtValue& v, const std::string& what) {
  const std::string why = not_a_tensor_dict(v);
  ACCEL_CHECK(why.empty(), ValueError, "to_tensor_dict", what, " ", why);
  return tensor_dict_of(v);
}

PtValue to_pt_value(const TensorDict& tensors) {
  std::vector<PtEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, t] : tensors) entries.push_back({PtValue(name), PtValue(t)});
  return PtValue::ordered_dict(std::move(entries));
}

void save_pt(const std::string& path, const TensorDict& tensors) {
  save_pt(path, to_pt_value(tensors));
}

void save_pt(const std::string& path, const PtValue& value) {
  detail::save_pt_with(path, value, detail::kZip64Threshold);
}

void detail::save_pt_with(const std::string& path, const PtValue& value, uint64_t zip64_threshold) {
  // Everything that can be refused is refused before the file is created.
  Writer w(path);
  w.value(value, 0, "the value");
  const std::string pickle = w.pickle();
  std::vector<Writer::Stored>& stored = w.storages();
  // torch writes the records in the order of their keys as strings ("0", "1", "10", "2", ...).
  std::sort(stored.begin(), stored.end(),
            [](const Writer::Stored& a, const Writer::Stored& b) { return a.key < b.key; });
  const std::string arch = archive_name(path) + "/";

  file_io::AtomicFile out(path, kSave);
  detail::ZipWriter zip([&out](const void* d, size_t n) { out.write(d, n); }, zip64_threshold);
  zip.add_record(arch + "data.pkl", pickle);
  for (const Writer::Stored& s : stored) {
    const size_t n = s.storage->nbytes();
    zip.begin_record(arch + "data/" + s.key, n);
    if (n > 0) {
      if (s.storage->device().is_cpu()) {
        zip.write(s.storage->data(), n);
      } else {
        // One storage at a time through host memory.
        Tensor bytes(make_intrusive<TensorImpl>(s.storage, Shape{int64_t(n)}, kUInt8));
        const Tensor host = bytes.to(kCPU);
        zip.write(host.data_ptr(), n);
      }
    }
    zip.end_record();
  }
  zip.add_record(arch + "version", kFormatVersion);
  zip.finish();
  out.commit();
}

}  // namespace accel::io
