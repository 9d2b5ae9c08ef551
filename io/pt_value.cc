// io::PtValue (io/torch_format.h): construction, access, lookup, printing.
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <utility>

#include "io/torch_format.h"

namespace accel::io {

namespace {
constexpr const char* kOp = "PtValue";

// tag + body (built in place: GCC 12 warns falsely on "x" + std::string temporaries).
std::string tagged(char tag, std::string_view body) {
  std::string s(1, tag);
  s += body;
  return s;
}

const char* kind_str(PtValue::Kind k) {
  using K = PtValue::Kind;
  switch (k) {
    case K::kNone: return "None";
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kDouble: return "float";
    case K::kString: return "str";
    case K::kTensor: return "Tensor";
    case K::kList: return "list";
    case K::kTuple: return "tuple";
    case K::kDict: return "dict";
  }
  return "?";
}

bool is_number(const PtValue& v) { return v.is_bool() || v.is_int() || v.is_double(); }

// Python's == for the keys dicts hold: numbers by value (1 == 1.0 == True), strings, None, tuples
// item by item.
bool keys_equal(const PtValue& a, const PtValue& b) {
  if (is_number(a) && is_number(b)) {
    if (!a.is_double() && !b.is_double()) return a.to_int() == b.to_int();
    const PtValue& d = a.is_double() ? a : b;
    const PtValue& o = a.is_double() ? b : a;
    if (o.is_double()) return d.to_double() == o.to_double();
    // int vs float: equal only when the float is that integer exactly.
    const double x = d.to_double();
    return std::trunc(x) == x && x >= -9223372036854775808.0 && x < 9223372036854775808.0 &&
           int64_t(x) == o.to_int();
  }
  if (a.kind() != b.kind()) return false;
  if (a.is_none()) return true;
  if (a.is_string()) return a.to_string() == b.to_string();
  if (a.is_tuple()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!keys_equal(a.item(i), b.item(i))) return false;
    return true;
  }
  return false;
}

// A string equal for keys_equal keys (numbers by value), for finding duplicates in bulk.
std::string canonical_key(const PtValue& k) {
  if (k.is_bool() || k.is_int()) return tagged('I', std::to_string(k.to_int()));
  if (k.is_double()) {
    const double x = k.to_double();
    if (std::trunc(x) == x && x >= -9223372036854775808.0 && x < 9223372036854775808.0)
      return tagged('I', std::to_string(int64_t(x)));
    std::ostringstream os;
    os.precision(17);
    os << "F" << x;
    return os.str();
  }
  if (k.is_string()) return tagged('S', k.to_string());
  if (k.is_none()) return "N";
  std::string out = tagged('T', std::to_string(k.size()));  // a tuple (set() checks the key kinds)
  for (const PtValue& x : k.items()) {
    const std::string part = canonical_key(x);
    out += ':';
    out += std::to_string(part.size());
    out += ':';
    out += part;
  }
  return out;
}

void repr_to(std::ostream& os, const PtValue& v) {
  using K = PtValue::Kind;
  switch (v.kind()) {
    case K::kNone: os << "None"; return;
    case K::kBool: os << (v.to_bool() ? "True" : "False"); return;
    case K::kInt: os << v.to_int(); return;
    case K::kDouble: {
      // The shortest text that reads back as the same double, as Python's repr.
      const double x = v.to_double();
      std::string s;
      for (int prec = 1; prec <= 17; ++prec) {
        std::ostringstream d;
        d.precision(prec);
        d << x;
        s = d.str();
        if (std::strtod(s.c_str(), nullptr) == x || std::isnan(x)) break;
      }
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 2 -> 2.0, as Python
      os << s;
      return;
    }
    case K::kString: os << "'" << v.to_string() << "'"; return;
    case K::kTensor: {
      const Tensor& t = v.to_tensor();
      if (!t.defined()) {
        os << "tensor(undefined)";
      } else {
        os << "tensor(" << dtype_name(t.dtype()) << ", " << t.shape_str() << ")";
      }
      return;
    }
    case K::kList:
    case K::kTuple: {
      os << (v.is_list() ? "[" : "(");
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) os << ", ";
        repr_to(os, v.item(i));
      }
      if (v.is_tuple() && v.size() == 1) os << ",";
      os << (v.is_list() ? "]" : ")");
      return;
    }
    case K::kDict: {
      os << (v.ordered() ? "OrderedDict({" : "{");
      bool first = true;
      for (const PtEntry& e : v.entries()) {
        if (!first) os << ", ";
        first = false;
        repr_to(os, e.key);
        os << ": ";
        repr_to(os, e.value);
      }
      os << (v.ordered() ? "})" : "}");
      return;
    }
  }
}
}  // namespace

PtValue::PtValue() = default;
PtValue::PtValue(std::nullptr_t) {}
PtValue::PtValue(bool v) : kind_(Kind::kBool), int_(v) {}
PtValue::PtValue(int v) : kind_(Kind::kInt), int_(v) {}
PtValue::PtValue(int64_t v) : kind_(Kind::kInt), int_(v) {}
PtValue::PtValue(double v) : kind_(Kind::kDouble), double_(v) {}
PtValue::PtValue(std::string v) : kind_(Kind::kString), string_(std::move(v)) {}
PtValue::PtValue(const char* v) : kind_(Kind::kString), string_(v) {}
PtValue::PtValue(Tensor t) : kind_(Kind::kTensor), tensor_(std::move(t)) {}
PtValue::~PtValue() = default;
PtValue::PtValue(const PtValue&) = default;
PtValue::PtValue(PtValue&&) noexcept = default;
PtValue& PtValue::operator=(const PtValue&) = default;
PtValue& PtValue::operator=(PtValue&&) noexcept = default;

