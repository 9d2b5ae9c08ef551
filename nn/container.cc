#include "nn/container.h"

#include <string>

namespace accel::nn {

const std::shared_ptr<Module>& unwrap_entry(const std::shared_ptr<Module>& m) {
  if (auto* w = dynamic_cast<const ForwardWrapper*>(m.get())) return w->inner();
  return m;
}

namespace {
void wrap_at(std::vector<std::shared_ptr<Module>>& modules, size_t i, const char* owner) {
  ACCEL_CHECK(i < modules.size(), IndexError, owner, "index ", i, " out of range for ",
              modules.size(), " modules");
  ACCEL_CHECK(dynamic_cast<const ForwardWrapper*>(modules[i].get()) == nullptr, ValueError, owner,
              "entry ", i, " (", unwrap_entry(modules[i])->type_name(), ") is wrapped already");
  modules[i] = std::make_shared<ForwardWrapper>(modules[i]);
}
void unwrap_at(std::vector<std::shared_ptr<Module>>& modules, size_t i, const char* owner) {
  ACCEL_CHECK(i < modules.size(), IndexError, owner, "index ", i, " out of range for ",
              modules.size(), " modules");
  modules[i] = unwrap_entry(modules[i]);
}
}  // namespace

namespace {
// A container's entry i is its child i (push_back registers "0", "1", ... in order); a subclass
// that registers other children too keeps them after its entries or outside the list.
void assign_entry(std::vector<std::shared_ptr<Module>>& modules, uint32_t index,
                  const std::shared_ptr<Module>& module, const char* owner) {
  if (index >= modules.size()) return;  // a child of a subclass, not an entry
  ACCEL_CHECK(module != nullptr, ValueError, owner, "entry ", index,
              " cannot be None (a container calls every entry)");
  modules[index] = module;
}
}  // namespace

void Sequential::on_child_assign(uint32_t index, const std::shared_ptr<Module>& module) {
  assign_entry(modules_, index, module, "Sequential.set");
}
void ModuleList::on_child_assign(uint32_t index, const std::shared_ptr<Module>& module) {
  assign_entry(modules_, index, module, "ModuleList.set");
}
void Sequential::set(size_t i, std::shared_ptr<Module> module) {
  ACCEL_CHECK(i < modules_.size(), IndexError, "Sequential.set", "index ", i, " out of range for ",
              modules_.size(), " modules");
  // Entry i is child i (assign_entry); entries are never None, so named_children() lists them all.
  replace_module(named_children()[i].first, std::move(module));
}
void ModuleList::set(size_t i, std::shared_ptr<Module> module) {
  ACCEL_CHECK(i < modules_.size(), IndexError, "ModuleList.set", "index ", i, " out of range for ",
              modules_.size(), " modules");
  replace_module(std::to_string(i), std::move(module));
}

void Sequential::wrap(size_t i) { wrap_at(modules_, i, "Sequential.wrap"); }
void Sequential::unwrap(size_t i) { unwrap_at(modules_, i, "Sequential.unwrap"); }
void ModuleList::wrap(size_t i) { wrap_at(modules_, i, "ModuleList.wrap"); }
void ModuleList::unwrap(size_t i) { unwrap_at(modules_, i, "ModuleList.unwrap"); }

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(const Named<std::shared_ptr<Module>>& named) {
  for (const auto& [name, m] : named) push_back(name, m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  push_back(std::to_string(modules_.size()), std::move(module));
}

void Sequential::push_back(const std::string& name, std::shared_ptr<Module> module) {
  ACCEL_CHECK(module != nullptr, ValueError, "Sequential.push_back", "entry '", name,
              "' cannot be None (a container calls every entry)");
  for (const auto& [used, m] : named_children())
    ACCEL_CHECK(used != name, ValueError, "Sequential.push_back", "an entry named '", name,
                "' exists already (", unwrap_entry(m)->type_name(), ")");
  register_child(name, module);
  modules_.push_back(std::move(module));
}

namespace {
Values as_values(std::vector<Tensor>&& ts) {
  Values v;
  v.reserve(ts.size());
  for (Tensor& t : ts) v.push_back(Value::from_tensor(std::move(t)));
  return v;
}
}  // namespace

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (size_t i = 0; i < modules_.size(); ++i) {
    if (!modules_[i]->typed_forward()) {
      y = (*modules_[i])(y);
      continue;
    }
    // From the first typed entry on, the type-erased chain (any number of tensors between).
    Values v{Value::from_tensor(y)};
    for (; i < modules_.size(); ++i) v = as_values(modules_[i]->call_values(std::move(v)));
    ACCEL_CHECK(v.size() == 1, ValueError, "Sequential.forward",
                "forward(x) returns one tensor, the last entry (",
                unwrap_entry(modules_.back())->type_name(), ") gave ", v.size(),
                "; call it with call<R>(...)");
    return v[0].tensor();
  }
  return y;
}

std::vector<Tensor> Sequential::forward_values(Values& in) {
  Values v = in;
  for (const auto& m : modules_) v = as_values(m->call_values(std::move(v)));
  std::vector<Tensor> out;
  for (size_t i = 0; i < v.size(); ++i) {
    ACCEL_CHECK(v[i].is_tensor(), ValueError, "Sequential.forward",
                "an empty Sequential returns its arguments, which must be tensors; argument ", i,
                " is ", v[i].type_name());
    out.push_back(v[i].tensor());
  }
  return out;
}

std::string Sequential::forward_signature() const {
  if (modules_.empty()) return "forward(Tensor...) -> Tensor...";
  std::string first = modules_.front()->forward_signature();
  std::string last = modules_.back()->forward_signature();
  return first.substr(0, first.find(" ->")) + last.substr(last.find(" ->"));
}

bool Sequential::typed_forward() const {
  for (const auto& m : modules_)
    if (m->typed_forward()) return true;
  return false;
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  ACCEL_CHECK(i < modules_.size(), IndexError, "Sequential", "index ", i, " out of range for ",
              modules_.size(), " modules");
  return modules_[i];
}

ModuleList::ModuleList(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_child(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  ACCEL_CHECK(i < modules_.size(), IndexError, "ModuleList", "index ", i, " out of range for ",
              modules_.size(), " modules");
  return modules_[i];
}

}  // namespace accel::nn
