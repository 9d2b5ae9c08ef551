// Intrusive reference counting: one allocation per object, atomic count in the object.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace accel {

class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;
  virtual ~RefCounted() = default;

  void incref() const { refcount_.fetch_add(1, std::memory_order_relaxed); }
  // A count of 1 is the caller's own reference: nobody else can take a new one (there are no weak
  // references), so the last owner deletes without a locked read-modify-write.
  void decref() const {
    if (refcount_.load(std::memory_order_acquire) == 1 ||
        refcount_.fetch_sub(1, std::memory_order_acq_rel) == 1)
      delete this;
  }
  int use_count() const { return refcount_.load(std::memory_order_relaxed); }
  // make_intrusive: the new object's first reference, a plain store (no other thread can see it).
  void init_first_ref() const { refcount_.store(1, std::memory_order_relaxed); }

 private:
  mutable std::atomic<int32_t> refcount_{0};
};

template <typename T>
class IntrusivePtr {
 public:
  IntrusivePtr() = default;
  IntrusivePtr(std::nullptr_t) {}  // NOLINT
  explicit IntrusivePtr(T* p) : p_(p) {
    if (p_) p_->incref();
  }
  IntrusivePtr(const IntrusivePtr& o) : p_(o.p_) {
    if (p_) p_->incref();
  }
  IntrusivePtr(IntrusivePtr&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  // Takes over a reference the caller already counted (make_intrusive).
  struct Adopt {};
  IntrusivePtr(T* p, Adopt) : p_(p) {}
  template <typename U>
  IntrusivePtr(const IntrusivePtr<U>& o) : p_(o.get()) {  // NOLINT
    if (p_) p_->incref();
  }
  ~IntrusivePtr() {
    if (p_) p_->decref();
  }
  IntrusivePtr& operator=(IntrusivePtr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const IntrusivePtr& o) const { return p_ == o.p_; }
  bool operator!=(const IntrusivePtr& o) const { return p_ != o.p_; }
  void reset() {
    if (p_) p_->decref();
    p_ = nullptr;
  }
  int use_count() const { return p_ ? p_->use_count() : 0; }

 private:
  T* p_ = nullptr;
};

template <typename T, typename... Args>
IntrusivePtr<T> make_intrusive(Args&&... args) {
  T* p = new T(std::forward<Args>(args)...);
  p->init_first_ref();
  return IntrusivePtr<T>(p, typename IntrusivePtr<T>::Adopt{});
}

}  // namespace accel
