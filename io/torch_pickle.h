// The pickle part of torch.save files, without tensors or file I/O (so the loader and the fuzz
// target tests/fuzz/fuzz_torch.cc run the same code): a restricted unpickler that accepts what
// torch's weights_only=True unpickler accepts and builds a graph of plain values and tensor
// descriptions, a bounded walk of that graph, and a pickler that writes what torch.save writes.
// See Note [restricted unpickler] in torch_pickle.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/torch_zip.h"
#include "core/dtype.h"

namespace accel::io::detail {

// Nesting accepted in a file (and written): torch's state dicts nest 2 deep, optimizer states 4.
constexpr int kPtMaxDepth = 100;
// Dimensions accepted per tensor.
constexpr size_t kPtMaxRank = 64;

// A storage a tensor views: the record data/<key> (zip) or the key's bytes (legacy) holding
// `numel` elements of `dtype`.
struct StorageInfo {
  DType dtype = kFloat32;
  int64_t numel = 0;
};

// A tensor as torch._utils._rebuild_tensor_v2 describes it, checked against its storage.
struct TensorRecord {
  std::string storage_key;
  DType dtype = kFloat32;
  int64_t offset = 0;  // in elements
  std::vector<int64_t> sizes, strides;
  bool requires_grad = false;
};

// A value of the unpickled graph. Containers, strings and tensors live in the Unpickler's arena;
// a value points at them (the graph may share nodes, as Python's objects do).
struct PickleObject;
struct PickleValue {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kTensor,
    // only while unpickling (walk_pickle refuses them in the result):
    kGlobal,
    kStorage
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;  // bool, int
  double f = 0;
  PickleObject* obj = nullptr;
};

struct PickleObject {
  PickleValue::Kind kind;
  bool ordered = false;            // a dict that is a collections.OrderedDict
  std::string text;                // string; global "module.name"; storage key
  std::vector<PickleValue> items;  // list, tuple; dict: key, value, key, value, ...
  std::vector<PickleValue> attrs;  // OrderedDict attributes (BUILD): name, value, ...
  std::unique_ptr<std::unordered_map<std::string, size_t>> index;  // dict: key -> items position
  std::unique_ptr<TensorRecord> tensor;
};

// Bounds of one unpickling, from the size of the pickle (Note [restricted unpickler]).
struct PickleLimits {
  uint64_t max_memory_bytes = 0;  // arena bytes (objects, strings, items)
  uint64_t max_values = 0;        // values a walk of the result may visit
  static PickleLimits for_size(uint64_t pickle_bytes);
};

class Unpickler {
 public:
  // Persistent ids are torch.save's storages: ('storage', class, key, location, numel), or in the
  // legacy format ('storage', class, key, location, numel, view) with view None. Each is checked
  // and collected in storages(). IoErrors name `path`.
  Unpickler(std::string path, bool legacy, PickleLimits limits);
  ~Unpickler();
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;

  // Unpickles the pickle at src[begin, end) (read in bounded blocks; `what` names it in errors,
  // e.g. "data.pkl") and returns the value of its STOP. With `consumed`, the pickle may end before
  // `end` and *consumed gets its length; without, bytes after STOP are an error. Values of several
  // loads share the arena.
  PickleValue load(const ByteSource& src, uint64_t begin, uint64_t end, const std::string& what,
                   uint64_t* consumed = nullptr);
  // Storages referenced so far (key -> dtype, numel), one entry per key.
  const std::map<std::string, StorageInfo>& storages() const { return storages_; }
  const std::string& path() const { return path_; }
  const PickleLimits& limits() const { return limits_; }

 private:
  class Run;
  std::string path_;
  bool legacy_;
  PickleObject* empty_tuple_ = nullptr;  // shared, as Python shares ()
  PickleLimits limits_;
  uint64_t memory_ = 0;
  std::vector<std::unique_ptr<PickleObject>> arena_;
  std::map<std::string, StorageInfo> storages_;
};

// Receives a walk of an unpickled value (walk_pickle), in order: a container is begin_*, its
// items (a dict: key, value, key, value, ..., then its attributes likewise), end().
class PickleVisitor {
 public:
  virtual ~PickleVisitor() = default;
  virtual void none() = 0;
  virtual void boolean(bool v) = 0;
  virtual void integer(int64_t v) = 0;
  virtual void real(double v) = 0;
  virtual void string(const std::string& v) = 0;
  // `id` is the same for every occurrence of one tensor of the graph.
  virtual void tensor(const TensorRecord& t, const void* id) = 0;
  virtual void begin_list(size_t n) = 0;
  virtual void begin_tuple(size_t n) = 0;
  virtual void begin_dict(bool ordered, size_t n_items, size_t n_attrs) = 0;
  virtual void end() = 0;
};

// Walks `root` depth first, at most kPtMaxDepth deep and visiting at most limits.max_values
// values (a node the graph shares is visited once per reference): IoError naming the unpickler's
// path otherwise (also for a cycle, which is infinitely deep).
void walk_pickle(const Unpickler& u, const PickleValue& root, PickleVisitor& v);

// The storage classes of torch.save (torch.FloatStorage, ...): the dtype of a class name, or
// IoError naming the file when accel has no such dtype.
DType storage_dtype(const std::string& global_name, const std::string& path, const char* op);
// "torch.FloatStorage" for kFloat32, ...
const char* storage_class(DType dtype);

// Writes pickle protocol 2 the way Python's pickler (with torch.save's persistent ids) writes
// it, memo numbering included (Note [pickling like torch.save]).
class Pickler {
 public:
  Pickler();
  ~Pickler();
  Pickler(const Pickler&) = delete;
  Pickler& operator=(const Pickler&) = delete;
  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void real(double v);
  void string(const std::string& v);
  // A tensor over storage `key` (numel elements of dtype): _rebuild_tensor_v2(...).
  void tensor(const std::string& key, DType dtype, int64_t storage_numel, int64_t offset,
              const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
              bool requires_grad);
  // Containers: begin, the items (dict: key, value, ... for n_items pairs), end. A dict's
  // attributes (OrderedDict only) follow its items: begin_attrs(n), n name/value pairs.
  void begin_list(size_t n);
  void begin_tuple(size_t n);
  void begin_dict(bool ordered, size_t n);
  void begin_attrs(size_t n);
  void end();
  // The pickle, STOP included; the Pickler is done.
  std::string finish();

 private:
  struct Frame;
  void before_value();
  void item_done();
  void empty_batch();
  void op(uint8_t code) { out_.push_back(char(code)); }
  void put_memo();
  // BINGET of `key`'s memo entry when there is one (true); else records that the object the
  // caller writes next gets the next memo index (false).
  bool get_memo(const std::string& key);
  void global(const std::string& module, const std::string& name);
  void put_string(const std::string& ns, const std::string& v);
  void tuple_of(const std::vector<int64_t>& v);
  std::string out_;
  uint32_t memo_size_ = 0;
  std::unordered_map<std::string, uint32_t> memo_;  // "g:" globals, "s:" / "u:" strings
  std::vector<Frame> frames_;
  bool top_done_ = false;
};

}  // namespace accel::io::detail
