// Shapes and strides: a small vector of int64 with inline room for kInlineDims dims, so that
// shape arithmetic on the hot path never touches the heap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

namespace accel {

template <typename T, size_t N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVec() = default;
  explicit SmallVec(size_t n, T v = T()) { assign(n, v); }
  SmallVec(std::initializer_list<T> il) { assign(il.begin(), il.end()); }
  SmallVec(const T* b, const T* e) { assign(b, e); }
  SmallVec(std::span<const T> s) { assign(s.data(), s.data() + s.size()); }     // NOLINT
  SmallVec(const std::vector<T>& v) { assign(v.data(), v.data() + v.size()); }  // NOLINT
  SmallVec(const SmallVec& o) { copy_from(o); }
  SmallVec(SmallVec&& o) noexcept { move_from(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) copy_from(o);
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) {
      release();
      move_from(o);
    }
    return *this;
  }
  ~SmallVec() { release(); }

  void assign(size_t n, T v) {
    size_ = 0;
    reserve(n);
    std::fill(data_, data_ + n, v);
    size_ = n;
  }
  void assign(const T* b, const T* e) {
    size_t n = size_t(e - b);
    size_ = 0;
    reserve(n);
    if (n) std::memmove(data_, b, n * sizeof(T));
    size_ = n;
  }
  void reserve(size_t n) {
    if (n <= cap_) return;
    size_t nc = std::max(n, cap_ * 2);
    T* nd = static_cast<T*>(::operator new(nc * sizeof(T)));
    if (size_) std::memcpy(nd, data_, size_ * sizeof(T));
    if (data_ != inline_) ::operator delete(data_);
    data_ = nd;
    cap_ = nc;
  }
  void resize(size_t n, T v = T()) {
    reserve(n);
    if (n > size_) std::fill(data_ + size_, data_ + n, v);
    size_ = n;
  }
  void push_back(T v) {
    if (size_ == cap_) reserve(size_ + 1);
    data_[size_++] = v;
  }
  void pop_back() { --size_; }
  void insert(size_t pos, T v) {
    reserve(size_ + 1);
    std::memmove(data_ + pos + 1, data_ + pos, (size_ - pos) * sizeof(T));
    data_[pos] = v;
    ++size_;
  }
  void erase(size_t pos) {
    std::memmove(data_ + pos, data_ + pos + 1, (size_ - pos - 1) * sizeof(T));
    --size_;
  }
  void clear() { size_ = 0; }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  operator std::span<const T>() const { return {data_, size_}; }  // NOLINT
  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }

  // A loop, not std::equal: that is a memcmp call, a tenth of a small op's time (shapes are short).
  bool operator==(const SmallVec& o) const {
    if (size_ != o.size_) return false;
    for (size_t i = 0; i < size_; ++i)
      if (data_[i] != o.data_[i]) return false;
    return true;
  }
  bool operator!=(const SmallVec& o) const { return !(*this == o); }

 private:
  // Copies of a shape of at most N dims move the whole inline array (a fixed-size copy the
  // compiler inlines) instead of calling memmove; o's buffer holds at least N elements either way.
  void copy_from(const SmallVec& o) {
    if (o.size_ <= N) {
      if (data_ != inline_) release();
      std::memcpy(inline_, o.data_, sizeof(inline_));
      size_ = o.size_;
    } else {
      assign(o.begin(), o.end());
    }
  }
  void release() {
    if (data_ != inline_) ::operator delete(data_);
    data_ = inline_;
    cap_ = N;
    size_ = 0;
  }
  void move_from(SmallVec& o) {
    if (o.data_ == o.inline_) {
      data_ = inline_;
      cap_ = N;
      size_ = o.size_;
      std::memcpy(inline_, o.inline_, sizeof(inline_));
    } else {
      data_ = o.data_;
      cap_ = o.cap_;
      size_ = o.size_;
      o.data_ = o.inline_;
      o.cap_ = N;
    }
    o.size_ = 0;
  }

  T* data_ = inline_;
  size_t size_ = 0;
  size_t cap_ = N;
  T inline_[N];
};

constexpr size_t kInlineDims = 6;
using Shape = SmallVec<int64_t, kInlineDims>;

int64_t shape_numel(const Shape& s);
// Row-major contiguous strides for a shape.
Shape contiguous_strides(const Shape& s);
// Normalise a possibly negative dim against rank; throws IndexError naming op.
int64_t wrap_dim(int64_t dim, int64_t rank, const char* op);
// Broadcast two shapes (numpy rules); throws ShapeError naming op.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
bool is_broadcastable_to(const Shape& from, const Shape& to);

// "(2, 3)" -- used in every error message.
std::string shape_str(const Shape& s);
std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace accel
