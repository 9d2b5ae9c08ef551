#include "io/torch_pickle.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace accel::io::detail {

// Note [restricted unpickler]
// A torch.save file is a pickle, and a pickle is a program: the stock unpickler imports and calls
// whatever the file names (os.system included). torch's weights_only=True unpickler
// (torch/_weights_only_unpickler.py) runs none of that: GLOBAL resolves only names of an
// allow-list (collections.OrderedDict, torch.nn.parameter.Parameter, torch.Size, torch.Tensor,
// torch.serialization._get_layout, the dtypes, the tensor and storage classes, the
// torch._utils._rebuild_* functions), REDUCE calls only those, BUILD only sets up Tensor,
// Parameter and OrderedDict, APPEND(S) only extends lists, and every other opcode is refused.
// This unpickler accepts the same opcodes (torch 1.13's list: PROTO, STOP, MARK, the memo ops
// BINPUT / LONG_BINPUT / BINGET / LONG_BINGET, NONE, NEWTRUE, NEWFALSE, BININT, BININT1, BININT2,
// LONG1, BINUNICODE, SHORT_BINSTRING, EMPTY_TUPLE, TUPLE, TUPLE1-3, EMPTY_LIST, APPEND, APPENDS,
// EMPTY_DICT, SETITEM, SETITEMS, EMPTY_SET, GLOBAL, REDUCE, BUILD, NEWOBJ, BINPERSID) plus
// BINFLOAT, which 1.13 lacks but later torch accepts and every optimizer state_dict needs (its
// learning rates). Of what those can build, it keeps what accel has a value for, and refuses the
// rest by name: REDUCE of OrderedDict() (an empty OrderedDict), _rebuild_tensor_v2,
// _rebuild_tensor, _rebuild_parameter and torch.Size; BUILD of an OrderedDict's attributes
// (torch's state_dict._metadata); persistent ids of storages only. Sparse, quantized, complex,
// int8/int16 tensors, sets, NEWOBJ and bare globals in the data are refused with an IoError
// saying so. Nothing is ever imported, called or executed: the result is a graph of plain values.
//
// A hostile pickle cannot crash it, exhaust memory or time:
//   * every read is checked against the bytes left (a length field of 4 GiB over a 1 KiB file is
//     an error before any allocation), the stack and memo are checked before every use;
//   * what the arena holds (objects, strings, items, memo entries) is charged against
//     PickleLimits::max_memory_bytes, 64 MiB + 64x the pickle's size: a valid pickle needs about
//     20x;
//   * integers must fit int64, strings must be valid UTF-8, dict keys must be scalars or short
//     flat tuples of scalars (torch writes ints and strings) and are indexed, so a SETITEMS of
//     n pairs costs O(n);
//   * the graph may share nodes (memo references) and even contain cycles, so whoever reads the
//     result walks it with walk_pickle: at most kPtMaxDepth deep (a cycle is too deep) and
//     PickleLimits::max_values values in all, so memo references cannot expand a small file into
//     an exponentially large tree;
//   * a tensor's geometry is checked against its storage when it is built: non-negative sizes
//     and strides, at most kPtMaxRank dimensions, element counts and the last element's index
//     computed with overflow checks and inside the storage's numel; storages of one key agree on
//     dtype and numel.

