// The writing half of torch_pickle.h (Pickler), the bounded walk of an unpickled graph, and the
// storage classes of torch.save.
#include <algorithm>
#include <cstring>

#include "io/torch_pickle.h"
#include "core/error.h"

namespace accel::io::detail {

PickleLimits PickleLimits::for_size(uint64_t n) {
  constexpr uint64_t kBaseMemory = uint64_t(64) << 20, kMemoryPerByte = 64;
  constexpr uint64_t kBaseValues = uint64_t(1) << 18, kValuesPerByte = 4;
  const uint64_t cap = uint64_t(1) << 40;  // keeps the products below from overflowing
  n = std::min(n, cap);
  return {kBaseMemory + kMemoryPerByte * n, kBaseValues + kValuesPerByte * n};
}

DType storage_dtype(const std::string& g, const std::string& path, const char* op) {
  std::string_view n = g;
  for (std::string_view prefix : {"torch.cuda.", "torch."}) {
    if (n.substr(0, prefix.size()) == prefix) {
      n.remove_prefix(prefix.size());
      break;
    }
  }
  if (n == "FloatStorage") return kFloat32;
  if (n == "DoubleStorage") return kFloat64;
  if (n == "HalfStorage") return kFloat16;
  if (n == "BFloat16Storage") return kBFloat16;
  if (n == "IntStorage") return kInt32;
  if (n == "LongStorage") return kInt64;
  if (n == "ByteStorage" || n == "storage.UntypedStorage") return kUInt8;
  if (n == "BoolStorage") return kBool;
  const char* torch_dtype = n == "CharStorage"            ? "torch.int8"
                            : n == "ShortStorage"         ? "torch.int16"
                            : n == "ComplexFloatStorage"  ? "torch.complex64"
                            : n == "ComplexDoubleStorage" ? "torch.complex128"
                            : n.find("Q") == 0            ? "a quantized dtype"
                                                          : nullptr;
  ACCEL_CHECK(torch_dtype == nullptr, IoError, op, "'", path, "': a tensor of ", torch_dtype, " (",
              g,
              "); accel has no such dtype (it has float32, float64, float16, bfloat16, int32, "
              "int64, uint8 and bool): convert it in PyTorch before saving");
  ACCEL_THROW(IoError, op, "'", path, "': '", g, "' is not a storage class accel reads");
}

const char* storage_class(DType d) {
  switch (d) {
    case DType::Float32: return "FloatStorage";
    case DType::Float64: return "DoubleStorage";
    case DType::Float16: return "HalfStorage";
    case DType::BFloat16: return "BFloat16Storage";
    case DType::Int32: return "IntStorage";
    case DType::Int64: return "LongStorage";
    case DType::UInt8: return "ByteStorage";
    case DType::Bool: return "BoolStorage";
  }
  return "FloatStorage";
}

// Note [pickling like torch.save]
// torch.save pickles with Python's pickler at protocol 2, storages as persistent ids. Writing the
// same opcodes and memo numbering makes accel's file byte-for-byte torch's (tests/io checks it
// against files torch wrote), which is the strongest evidence that torch loads it. Python's rules:
//   * every str, tuple (not the empty one), list, dict, global and reduced object is memoized
//     (BINPUT n, LONG_BINPUT from 256 on) right after it is built (a tuple after TUPLE*, a list
//     or dict after EMPTY_*, before its items); an object seen again is BINGET n;
//   * ints: BININT1 (0..255), BININT2 (..65535), BININT (int32), else LONG1 with the shortest
//     two's complement; floats BINFLOAT (big-endian); True/False NEWTRUE/NEWFALSE; None NONE;
//   * a tuple of 1-3 items is the items then TUPLE1-3, a longer one MARK items TUPLE;
//   * container items go in batches of 1000 (pickle.Pickler._BATCHSIZE), as CPython's C pickler
//     writes them: a list or plain dict (batch_list_exact / batch_dict_exact) of one item is item
//     APPEND / key value SETITEM, any other is MARK items APPENDS / SETITEMS per batch, even a
//     last batch of one, and a plain dict of 1000 k items ends with an empty MARK SETITEMS; an
//     OrderedDict's items come from an iterator (batch_dict), where a batch of one is SETITEM;
//   * an OrderedDict is GLOBAL collections OrderedDict, EMPTY_TUPLE, REDUCE, then its items, then
//     (if it has attributes) a dict of them and BUILD;
//   * a tensor is _rebuild_tensor_v2 REDUCEd over (storage, offset, size, stride, requires_grad,
//     OrderedDict()), its storage the persistent id ('storage', torch.<Type>Storage, key, 'cpu',
//     numel).
// Sameness is Python object identity there. Here: globals by name; the strings of persistent ids
// ('storage', 'cpu', a storage's key) by value, as torch passes the same objects; other strings
// by value too (torch's dict keys are distinct, its repeated keys such as 'step' are interned
// literals), in a namespace of their own.

namespace {
constexpr size_t kBatch = 1000;  // pickle.Pickler._BATCHSIZE
// The pickle opcodes written, several to a line.
// clang-format off
enum : uint8_t {
  kMARK = '(', kSTOP = '.', kBINFLOAT = 'G', kBININT = 'J', kBININT1 = 'K', kBININT2 = 'M',
  kNONE = 'N', kBINPERSID = 'Q', kREDUCE = 'R', kBINUNICODE = 'X', kEMPTY_LIST = ']', kAPPEND = 'a',
  kBUILD = 'b', kGLOBAL = 'c', kAPPENDS = 'e', kBINGET = 'h', kLONG_BINGET = 'j', kBINPUT = 'q',
  kLONG_BINPUT = 'r', kSETITEM = 's', kTUPLE = 't', kSETITEMS = 'u', kEMPTY_DICT = '}',
  kEMPTY_TUPLE = ')', kPROTO = 0x80, kTUPLE1 = 0x85, kNEWTRUE = 0x88, kNEWFALSE = 0x89,
  kLONG1 = 0x8a,
};
// clang-format on
}  // namespace

// kDict is a plain dict (and an OrderedDict's attribute dict), kOrdered an OrderedDict's items:
// Python batches them differently (Note [pickling like torch.save]).
struct Pickler::Frame {
  enum Kind { kList, kTuple, kDict, kOrdered, kAttrs } kind;
  size_t n;         // items (list, tuple) or pairs (dicts, attributes)
  size_t done = 0;  // values written into it
  size_t per() const { return kind == kList || kind == kTuple ? 1 : 2; }
  // Python's batch_list_exact / batch_dict_exact: one item alone is APPEND / SETITEM, otherwise
  // every batch, even a last batch of one, is MARK ... APPENDS / SETITEMS.
  bool exact() const { return kind == kList || kind == kDict || kind == kAttrs; }
  // Items in the batch that starts at item `idx`.
  size_t batch(size_t idx) const { return std::min(kBatch, n - idx); }
  bool marked(size_t idx) const { return exact() ? n > 1 : batch(idx) > 1; }
};

Pickler::Pickler() {
  op(kPROTO);
  op(2);
}

Pickler::~Pickler() = default;

void Pickler::put_memo() {
  const uint32_t i = memo_size_++;
  if (i < 256) {
    op(kBINPUT);
    op(uint8_t(i));
  } else {
    op(kLONG_BINPUT);
    for (int k = 0; k < 4; ++k) op(uint8_t(i >> (8 * k)));
  }
}

bool Pickler::get_memo(const std::string& key) {
  auto it = memo_.find(key);
  if (it == memo_.end()) {
    memo_.emplace(key, memo_size_);  // the caller writes the object and put_memo()
    return false;
  }
  if (it->second < 256) {
    op(kBINGET);
    op(uint8_t(it->second));
  } else {
    op(kLONG_BINGET);
    for (int k = 0; k < 4; ++k) op(uint8_t(it->second >> (8 * k)));
  }
  return true;
}

void Pickler::global(const std::string& module, const std::string& name) {
  if (get_memo("g:" + module + "." + name)) return;
  op(kGLOBAL);
  out_ += module + "\n" + name + "\n";
  put_memo();
}

// Python's save_long at protocol 2.
static void put_int(std::string& out, int64_t v) {
  if (v >= 0 && v <= 0xff) {
    out.push_back(char(kBININT1));
    out.push_back(char(v));
  } else if (v >= 0 && v <= 0xffff) {
    out.push_back(char(kBININT2));
    out.push_back(char(v & 0xff));
    out.push_back(char(v >> 8));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out.push_back(char(kBININT));
    for (int k = 0; k < 4; ++k) out.push_back(char(uint32_t(int32_t(v)) >> (8 * k)));
  } else {
    // The shortest little-endian two's complement: drop top bytes that only repeat the sign.
    const uint64_t u = uint64_t(v);
    size_t n = 8;
    while (n > 1) {
      const uint8_t top = uint8_t(u >> (8 * (n - 1))), next = uint8_t(u >> (8 * (n - 2)));
      if ((top == 0x00 && !(next & 0x80)) || (top == 0xff && (next & 0x80))) {
        --n;
      } else {
        break;
      }
    }
    out.push_back(char(kLONG1));
    out.push_back(char(n));
    for (size_t k = 0; k < n; ++k) out.push_back(char(u >> (8 * k)));
  }
}

void Pickler::tuple_of(const std::vector<int64_t>& v) {
  if (v.empty()) {
    op(kEMPTY_TUPLE);
    return;
  }
  if (v.size() > 3) op(kMARK);
  for (int64_t x : v) put_int(out_, x);
  op(v.size() > 3 ? uint8_t(kTUPLE) : uint8_t(kTUPLE1 + v.size() - 1));
  put_memo();
}

// Before a value inside a list or dict: a batch of more than one element opens with MARK.
void Pickler::before_value() {
  if (frames_.empty()) {
    ACCEL_CHECK(!top_done_, ValueError, "save_pt", "a pickle holds one value");
    return;
  }
  const Frame& f = frames_.back();
  ACCEL_CHECK(f.done < f.n * f.per(), ValueError, "save_pt", "more values than announced");
  if (f.kind == Frame::kTuple || f.done % f.per() != 0) return;
  const size_t idx = f.done / f.per();
  if (idx % kBatch == 0 && f.marked(idx)) op(kMARK);
}

// After a value: a batch that is complete closes with APPENDS / SETITEMS (APPEND / SETITEM).
void Pickler::item_done() {
  if (frames_.empty()) {
    top_done_ = true;
    return;
  }
  Frame& f = frames_.back();
  ++f.done;
  if (f.kind == Frame::kTuple || f.done % f.per() != 0) return;
  const size_t idx = f.done / f.per();
  if (idx % kBatch != 0 && idx != f.n) return;
  const bool many = f.marked((idx - 1) / kBatch * kBatch);
  if (f.kind == Frame::kList) {
    op(many ? kAPPENDS : kAPPEND);
  } else {
    op(many ? kSETITEMS : kSETITEM);
  }
}

void Pickler::none() {
  before_value();
  op(kNONE);
  item_done();
}

void Pickler::boolean(bool v) {
  before_value();
  op(v ? kNEWTRUE : kNEWFALSE);
  item_done();
}

void Pickler::integer(int64_t v) {
  before_value();
  put_int(out_, v);
  item_done();
}

void Pickler::real(double v) {
  before_value();
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  op(kBINFLOAT);
  for (int k = 7; k >= 0; --k) op(uint8_t(bits >> (8 * k)));
  item_done();
}

void Pickler::put_string(const std::string& ns, const std::string& v) {
  if (get_memo(ns + v)) return;
  op(kBINUNICODE);
  for (int k = 0; k < 4; ++k) op(uint8_t(uint32_t(v.size()) >> (8 * k)));
  out_ += v;
  put_memo();
}

void Pickler::string(const std::string& v) {
  ACCEL_CHECK(v.size() <= UINT32_MAX, ValueError, "save_pt", "a string of ", v.size(), " bytes");
  before_value();
  put_string("u:", v);
  item_done();
}

void Pickler::tensor(const std::string& key, DType dtype, int64_t storage_numel, int64_t offset,
                     const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                     bool requires_grad) {
  before_value();
  global("torch._utils", "_rebuild_tensor_v2");
  op(kMARK);  // the arguments
  op(kMARK);  // the persistent id
  put_string("s:", "storage");
  global("torch", storage_class(dtype));
  put_string("s:", key);
  put_string("s:", "cpu");
  put_int(out_, storage_numel);
  op(kTUPLE);
  put_memo();
  op(kBINPERSID);
  put_int(out_, offset);
  tuple_of(sizes);
  tuple_of(strides);
  op(requires_grad ? kNEWTRUE : kNEWFALSE);
  global("collections", "OrderedDict");  // backward_hooks: OrderedDict()
  op(kEMPTY_TUPLE);
  op(kREDUCE);
  put_memo();
  op(kTUPLE);
  put_memo();
  op(kREDUCE);
  put_memo();
  item_done();
}

void Pickler::begin_list(size_t n) {
  before_value();
  op(kEMPTY_LIST);
  put_memo();
  frames_.push_back({Frame::kList, n});
}

void Pickler::begin_tuple(size_t n) {
  before_value();
  if (n == 0) {
    op(kEMPTY_TUPLE);
  } else if (n > 3) {
    op(kMARK);
  }
  frames_.push_back({Frame::kTuple, n});
}

void Pickler::begin_dict(bool ordered, size_t n) {
  before_value();
  if (ordered) {
    global("collections", "OrderedDict");
    op(kEMPTY_TUPLE);
    op(kREDUCE);
  } else {
    op(kEMPTY_DICT);
  }
  put_memo();
  frames_.push_back({ordered ? Frame::kOrdered : Frame::kDict, n});
}

void Pickler::begin_attrs(size_t n) {
  ACCEL_CHECK(!frames_.empty() && frames_.back().kind == Frame::kOrdered &&
                  frames_.back().done == 2 * frames_.back().n,
              ValueError, "save_pt", "attributes follow a dict's items");
  // The state of OrderedDict.__reduce__: a dict of the attributes, then BUILD.
  op(kEMPTY_DICT);
  put_memo();
  frames_.back() = {Frame::kAttrs, n};
}

void Pickler::end() {
  ACCEL_CHECK(!frames_.empty() && frames_.back().done == frames_.back().n * frames_.back().per(),
              ValueError, "save_pt", "a container closed before all its values were written");
  const Frame f = frames_.back();
  frames_.pop_back();
  if (f.kind == Frame::kTuple && f.n > 0) {
    op(f.n > 3 ? uint8_t(kTUPLE) : uint8_t(kTUPLE1 + f.n - 1));
    put_memo();
  } else if (f.kind == Frame::kAttrs) {
    if (f.n > 0 && f.n % kBatch == 0) empty_batch();
    op(kBUILD);
  } else if (f.kind == Frame::kDict && f.n > 0 && f.n % kBatch == 0) {
    empty_batch();
  }
  item_done();
}

// batch_dict_exact's loop runs again after a full batch: a dict of 1000 k items ends with an
// empty MARK SETITEMS.
void Pickler::empty_batch() {
  op(kMARK);
  op(kSETITEMS);
}

std::string Pickler::finish() {
  ACCEL_CHECK(frames_.empty() && top_done_, ValueError, "save_pt", "an incomplete pickle");
  op(kSTOP);
  return std::move(out_);
}

namespace {

struct Walker {
  const Unpickler& u;
  PickleVisitor& v;
  uint64_t visited = 0;

