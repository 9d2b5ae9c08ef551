// Containers: Sequential (chains forwards) and ModuleList (indexed children).
// Children are named "0", "1", ... so parameters read "layers.1.weight", as in PyTorch.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "nn/module.h"

namespace accel::nn {

// Note [entry wrappers]
// A ZeRO-3 unit (dist/fsdp.h) must run code around its module's calls. It installs a call
// wrapper on the module (Note [module calls] in nn/module.h), which operator(),
// call<R>() and call_values() run; but models often call their children's forward() directly
// (`for (auto& b : *blocks) x = b->forward(x);`), which runs no hooks and no wrapper. So while a
// unit is wrapped, its container entry is replaced by a ForwardWrapper whose forward(x) is the
// inner module's operator()(x) and whose type-erased forward is the inner module's call_values:
// operator[], iteration and Sequential::forward see it. The registered child (names,
// state_dict, named_modules, train/eval, printing) stays the original module, and at<M>(i)
// returns the original, whose typed operator() runs the wrapper too; only a direct
// at<M>(i)->forward(...) (or a typed member's ->forward(...)) bypasses it.
class ForwardWrapper final : public Module {
 public:
  explicit ForwardWrapper(std::shared_ptr<Module> inner) : inner_(std::move(inner)) {}
  Tensor forward(const Tensor& x) override { return (*inner_)(x); }
  std::vector<Tensor> forward_values(Values& in) override { return inner_->call_values(in); }
  std::string forward_signature() const override { return inner_->forward_signature(); }
  bool typed_forward() const override { return inner_->typed_forward(); }
  const std::shared_ptr<Module>& inner() const { return inner_; }
  std::string extra_repr() const override { return inner_->type_name(); }

 private:
  std::shared_ptr<Module> inner_;
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
  // torch's Sequential(OrderedDict) (libtorch's Sequential of named modules): entry i is the
  // child named named[i].first, so parameters read "heads.head.weight" instead of
  // "heads.0.weight". Sequential({{"conv", conv}, {"relu", relu}}).
  explicit Sequential(const Named<std::shared_ptr<Module>>& named);

  // Appends an entry named by its index ("0", "1", ...; torch's append).
  void push_back(std::shared_ptr<Module> module);
  // Appends an entry named `name` (torch's add_module on a Sequential, libtorch's
  // push_back(name, module)); a name in use is a ValueError.
  void push_back(const std::string& name, std::shared_ptr<Module> module);
  // torch's seq[i] = module: entry i (and the child that holds it, "i" or its name) becomes
  // `module`.
  void set(size_t i, std::shared_ptr<Module> module);
  // x -> m0 -> m1 -> ... through each entry's operator() (hooks run, as in PyTorch); an empty
  // Sequential is the identity. Entries with typed forwards (nn::TypedModule) chain through the
  // type-erased call: the result tensors of one are the arguments of the next, so a
  // two-output entry may feed a two-input one; forward(x) then needs one tensor at the end,
  // seq->call<std::tuple<Tensor, Tensor>>(a, b) takes and returns any number.
  Tensor forward(const Tensor& x) override;
  std::vector<Tensor> forward_values(Values& in) override;
  std::string forward_signature() const override;
  bool typed_forward() const override;

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
  // Note [entry wrappers]: entry i is called through a ForwardWrapper until unwrap(i); wrapping
  // a wrapped entry is a ValueError.
  void wrap(size_t i);
  void unwrap(size_t i);
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 protected:
  void on_child_assign(uint32_t index, const std::shared_ptr<Module>& module) override;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

class ModuleList : public Module {
 public:
  ModuleList() = default;
  explicit ModuleList(const std::vector<std::shared_ptr<Module>>& modules);

  void push_back(std::shared_ptr<Module> module);
  // torch's list[i] = module: entry i (and the child named "i") becomes `module`.
  void set(size_t i, std::shared_ptr<Module> module);
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
  // Note [entry wrappers]: entry i is called through a ForwardWrapper until unwrap(i); wrapping
  // a wrapped entry is a ValueError.
  void wrap(size_t i);
  void unwrap(size_t i);
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 protected:
  void on_child_assign(uint32_t index, const std::shared_ptr<Module>& module) override;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace accel::nn
