#include "autograd/nn/container.h"

#include <string>

namespace accel::nn {

const std::shared_ptr<Module>& unwrap_entry(const std::shared_ptr<Module>& m) {
  if (auto* w = dynamic_cast<const ForwardWrapper*>(m.get())) return w->inner();
  return m;
}

namespace {
void wrap_at(std::vector<std::shared_ptr<Module>>& modules, size_t i, ForwardWrapper::Call call,
             const char* owner) {
  ACCEL_CHECK(i < modules.size(), IndexError, owner, "index ", i, " out of range for ",
              modules.size(), " modules");
  ACCEL_CHECK(dynamic_cast<const ForwardWrapper*>(modules[i].get()) == nullptr, ValueError, owner,
              "entry ", i, " (", unwrap_entry(modules[i])->type_name(), ") is wrapped already");
  ACCEL_CHECK(bool(call), ValueError, owner, "empty wrapper call for entry ", i);
  modules[i] = std::make_shared<ForwardWrapper>(modules[i], std::move(call));
}
void unwrap_at(std::vector<std::shared_ptr<Module>>& modules, size_t i, const char* owner) {
  ACCEL_CHECK(i < modules.size(), IndexError, owner, "index ", i, " out of range for ",
              modules.size(), " modules");
  modules[i] = unwrap_entry(modules[i]);
}
}  // namespace

void Sequential::wrap(size_t i, ForwardWrapper::Call call) {
  wrap_at(modules_, i, std::move(call), "Sequential.wrap");
}
void Sequential::unwrap(size_t i) { unwrap_at(modules_, i, "Sequential.unwrap"); }
void ModuleList::wrap(size_t i, ForwardWrapper::Call call) {
  wrap_at(modules_, i, std::move(call), "ModuleList.wrap");
}
void ModuleList::unwrap(size_t i) { unwrap_at(modules_, i, "ModuleList.unwrap"); }

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_child(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& m : modules_) y = m->forward(y);
  return y;
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