  [[noreturn]] void too_deep() const {
    ACCEL_THROW(IoError, "load_pt", "'", u.path(), "': the data nests deeper than ", kPtMaxDepth,
                " levels (or contains itself)");
  }
  void walk(const PickleValue& x, int depth) {
    using K = PickleValue::Kind;
    if (depth > kPtMaxDepth) too_deep();
    ACCEL_CHECK(++visited <= u.limits().max_values, IoError, "load_pt", "'", u.path(),
                "': the data holds more than ", u.limits().max_values,
                " values (shared references expanding a small pickle?)");
    switch (x.kind) {
      case K::kNone: v.none(); return;
      case K::kBool: v.boolean(x.i != 0); return;
      case K::kInt: v.integer(x.i); return;
      case K::kFloat: v.real(x.f); return;
      case K::kString: v.string(x.obj->text); return;
      case K::kTensor: v.tensor(*x.obj->tensor, x.obj); return;
      case K::kList:
      case K::kTuple: {
        // Items are read by index: a visitor cannot change the graph, but keep no reference.
        const std::vector<PickleValue>& items = x.obj->items;
        if (x.kind == K::kList) {
          v.begin_list(items.size());
        } else {
          v.begin_tuple(items.size());
        }
        for (size_t k = 0; k < items.size(); ++k) walk(items[k], depth + 1);
        v.end();
        return;
      }
      case K::kDict: {
        const PickleObject& d = *x.obj;
        v.begin_dict(d.ordered, d.items.size() / 2, d.attrs.size() / 2);
        for (const PickleValue& y : d.items) walk(y, depth + 1);
        for (const PickleValue& y : d.attrs) walk(y, depth + 1);
        v.end();
        return;
      }
      case K::kGlobal:
        ACCEL_THROW(IoError, "load_pt", "'", u.path(), "': the data holds the bare global '",
                    x.obj->text,
                    "' (a class or dtype object); accel reads tensors, containers "
                    "and numbers");
      case K::kStorage:
        ACCEL_THROW(IoError, "load_pt", "'", u.path(), "': the data holds storage '", x.obj->text,
                    "' outside a tensor; accel reads tensors");
    }
  }
};

}  // namespace

void walk_pickle(const Unpickler& u, const PickleValue& root, PickleVisitor& v) {
  Walker w{u, v};
  w.walk(root, 0);
}

}  // namespace accel::io::detail
