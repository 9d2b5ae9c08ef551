// Containers: Sequential (chains single-input forwards) and ModuleList (indexed children).
// Children are named "0", "1", ... so parameters read "layers.1.weight", as in PyTorch.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "autograd/nn/module.h"

namespace accel::nn {

// Note [entry wrappers]
// A ZeRO-3 unit (dist/fsdp.h) must run code just before and after its module's forward. C++ has
// no __call__ to hook and models call their children's forward() directly, so the unit replaces
// the container entry its parent calls through: operator[], iteration and Sequential::forward
// then see a ForwardWrapper whose forward(x) is `call(inner, x)`. The registered child (names,
// state_dict, named_modules, train/eval, printing) stays the original module, and at<M>(i)
// returns the original. A module the parent holds in a typed member cannot be wrapped.
class ForwardWrapper final : public Module {
 public:
  using Call = std::function<Tensor(Module& inner, const Tensor& x)>;
  ForwardWrapper(std::shared_ptr<Module> inner, Call call)
      : inner_(std::move(inner)), call_(std::move(call)) {}
  Tensor forward(const Tensor& x) override { return call_(*inner_, x); }
  const std::shared_ptr<Module>& inner() const { return inner_; }
  std::string extra_repr() const override { return inner_->type_name(); }

 private:
  std::shared_ptr<Module> inner_;
  Call call_;
};

// The module behind an entry (unwraps a ForwardWrapper).
const std::shared_ptr<Module>& unwrap_entry(const std::shared_ptr<Module>& m);

class Sequential : public Module {
 public:
  Sequential() = default;
  // Sequential(std::make_shared<Linear>(4, 8), std::make_shared<ReLU>(), ...)
  template <typename... Ms>
  explicit Sequential(std::shared_ptr<Ms>... modules) {
    (push_back(std::move(modules)), ...);
  }
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  void push_back(std::shared_ptr<Module> module);
  // x -> m0 -> m1 -> ... ; an empty Sequential is the identity.
  Tensor forward(const Tensor& x) override;

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // Typed access; throws ValueError when module i is not an M.
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>(unwrap_entry((*this)[i]));
    ACCEL_CHECK(m != nullptr, ValueError, "Sequential.at", "module ", i, " is a ",
                unwrap_entry((*this)[i])->type_name());
    return m;
  }
  // Note [entry wrappers]: entry i is called through a ForwardWrapper(entry, call) until
  // unwrap(i); wrapping a wrapped entry is a ValueError.
  void wrap(size_t i, ForwardWrapper::Call call);
  void unwrap(size_t i);
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

class ModuleList : public Module {
 public:
  ModuleList() = default;
  explicit ModuleList(const std::vector<std::shared_ptr<Module>>& modules);

  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>(unwrap_entry((*this)[i]));
    ACCEL_CHECK(m != nullptr, ValueError, "ModuleList.at", "module ", i, " is a ",
                unwrap_entry((*this)[i])->type_name());
    return m;
  }
  // Note [entry wrappers]: entry i is called through a ForwardWrapper(entry, call) until
  // unwrap(i); wrapping a wrapped entry is a ValueError.
  void wrap(size_t i, ForwardWrapper::Call call);
  void unwrap(size_t i);
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace accel::nn