namespace {

// The pickle opcodes read, several to a line.
// clang-format off
enum Op : uint8_t {
  kMARK = '(', kSTOP = '.', kBINFLOAT = 'G', kBININT = 'J', kBININT1 = 'K', kBININT2 = 'M',
  kNONE = 'N', kBINPERSID = 'Q', kREDUCE = 'R', kSHORT_BINSTRING = 'U', kBINUNICODE = 'X',
  kEMPTY_LIST = ']', kAPPEND = 'a', kBUILD = 'b', kGLOBAL = 'c', kAPPENDS = 'e', kBINGET = 'h',
  kLONG_BINGET = 'j', kBINPUT = 'q', kLONG_BINPUT = 'r', kSETITEM = 's', kTUPLE = 't',
  kSETITEMS = 'u', kEMPTY_DICT = '}', kEMPTY_TUPLE = ')', kPROTO = 0x80, kNEWOBJ = 0x81,
  kTUPLE1 = 0x85, kTUPLE2 = 0x86, kTUPLE3 = 0x87, kNEWTRUE = 0x88, kNEWFALSE = 0x89, kLONG1 = 0x8a,
  kEMPTY_SET = 0x8f,
};
// clang-format on

// torch 1.13's _get_allowed_globals(), sorted.
// Several names to a line (one per line would double the file).
// clang-format off
constexpr std::string_view kAllowedGlobals[] = {
    "collections.OrderedDict", "torch.BFloat16Storage", "torch.BFloat16Tensor", "torch.BoolStorage",
    "torch.BoolTensor", "torch.ByteStorage", "torch.ByteTensor", "torch.CharStorage",
    "torch.CharTensor", "torch.ComplexDoubleStorage", "torch.ComplexFloatStorage",
    "torch.DoubleStorage", "torch.DoubleTensor", "torch.FloatStorage", "torch.FloatTensor",
    "torch.HalfStorage", "torch.HalfTensor", "torch.IntStorage", "torch.IntTensor",
    "torch.LongStorage", "torch.LongTensor", "torch.QInt32Storage", "torch.QInt8Storage",
    "torch.QUInt2x4Storage", "torch.QUInt4x2Storage", "torch.QUInt8Storage", "torch.ShortStorage",
    "torch.ShortTensor", "torch.Size", "torch.Tensor",
    "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_sparse_csr_tensor", "torch._utils._rebuild_sparse_tensor",
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch.complex128",
    "torch.complex32", "torch.complex64", "torch.cuda.BFloat16Storage", "torch.cuda.BFloat16Tensor",
    "torch.cuda.BoolStorage", "torch.cuda.BoolTensor", "torch.cuda.ByteStorage",
    "torch.cuda.ByteTensor", "torch.cuda.CharStorage", "torch.cuda.CharTensor",
    "torch.cuda.ComplexDoubleStorage", "torch.cuda.ComplexFloatStorage", "torch.cuda.DoubleStorage",
    "torch.cuda.DoubleTensor", "torch.cuda.FloatStorage", "torch.cuda.FloatTensor",
    "torch.cuda.HalfStorage", "torch.cuda.HalfTensor", "torch.cuda.IntStorage",
    "torch.cuda.IntTensor", "torch.cuda.LongStorage", "torch.cuda.LongTensor",
    "torch.cuda.ShortStorage", "torch.cuda.ShortTensor", "torch.cuda.sparse.BFloat16Tensor",
    "torch.cuda.sparse.ByteTensor", "torch.cuda.sparse.CharTensor", "torch.cuda.sparse.DoubleTensor",
    "torch.cuda.sparse.FloatTensor", "torch.cuda.sparse.HalfTensor", "torch.cuda.sparse.IntTensor",
    "torch.cuda.sparse.LongTensor", "torch.cuda.sparse.ShortTensor", "torch.float16",
    "torch.float32", "torch.float64", "torch.int16", "torch.int32", "torch.int64", "torch.int8",
    "torch.nn.parameter.Parameter", "torch.serialization._get_layout", "torch.sparse.BFloat16Tensor",
    "torch.sparse.ByteTensor", "torch.sparse.CharTensor", "torch.sparse.DoubleTensor",
    "torch.sparse.FloatTensor", "torch.sparse.HalfTensor", "torch.sparse.IntTensor",
    "torch.sparse.LongTensor", "torch.sparse.ShortTensor", "torch.storage.TypedStorage",
    "torch.storage.UntypedStorage",
};
// clang-format on

bool allowed_global(std::string_view name) {
  return std::find(std::begin(kAllowedGlobals), std::end(kAllowedGlobals), name) !=
         std::end(kAllowedGlobals);
}

// Bytes per value kept in the arena (PickleValue plus allocator slack).
constexpr uint64_t kValueCost = sizeof(PickleValue);
// An object, its allocation and bookkeeping.
constexpr uint64_t kObjectCost = sizeof(PickleObject) + 32;
// An index or memo entry (hash node, key).
constexpr uint64_t kEntryCost = 64;
// Items of a tuple used as a dict key.
constexpr size_t kMaxKeyItems = 16;
// Bytes read ahead from the source at a time.
constexpr size_t kReadBlock = size_t(64) << 10;

const char* kind_name(PickleValue::Kind k) {
  using K = PickleValue::Kind;
  switch (k) {
    case K::kNone: return "None";
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kFloat: return "float";
    case K::kString: return "str";
    case K::kList: return "list";
    case K::kTuple: return "tuple";
    case K::kDict: return "dict";
    case K::kTensor: return "Tensor";
    case K::kGlobal: return "global";
    case K::kStorage: return "storage";
  }
  return "?";
}

const char* op_name(uint8_t c) {
  switch (c) {
    case 'i': return "INST (builds an object of any class)";
    case 'o': return "OBJ (builds an object of any class)";
    case 0x93: return "STACK_GLOBAL (protocol 4 import)";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'I': return "INT (text protocol)";
    case 'L': return "LONG (text protocol)";
    case 'F': return "FLOAT (text protocol)";
    case 'S': return "STRING (text protocol)";
    case 'V': return "UNICODE (text protocol)";
    case 0x8c: return "SHORT_BINUNICODE (protocol 4)";
    case 0x95: return "FRAME (protocol 4)";
    case 0x94: return "MEMOIZE (protocol 4)";
    case 0x8b: return "LONG4";
    case 'B': return "BINBYTES (protocol 3)";
    case 'C': return "SHORT_BINBYTES (protocol 3)";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'g': return "GET (text protocol)";
    case 'p': return "PUT (text protocol)";
    case 'l': return "LIST";
    case 'd': return "DICT";
    case 0x82:
    case 0x83:
    case 0x84: return "EXT (extension registry import)";
    default: return "unknown";
  }
}

// UTF-8 as Python decodes it ("strict"; with surrogates, "surrogatepass").
bool valid_utf8(std::string_view s, bool allow_surrogates) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i - 1 < n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) return false;
    if (!allow_surrogates && cp >= 0xd800 && cp <= 0xdfff) return false;
    i += n + 1;
  }
  return true;
}

