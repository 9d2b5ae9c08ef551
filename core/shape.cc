#include "core/shape.h"

#include <ostream>
#include <sstream>

#include "core/checked_size.h"
#include "core/error.h"

namespace accel {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t checked_numel(const Shape& s, const char* op) {
  int64_t n = 1;
  bool overflow = false, empty = false;
  for (int64_t d : s) {
    ACCEL_CHECK(d >= 0, ShapeError, op, "negative dimension in shape ", s);
    overflow |= __builtin_mul_overflow(n, d, &n);
    empty |= d == 0;
  }
  if (empty) return 0;  // a zero dimension anywhere: no elements, however large the others
  ACCEL_CHECK(!overflow, ShapeError, op, "shape ", s, " has more elements than an int64 can count");
  return n;
}

size_t checked_nbytes(const Shape& s, size_t elem_size, const char* op) {
  const int64_t n = checked_numel(s, op);
  int64_t bytes = 0;
  ACCEL_CHECK(!__builtin_mul_overflow(n, int64_t(elem_size), &bytes), ShapeError, op, "shape ", s,
              " of ", elem_size, "-byte elements needs more than ", kMaxTensorBytes, " bytes");
  return size_t(bytes);
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
  const int64_t r = std::max<int64_t>(rank, 1);  // a 0-dim tensor accepts dim 0 / -1
  ACCEL_CHECK(dim >= -r && dim < r, IndexError, op, "dimension ", dim,
              " out of range for a tensor of rank ", rank);
  return dim < 0 ? dim + r : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    ACCEL_CHECK(da == db || da == 1 || db == 1, ShapeError, op, "shapes ", a, " and ", b,
                " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool is_broadcastable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t off = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[i + off]) return false;
  return true;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '(';
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) os << ", ";
    os << s[i];
  }
  if (s.size() == 1) os << ',';
  return os << ')';
}

}  // namespace accel
