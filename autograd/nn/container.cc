#include "autograd/nn/container.h"

#include <string>

namespace accel::nn {

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