// tag + body (built in place: GCC 12 warns falsely on "x" + std::string temporaries).
std::string tagged(char tag, std::string_view body) {
  std::string s(1, tag);
  s += body;
  return s;
}

bool mul_overflow(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflow(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

}  // namespace

// One load(): the opcode loop over a bounded reader, with the stack, marks and memo.
class Unpickler::Run {
 public:
  Run(Unpickler& u, const ByteSource& src, uint64_t begin, uint64_t end, const std::string& what)
      : u_(u), src_(src), pos_(begin), begin_(begin), end_(end), what_(what) {}

  PickleValue run(uint64_t* consumed);

 private:
  using K = PickleValue::Kind;
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    ACCEL_THROW(IoError, "load_pt", "'", u_.path_, "': ", what_, ", offset ", op_at_ - begin_, ": ",
                args...);
  }
  const unsigned char* need(size_t n);
  std::string line();
  void charge(uint64_t bytes) {
    u_.memory_ += bytes;
    if (u_.memory_ > u_.limits_.max_memory_bytes)
      fail("unpickling needs more than ", u_.limits_.max_memory_bytes,
           " bytes of memory; the pickle is hostile or corrupt");
  }
  PickleObject* make(K kind) {
    charge(kObjectCost);
    u_.arena_.push_back(std::make_unique<PickleObject>());
    PickleObject* o = u_.arena_.back().get();
    o->kind = kind;
    return o;
  }
  PickleValue value_of(PickleObject* o) {
    PickleValue v;
    v.kind = o->kind;
    v.obj = o;
    return v;
  }
  void push(PickleValue v) { stack_.push_back(v); }
  PickleValue pop() {
    if (stack_.size() <= floor()) fail("the pickle stack is empty");
    PickleValue v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PickleValue& top() {
    if (stack_.size() <= floor()) fail("the pickle stack is empty");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The values pushed since the last MARK, which is removed.
  std::vector<PickleValue> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PickleValue> items(stack_.begin() + std::ptrdiff_t(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  std::string key_of(const PickleValue& k, bool in_tuple = false);
  void set_item(PickleValue& dict, const PickleValue& k, const PickleValue& v);
  void check_tensor_geometry(TensorRecord& t, const PickleValue& size, const PickleValue& stride,
                             const StorageInfo& s);
  PickleValue reduce(const PickleValue& func, const PickleValue& args);
  PickleValue persistent(const PickleValue& pid);
  PickleValue make_tuple(std::vector<PickleValue> items) {
    PickleObject* t = make(K::kTuple);
    charge(items.size() * kValueCost);
    t->items = std::move(items);
    return value_of(t);
  }
  PickleValue make_string(std::string_view s, bool allow_surrogates) {
    if (!valid_utf8(s, allow_surrogates)) fail("a string that is not valid UTF-8");
    PickleObject* o = make(K::kString);
    charge(s.size());
    o->text.assign(s);
    return value_of(o);
  }
  const std::string& as_string(const PickleValue& v, const char* what) {
    if (v.kind != K::kString) fail(what, " must be a str, got ", kind_name(v.kind));
    return v.obj->text;
  }
  int64_t as_int(const PickleValue& v, const char* what) {
    if (v.kind != K::kInt) fail(what, " must be an int, got ", kind_name(v.kind));
    return v.i;
  }

  Unpickler& u_;
  const ByteSource& src_;
  uint64_t pos_, begin_, end_, op_at_ = 0;
  const std::string& what_;
  std::string buf_;  // bytes [buf_at_, buf_at_ + buf_.size()) of the source
  uint64_t buf_at_ = 0;
  std::vector<PickleValue> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, PickleValue> memo_;
};

const unsigned char* Unpickler::Run::need(size_t n) {
  if (n > end_ - pos_) fail("the pickle ends in the middle of an opcode (truncated?)");
  if (pos_ < buf_at_ || pos_ + n > buf_at_ + buf_.size()) {
    // Refill: at least n bytes, read ahead a block (never past end_).
    const uint64_t len = std::min<uint64_t>(end_ - pos_, std::max<uint64_t>(n, kReadBlock));
    buf_.resize(size_t(len));
    buf_at_ = pos_;
    if (!src_.read(buf_.data(), buf_.size(), pos_))
      fail("cannot read the pickle: ",
           errno ? std::strerror(errno) : "unexpected end of file (did it change while read?)");
  }
  const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + (pos_ - buf_at_));
  pos_ += n;
  return p;
}

std::string Unpickler::Run::line() {
  // A GLOBAL's "module\n" or "name\n": bounded by the bytes left and by a sane name length.
  constexpr size_t kMaxLine = 256;
  std::string s;
  while (true) {
    const char c = char(*need(1));
    if (c == '\n') break;
    if (s.size() >= kMaxLine) fail("a GLOBAL name longer than ", kMaxLine, " bytes");
    s.push_back(c);
  }
  return s;
}

// Python dict semantics for the keys torch writes: equal keys (1, 1.0 and True are one key) share
// one entry; the encoding is unambiguous (tuple items are length-prefixed).
std::string Unpickler::Run::key_of(const PickleValue& k, bool in_tuple) {
  switch (k.kind) {
    case K::kNone: return "N";
    case K::kBool:
    case K::kInt: return tagged('I', std::to_string(k.i));
    case K::kFloat: {
      constexpr double kTwo63 = 9223372036854775808.0;
      if (k.f >= -kTwo63 && k.f < kTwo63 && k.f == std::trunc(k.f))
        return tagged('I', std::to_string(int64_t(k.f)));
      uint64_t bits;
      std::memcpy(&bits, &k.f, sizeof bits);
      return tagged('F', std::to_string(bits));
    }
    case K::kString: return tagged('S', k.obj->text);
    case K::kTuple:
      if (!in_tuple && k.obj->items.size() <= kMaxKeyItems) {
        std::string out = tagged('T', std::to_string(k.obj->items.size()));
        for (const PickleValue& x : k.obj->items) {
          const std::string part = key_of(x, true);
          out += ':';
          out += std::to_string(part.size());
          out += ':';
          out += part;
        }
        return out;
      }
      break;
    default: break;
  }
  fail(
      "a dict key of type ", kind_name(k.kind),
      "; accel reads dict keys that are None, bool, int, float, str or short flat tuples of those");
}

void Unpickler::Run::set_item(PickleValue& dict, const PickleValue& k, const PickleValue& v) {
  if (dict.kind != K::kDict)
    fail("SETITEM(S) on a ", kind_name(dict.kind), "; only dicts take items");
  PickleObject* d = dict.obj;
  std::string key = key_of(k);
  if (!d->index) d->index = std::make_unique<std::unordered_map<std::string, size_t>>();
  auto it = d->index->find(key);
  if (it != d->index->end()) {
    d->items[it->second + 1] = v;  // Python keeps the first key and its place
    return;
  }
  charge(2 * kValueCost + kEntryCost + key.size());
  d->index->emplace(std::move(key), d->items.size());
  d->items.push_back(k);
  d->items.push_back(v);
}

PickleValue Unpickler::Run::persistent(const PickleValue& pid) {
  // torch.serialization's persistent_load: ('storage', class, key, location, numel) in a zip
  // archive, the legacy format adds a view (None since torch 1.0).
  const size_t arity = u_.legacy_ ? 6 : 5;
  if (pid.kind != K::kTuple)
    fail("a persistent id that is a ", kind_name(pid.kind), ", not a tuple");
  const std::vector<PickleValue>& f = pid.obj->items;
  if (f.empty() || f[0].kind != K::kString || f[0].obj->text != "storage")
    fail("a persistent id that is not a storage; only storages are loaded");
  if (f.size() != arity)
    fail("a storage persistent id of ", f.size(), " fields (expected ", arity, ")");
  if (f[1].kind != K::kGlobal) fail("a storage whose class is a ", kind_name(f[1].kind));
  const DType dtype = storage_dtype(f[1].obj->text, u_.path_, "load_pt");
  const std::string& key = as_string(f[2], "a storage key");
  as_string(f[3], "a storage location");
  const int64_t numel = as_int(f[4], "a storage's element count");
  int64_t nbytes;
  if (numel < 0 || mul_overflow(numel, int64_t(dtype_size(dtype)), &nbytes))
    fail("storage '", key, "' of ", numel, " elements");
  if (u_.legacy_ && f[5].kind != K::kNone)
    fail("storage '", key,
         "' is a view of another storage (files of torch before 1.0); "
         "load and save it with a newer PyTorch first");
  auto [it, added] = u_.storages_.emplace(key, StorageInfo{dtype, numel});
  if (!added && (it->second.dtype != dtype || it->second.numel != numel))
    fail("storage '", key, "' is referenced as ", numel, " ", dtype_name(dtype),
         " elements and as ", it->second.numel, " ", dtype_name(it->second.dtype), " elements");
  if (added) charge(kEntryCost + key.size());
  PickleObject* s = make(K::kStorage);
  s->text = key;
  charge(key.size());
  return value_of(s);
}

void Unpickler::Run::check_tensor_geometry(TensorRecord& t, const PickleValue& size,
                                           const PickleValue& stride, const StorageInfo& s) {
  if (size.kind != K::kTuple || stride.kind != K::kTuple)
    fail("a tensor whose size and stride are a ", kind_name(size.kind), " and a ",
         kind_name(stride.kind), ", not tuples");
  const auto& sz = size.obj->items;
  const auto& st = stride.obj->items;
  if (sz.size() != st.size() || sz.size() > kPtMaxRank)
    fail("a tensor of ", sz.size(), " sizes and ", st.size(), " strides (at most ", kPtMaxRank,
         " dimensions)");
  charge(2 * sz.size() * sizeof(int64_t));
  int64_t numel = 1, last = t.offset;
  for (size_t d = 0; d < sz.size(); ++d) {
    const int64_t n = as_int(sz[d], "a tensor size"), k = as_int(st[d], "a tensor stride");
    if (n < 0 || k < 0) fail("a tensor with size ", n, " and stride ", k, " in dimension ", d);
    t.sizes.push_back(n);
    t.strides.push_back(k);
    if (mul_overflow(numel, n, &numel)) fail("a tensor of more than 2^63 elements");
  }
  if (t.offset < 0) fail("a tensor at storage offset ", t.offset);
  if (numel == 0) {
    if (t.offset > s.numel)
      fail("an empty tensor at offset ", t.offset, " of storage '", t.storage_key, "' of ", s.numel,
           " elements");
    return;
  }
  for (size_t d = 0; d < sz.size(); ++d) {
    int64_t span;
    if (mul_overflow(t.sizes[d] - 1, t.strides[d], &span) || add_overflow(last, span, &last))
      fail("a tensor whose last element lies beyond 2^63");
  }
  if (last >= s.numel)
    fail("a tensor (offset ", t.offset, ", ", sz.size(), " dimensions) reaches element ", last,
         " of storage '", t.storage_key, "', which holds ", s.numel,
         " elements: the storage is smaller than the tensor's view needs");
}

PickleValue Unpickler::Run::reduce(const PickleValue& func, const PickleValue& args) {
  if (func.kind != K::kGlobal) fail("REDUCE calls a ", kind_name(func.kind), ", not a global");
  if (args.kind != K::kTuple) fail("REDUCE with arguments that are a ", kind_name(args.kind));
  const std::string& name = func.obj->text;
  const std::vector<PickleValue>& a = args.obj->items;
  if (name == "collections.OrderedDict") {
    if (!a.empty()) fail("OrderedDict(...) with arguments; torch writes OrderedDict()");
    PickleObject* d = make(K::kDict);
    d->ordered = true;
    return value_of(d);
  }
  if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
    // (storage, offset, size, stride[, requires_grad, backward_hooks[, metadata]])
    const bool v2 = name == "torch._utils._rebuild_tensor_v2";
    const bool arity_ok = v2 ? (a.size() == 6 || a.size() == 7) : a.size() == 4;
    if (!arity_ok) fail(name, " with ", a.size(), " arguments");
    if (a[0].kind != K::kStorage) fail(name, " of a ", kind_name(a[0].kind), ", not a storage");
    PickleObject* o = make(K::kTensor);
    o->tensor = std::make_unique<TensorRecord>();
    TensorRecord& t = *o->tensor;
    t.storage_key = a[0].obj->text;
    const StorageInfo& s = u_.storages_.at(t.storage_key);
    t.dtype = s.dtype;
    t.offset = as_int(a[1], "a tensor's storage offset");
    charge(t.storage_key.size());
    check_tensor_geometry(t, a[2], a[3], s);
    if (v2) {
      if (a[4].kind != K::kBool) fail("requires_grad that is a ", kind_name(a[4].kind));
      t.requires_grad = a[4].i != 0;
      if (a[5].kind != K::kDict) fail("backward hooks that are a ", kind_name(a[5].kind));
      if (a.size() == 7 && (a[6].kind != K::kDict || !a[6].obj->items.empty()))
        fail(
            "a tensor with metadata (torch's conjugate / negative bits?); accel reads plain "
            "tensors");
    }
    return value_of(o);
  }
  if (name == "torch._utils._rebuild_parameter") {
    // (data, requires_grad, backward_hooks): a Parameter viewing data's storage.
    if (a.size() != 3 || a[0].kind != K::kTensor || a[1].kind != K::kBool)
      fail("_rebuild_parameter takes (tensor, bool, hooks)");
    PickleObject* o = make(K::kTensor);
    o->tensor = std::make_unique<TensorRecord>(*a[0].obj->tensor);
    o->tensor->requires_grad = a[1].i != 0;
    charge(o->tensor->storage_key.size() + 2 * o->tensor->sizes.size() * sizeof(int64_t));
    return value_of(o);
  }
  if (name == "torch.Size") {
    if (a.size() != 1 || (a[0].kind != K::kTuple && a[0].kind != K::kList))
      fail("torch.Size takes one tuple of ints");
    for (const PickleValue& x : a[0].obj->items) as_int(x, "a torch.Size entry");
    return make_tuple(a[0].obj->items);
  }
  if (name.find("sparse") != std::string::npos || name == "torch.serialization._get_layout")
    fail("a sparse tensor (", name, "); accel reads dense tensors");
  if (name == "torch._utils._rebuild_meta_tensor_no_storage")
    fail("a meta tensor (no data); accel reads tensors with data");
  fail("calling ", name,
       " is not supported (torch.save writes it only for objects accel has no "
       "value for)");
}

PickleValue Unpickler::Run::run(uint64_t* consumed) {
  while (true) {
    op_at_ = pos_;
    const uint8_t c = *need(1);
    switch (c) {
      case kPROTO: {
        const uint8_t v = *need(1);
        if (v > 5) fail("pickle protocol ", int(v));
        break;
      }
      case kSTOP: {
        PickleValue v = pop();
        if (!marks_.empty() || !stack_.empty())
          fail("the pickle stops with ", stack_.size(), " values and ", marks_.size(),
               " marks left over");
        if (consumed) {
          *consumed = pos_ - begin_;
        } else if (pos_ != end_) {
          fail(end_ - pos_, " bytes after the end of the pickle");
        }
        return v;
      }
      case kMARK: marks_.push_back(stack_.size()); break;
      case kNONE: push(PickleValue{}); break;
      case kNEWTRUE:
      case kNEWFALSE: {
        PickleValue v;
        v.kind = K::kBool;
        v.i = c == kNEWTRUE;
        push(v);
        break;
      }
      case kBININT:
      case kBININT1:
      case kBININT2: {
        const size_t n = c == kBININT ? 4 : c == kBININT1 ? 1 : 2;
        const unsigned char* p = need(n);
        uint32_t u = 0;
        for (size_t k = 0; k < n; ++k) u |= uint32_t(p[k]) << (8 * k);
        PickleValue v;
        v.kind = K::kInt;
        v.i = c == kBININT ? int64_t(int32_t(u)) : int64_t(u);
        push(v);
        break;
      }
      case kLONG1: {
        const size_t n = *need(1);
        const unsigned char* p = need(n);
        uint64_t u = 0;
        for (size_t k = 0; k < n && k < 8; ++k) u |= uint64_t(p[k]) << (8 * k);
        if (n > 0 && n < 8 && (p[n - 1] & 0x80)) u |= ~uint64_t(0) << (8 * n);  // sign-extend
        for (size_t k = 8; k < n; ++k) {
          if (p[k] != ((p[7] & 0x80) ? 0xff : 0x00)) fail("an integer that does not fit 64 bits");
        }
        PickleValue v;
        v.kind = K::kInt;
        v.i = int64_t(u);
        push(v);
        break;
      }
      case kBINFLOAT: {
        const unsigned char* p = need(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];  // big-endian
        PickleValue v;
        v.kind = K::kFloat;
        std::memcpy(&v.f, &bits, sizeof bits);
        push(v);
        break;
      }
      case kBINUNICODE: {
        const unsigned char* p = need(4);
        const uint32_t n = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) |
                           (uint32_t(p[3]) << 24);
        const auto* s = reinterpret_cast<const char*>(need(n));
        push(make_string(std::string_view(s, n), true));
        break;
      }
      case kSHORT_BINSTRING: {
        const size_t n = *need(1);
        const auto* s = reinterpret_cast<const char*>(need(n));
        push(make_string(std::string_view(s, n), false));
        break;
      }
      case kEMPTY_TUPLE:
        if (!u_.empty_tuple_) u_.empty_tuple_ = make(K::kTuple);
        push(value_of(u_.empty_tuple_));
        break;
      case kTUPLE: push(make_tuple(pop_mark())); break;
      case kTUPLE1:
      case kTUPLE2:
      case kTUPLE3: {
        const size_t n = size_t(c - kTUPLE1 + 1);
        if (stack_.size() < floor() + n) fail("the pickle stack is empty");
        std::vector<PickleValue> items(stack_.end() - std::ptrdiff_t(n), stack_.end());
        stack_.resize(stack_.size() - n);
        push(make_tuple(std::move(items)));
        break;
      }
      case kEMPTY_LIST: push(value_of(make(K::kList))); break;
      case kEMPTY_DICT: push(value_of(make(K::kDict))); break;
      case kAPPEND:
      case kAPPENDS: {
        std::vector<PickleValue> items;
        if (c == kAPPEND) {
          items.push_back(pop());
        } else {
          items = pop_mark();
        }
        PickleValue& l = top();
        if (l.kind != K::kList)
          fail("APPEND(S) to a ", kind_name(l.kind), "; only lists are extended");
        charge(items.size() * kValueCost);
        l.obj->items.insert(l.obj->items.end(), items.begin(), items.end());
        break;
      }
      case kSETITEM: {
        const PickleValue v = pop(), k = pop();
        set_item(top(), k, v);
        break;
      }
      case kSETITEMS: {
        const std::vector<PickleValue> items = pop_mark();
        if (items.size() % 2) fail("SETITEMS with an odd number of values");
        PickleValue& d = top();
        for (size_t k = 0; k < items.size(); k += 2) set_item(d, items[k], items[k + 1]);
        break;
      }
      case kBINPUT:
      case kLONG_BINPUT: {
        const unsigned char* p = need(c == kBINPUT ? 1 : 4);
        const uint32_t idx = c == kBINPUT ? p[0]
                                          : uint32_t(p[0]) | (uint32_t(p[1]) << 8) |
                                                (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
        if (memo_.insert_or_assign(idx, top()).second) charge(kEntryCost);
        break;
      }
      case kBINGET:
      case kLONG_BINGET: {
        const unsigned char* p = need(c == kBINGET ? 1 : 4);
        const uint32_t idx = c == kBINGET ? p[0]
                                          : uint32_t(p[0]) | (uint32_t(p[1]) << 8) |
                                                (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
        auto it = memo_.find(idx);
        if (it == memo_.end()) fail("memo entry ", idx, " is read before it is written");
        push(it->second);
        break;
      }
      case kGLOBAL: {
        const std::string module = line();
        const std::string name = line();
        const std::string full = module + "." + name;
        if (!allowed_global(full))
          fail("the global '", full,
               "' is not allowed: loading it would import and run code "
               "(torch's weights_only=True unpickler refuses it too); only tensors, containers "
               "and numbers are read");
        PickleObject* g = make(K::kGlobal);
        charge(full.size());
        g->text = full;
        push(value_of(g));
        break;
      }
      case kREDUCE: {
        const PickleValue args = pop(), func = pop();
        push(reduce(func, args));
        break;
      }
      case kBINPERSID: {
        const PickleValue pid = pop();
        push(persistent(pid));
        break;
      }
      case kBUILD: {
        // Only an OrderedDict's attributes (state_dict._metadata): inst.__dict__.update(state).
        const PickleValue state = pop();
        PickleValue& inst = top();
        if (inst.kind != K::kDict || !inst.obj->ordered)
          fail("BUILD of a ", kind_name(inst.kind),
               "; accel sets attributes of OrderedDicts only (torch's state_dict._metadata)");
        if (state.kind != K::kDict) fail("BUILD with a state that is a ", kind_name(state.kind));
        std::vector<PickleValue>& attrs = inst.obj->attrs;
        const std::vector<PickleValue>& kv = state.obj->items;
        for (size_t k = 0; k < kv.size(); k += 2) {
          const std::string& n = as_string(kv[k], "an attribute name");
          size_t at = 0;
          while (at < attrs.size() && attrs[at].obj->text != n) at += 2;
          if (at < attrs.size()) {
            attrs[at + 1] = kv[k + 1];
          } else {
            charge(2 * kValueCost);
            attrs.push_back(kv[k]);
            attrs.push_back(kv[k + 1]);
          }
        }
        break;
      }
      case kNEWOBJ:
        fail(
            "NEWOBJ (building an object of a class); torch.save writes tensors and parameters "
            "with REDUCE, and accel reads nothing else");
      case kEMPTY_SET: fail("a set; accel has no value for sets");
      default:
        fail("opcode 0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15], " (", op_name(c),
             ") is not allowed (torch's weights_only=True unpickler refuses it too)");
    }
  }
}

Unpickler::Unpickler(std::string path, bool legacy, PickleLimits limits)
    : path_(std::move(path)), legacy_(legacy), limits_(limits) {}

Unpickler::~Unpickler() = default;

PickleValue Unpickler::load(const ByteSource& src, uint64_t begin, uint64_t end,
                            const std::string& what, uint64_t* consumed) {
  ACCEL_CHECK(begin <= end && end <= src.size, IoError, "load_pt", "'", path_, "': ", what,
              " lies outside the file");
  Run r(*this, src, begin, end, what);
  return r.run(consumed);
}

}  // namespace accel::io::detail