PtValue PtValue::list(std::vector<PtValue> items) {
  PtValue v;
  v.kind_ = Kind::kList;
  v.items_ = std::move(items);
  return v;
}

PtValue PtValue::tuple(std::vector<PtValue> items) {
  PtValue v = list(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

PtValue PtValue::dict(std::vector<PtEntry> entries) {
  PtValue v;
  v.kind_ = Kind::kDict;
  std::set<std::string> seen;
  for (const PtEntry& e : entries) {
    check_key(e.key);
    ACCEL_CHECK(seen.insert(canonical_key(e.key)).second, ValueError, kOp, "the key ", e.key.repr(),
                " twice in one dict");
  }
  v.entries_ = std::move(entries);
  return v;
}

PtValue PtValue::ordered_dict(std::vector<PtEntry> entries) {
  PtValue v = dict(std::move(entries));
  v.ordered_ = true;
  return v;
}

PtValue PtValue::dict() { return dict(std::vector<PtEntry>{}); }
PtValue PtValue::ordered_dict() { return ordered_dict(std::vector<PtEntry>{}); }

std::string PtValue::type_name() const {
  return kind_ == Kind::kDict && ordered_ ? "OrderedDict" : kind_str(kind_);
}

void PtValue::expect(Kind k, const char* what) const {
  ACCEL_CHECK(kind_ == k, ValueError, kOp, what, ": the value is a ", type_name(), ", not a ",
              kind_str(k));
}

bool PtValue::to_bool() const {
  expect(Kind::kBool, "to_bool");
  return int_ != 0;
}

int64_t PtValue::to_int() const {
  ACCEL_CHECK(kind_ == Kind::kInt || kind_ == Kind::kBool, ValueError, kOp,
              "to_int: the value is a ", type_name(), ", not an int");
  return int_;
}

double PtValue::to_double() const {
  if (kind_ == Kind::kInt || kind_ == Kind::kBool) return double(int_);
  expect(Kind::kDouble, "to_double");
  return double_;
}

const std::string& PtValue::to_string() const {
  expect(Kind::kString, "to_string");
  return string_;
}

const Tensor& PtValue::to_tensor() const {
  expect(Kind::kTensor, "to_tensor");
  return tensor_;
}

const std::vector<PtValue>& PtValue::items() const {
  ACCEL_CHECK(kind_ == Kind::kList || kind_ == Kind::kTuple, ValueError, kOp,
              "items: the value is a ", type_name(), ", not a list or tuple");
  return items_;
}

std::vector<PtValue>& PtValue::items() {
  std::as_const(*this).items();
  return items_;
}

const PtValue& PtValue::item(size_t i) const {
  const std::vector<PtValue>& it = items();
  ACCEL_CHECK(i < it.size(), IndexError, kOp, "item ", i, " of a ", type_name(), " of ", it.size());
  return it[i];
}

const std::vector<PtEntry>& PtValue::entries() const {
  expect(Kind::kDict, "entries");
  return entries_;
}

std::vector<PtEntry>& PtValue::entries() {
  expect(Kind::kDict, "entries");
  return entries_;
}

bool PtValue::ordered() const {
  expect(Kind::kDict, "ordered");
  return ordered_;
}

const std::vector<PtEntry>& PtValue::attributes() const {
  expect(Kind::kDict, "attributes");
  return attributes_;
}

std::vector<PtEntry>& PtValue::attributes() {
  expect(Kind::kDict, "attributes");
  return attributes_;
}

size_t PtValue::size() const {
  if (kind_ == Kind::kDict) return entries_.size();
  return items().size();
}

const PtValue* PtValue::find(const PtValue& key) const {
  for (const PtEntry& e : entries())
    if (keys_equal(e.key, key)) return &e.value;
  return nullptr;
}

PtValue* PtValue::find(const PtValue& key) {
  return const_cast<PtValue*>(std::as_const(*this).find(key));
}

const PtValue& PtValue::at(const PtValue& key) const {
  const PtValue* v = find(key);
  ACCEL_CHECK(v, ValueError, kOp, "the ", type_name(), " has no key ", key.repr(), " (it has ",
              entries_.size(), " entries)");
  return *v;
}

PtValue& PtValue::set(PtValue key, PtValue value) {
  ACCEL_CHECK(kind_ == Kind::kDict, ValueError, kOp, "set: the value is a ", type_name(),
              ", not a dict");
  check_key(key);
  if (PtValue* v = find(key)) {
    *v = std::move(value);
    return *v;
  }
  entries_.push_back({std::move(key), std::move(value)});
  return entries_.back().value;
}

void PtValue::check_key(const PtValue& key) {
  bool ok = key.is_none() || is_number(key) || key.is_string();
  if (key.is_tuple()) {
    ok = true;
    for (const PtValue& x : key.items_) ok = ok && (x.is_none() || is_number(x) || x.is_string());
  }
  ACCEL_CHECK(ok, ValueError, kOp, "a dict key of type ", key.type_name(),
              " (keys are None, bool, int, float, str or tuples of those)");
}

std::string PtValue::repr() const {
  std::ostringstream os;
  repr_to(os, *this);
  return os.str();
}

}  // namespace accel::io
