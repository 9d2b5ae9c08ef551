// Containers: Sequential (chains single-input forwards) and ModuleList (indexed children).
// Children are named "0", "1", ... so parameters read "layers.1.weight", as in PyTorch.
#pragma once

#include <memory>
#include <vector>

#include "autograd/nn/module.h"

namespace accel::nn {

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
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    ACCEL_CHECK(m != nullptr, ValueError, "Sequential.at", "module ", i, " is a ",
                (*this)[i]->type_name());
    return m;
  }
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
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    ACCEL_CHECK(m != nullptr, ValueError, "ModuleList.at", "module ", i, " is a ",
                (*this)[i]->type_name());
    return m;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace accel::nn
