#include "optim/optimizer.h"

#include <cxxabi.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <unordered_set>

namespace accel::optim {

Optimizer::Optimizer(const char* name, std::vector<ParamGroup> groups, double default_lr,
                     double default_weight_decay)
    : name_(name), default_lr_(default_lr), default_weight_decay_(default_weight_decay) {
  ACCEL_CHECK(default_lr >= 0, ValueError, name, "invalid learning rate ", default_lr);
  ACCEL_CHECK(default_weight_decay >= 0, ValueError, name, "invalid weight decay ",
              default_weight_decay);
  for (const ParamGroup& g : groups) add_param_group(g);
}

Optimizer::~Optimizer() = default;

Tensor Optimizer::step(const std::function<Tensor()>& closure) {
  ACCEL_CHECK(bool(closure), ValueError, name_, "step(closure): empty closure");
  Tensor loss;
  {
    EnableGradGuard grad;  // the closure runs a backward even when called under no_grad
    loss = closure();
  }
  step();
  return loss;
}

void Optimizer::save_global_state(TensorDict&) const {}

std::function<void()> Optimizer::load_global_state(const TensorDict&, std::set<std::string>&,
                                                   std::vector<std::string>&) {
  return {};
}

namespace {
std::string demangled(const std::type_info& t) {
  int status = 0;
  char* d = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : t.name();
  std::free(d);
  return out;
}
}  // namespace

std::unique_ptr<Optimizer> Optimizer::rebuild(std::vector<ParamGroup>) const {
  ACCEL_THROW(ValueError, name_, "rebuild: ", demangled(typeid(*this)),
              " cannot be rebuilt over other parameters (implement Optimizer::rebuild to use "
              "it with ZeRO)");
}

std::vector<ParamGroup> Optimizer::rebuild_groups(const std::type_info& own,
                                                  std::vector<ParamGroup> groups) const {
  ACCEL_CHECK(typeid(*this) == own, ValueError, name_, "rebuild: ", demangled(typeid(*this)),
              " does not implement rebuild; its base ", demangled(own),
              " would drop what it changes (implement Optimizer::rebuild to use it with ZeRO)");
  ACCEL_CHECK(groups.size() == groups_.size(), ValueError, name_, "rebuild: got ", groups.size(),
              " parameter groups for an optimizer with ", groups_.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].lr) groups[g].lr = groups_[g].lr;
    if (!groups[g].weight_decay) groups[g].weight_decay = groups_[g].weight_decay;
  }
  return groups;
}

void Optimizer::check_param(const Tensor& p, size_t group) const {
  ACCEL_CHECK(p.defined(), ValueError, name_, "parameter group ", group,
              " holds an undefined tensor");
  ACCEL_CHECK(p.is_floating_point(), DTypeError, name_, "parameter group ", group, " holds a ",
              p.dtype(), " tensor of shape ", p.sizes(), "; parameters are floating");
  ACCEL_CHECK(p.is_leaf(), ValueError, name_, "cannot optimize a non-leaf tensor of shape ",
              p.sizes(), " (group ", group, ")");
}

void Optimizer::add_param_group(const ParamGroup& group) {
  const size_t g = groups_.size();
  ACCEL_CHECK(!group.params.empty(), ValueError, name_, "parameter group ", g, " is empty");
  std::unordered_set<const TensorImpl*> seen;
  for (const Group& other : groups_) {
    for (const Tensor& p : other.params) seen.insert(p.impl());
  }
  for (const Tensor& p : group.params) {
    check_param(p, g);
    ACCEL_CHECK(seen.insert(p.impl()).second, ValueError, name_, "a parameter of shape ", p.sizes(),
                " appears more than once (group ", g, ")");
  }
  const double lr = group.lr.value_or(default_lr_);
  const double wd = group.weight_decay.value_or(default_weight_decay_);
  ACCEL_CHECK(lr >= 0, ValueError, name_, "invalid learning rate ", lr, " for group ", g);
  ACCEL_CHECK(wd >= 0, ValueError, name_, "invalid weight decay ", wd, " for group ", g);
  groups_.push_back(Group{group.params, lr, wd, state_.size()});
  state_.resize(state_.size() + group.params.size());
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Group& g : groups_) {
    for (Tensor& p : g.params) p.zero_grad(set_to_none);
  }
}

const std::vector<Tensor>& Optimizer::params(size_t group) const {
  ACCEL_CHECK(group < groups_.size(), IndexError, name_, "parameter group ", group,
              " out of range (", groups_.size(), " groups)");
  return groups_[group].params;
}

double Optimizer::lr(size_t group) const {
  params(group);
  return groups_[group].lr;
}

void Optimizer::set_lr(size_t group, double lr) {
  params(group);
  ACCEL_CHECK(lr >= 0, ValueError, name_, "invalid learning rate ", lr);
  groups_[group].lr = lr;
}

void Optimizer::set_lr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) set_lr(g, lr);
}

double Optimizer::weight_decay(size_t group) const {
  params(group);
  return groups_[group].weight_decay;
}

void Optimizer::set_weight_decay(size_t group, double wd) {
  params(group);
  ACCEL_CHECK(wd >= 0, ValueError, name_, "invalid weight decay ", wd);
  groups_[group].weight_decay = wd;
}

int64_t Optimizer::step_count(size_t i) const {
  ACCEL_CHECK(i < state_.size(), IndexError, name_, "parameter index ", i, " out of range (",
              state_.size(), " parameters)");
  return state_[i].step;
}

Tensor Optimizer::state(size_t i, const std::string& slot) const {
  step_count(i);
  const std::vector<std::string> names = slot_names();
  for (size_t s = 0; s < names.size(); ++s) {
    if (names[s] == slot) return s < state_[i].slots.size() ? state_[i].slots[s] : Tensor();
  }
  ACCEL_THROW(ValueError, name_, "no state slot '", slot, "'");
}

TensorDict Optimizer::state_dict() const {
  TensorDict out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string pre = "param_groups." + std::to_string(g) + ".";
    out[pre + "lr"] = scalar_tensor(groups_[g].lr, kFloat64);
    out[pre + "weight_decay"] = scalar_tensor(groups_[g].weight_decay, kFloat64);
    std::vector<int64_t> idx(groups_[g].params.size());
    for (size_t k = 0; k < idx.size(); ++k) idx[k] = int64_t(groups_[g].first_index + k);
    out[pre + "params"] = tensor(idx, Shape{int64_t(idx.size())});
  }
  const std::vector<std::string> names = slot_names();
  for (size_t i = 0; i < state_.size(); ++i) {
    const State& s = state_[i];
    // A parameter has state once it took a step, or when a loaded state gave it a slot (torch's
    // SGD states carry momentum buffers but no step count: load_torch_state).
    bool has_state = s.step != 0;
    for (const Tensor& t : s.slots) has_state = has_state || t.defined();
    if (!has_state) continue;
    const std::string pre = "state." + std::to_string(i) + ".";
    out[pre + "step"] = scalar_tensor(s.step, kInt64);
    for (size_t k = 0; k < names.size() && k < s.slots.size(); ++k) {
      if (s.slots[k].defined()) out[pre + names[k]] = s.slots[k].detach();
    }
  }
  save_global_state(out);
  return out;
}

void Optimizer::load_state_dict(const TensorDict& sd) { load_state(sd, false); }

void Optimizer::load_state_dict(TensorDict&& sd) {
  const TensorDict d = std::move(sd);
  load_state(d, true);
}

void Optimizer::load_state(const TensorDict& sd, bool adopt) {
  std::vector<std::string> problems;
  std::set<std::string> used;
  auto find = [&](const std::string& key) -> const Tensor* {
    auto it = sd.find(key);
    if (it == sd.end() || !it->second.defined()) return nullptr;
    used.insert(key);
    return &it->second;
  };
  auto scalar = [&](const std::string& key, bool is_int) -> std::optional<double> {
    const Tensor* t = find(key);
    if (!t) {
      problems.push_back("missing " + key);
      return std::nullopt;
    }
    if (t->numel() != 1 || is_floating(t->dtype()) == is_int) {
      problems.push_back(key + " must be a single " + (is_int ? "integer" : "float") + ", got " +
                         std::string(dtype_name(t->dtype())) + " " + t->shape_str());
      return std::nullopt;
    }
    return t->item<double>();
  };

  // Groups: same count, same sizes and indices.
  std::vector<double> lrs(groups_.size()), wds(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string pre = "param_groups." + std::to_string(g) + ".";
    if (auto v = scalar(pre + "lr", false)) lrs[g] = *v;
    if (auto v = scalar(pre + "weight_decay", false)) wds[g] = *v;
    const Tensor* idx = find(pre + "params");
    if (!idx) {
      problems.push_back("missing " + pre + "params");
      continue;
    }
    std::vector<int64_t> expect(groups_[g].params.size());
    for (size_t k = 0; k < expect.size(); ++k) expect[k] = int64_t(groups_[g].first_index + k);
    if (idx->dim() != 1 || is_floating(idx->dtype()) || idx->to_vector<int64_t>() != expect) {
      problems.push_back(pre + "params does not match: the checkpoint group has " +
                         std::to_string(idx->numel()) + " parameters, this optimizer's " +
                         std::to_string(expect.size()));
    }
  }

  // Per-parameter state.
  const std::vector<std::string> names = slot_names();
  std::vector<State> loaded(state_.size());
  size_t i = 0;
  for (const Group& grp : groups_) {
    for (const Tensor& p : grp.params) {
      const std::string pre = "state." + std::to_string(i) + ".";
      State& s = loaded[i];
      s.slots.resize(names.size());
      if (sd.count(pre + "step")) {
        if (auto v = scalar(pre + "step", true)) s.step = int64_t(*v);
      }
      for (size_t k = 0; k < names.size(); ++k) {
        const Tensor* t = find(pre + names[k]);
        if (!t) continue;
        if (t->sizes() != p.sizes()) {
          problems.push_back(pre + names[k] + ": checkpoint " + t->shape_str() + ", parameter " +
                             p.shape_str());
          continue;
        }
        NoGradGuard no_grad;
        if (adopt && t->dtype() == p.dtype() && t->device() == p.device() && t->is_contiguous() &&
            !t->requires_grad()) {
          s.slots[k] = t->detach();
          continue;
        }
        Tensor c = empty(p.sizes(), TensorOptions(p.dtype(), p.device()));
        c.copy_(*t);
        s.slots[k] = c;
      }
      ++i;
    }
  }
  const std::function<void()> install_global = load_global_state(sd, used, problems);
  for (const auto& [k, v] : sd) {
    if (!used.count(k)) problems.push_back("unexpected key " + k);
  }
  if (!problems.empty()) {
    std::ostringstream os;
    for (size_t k = 0; k < problems.size(); ++k) os << (k ? "; " : "") << problems[k];
    ACCEL_THROW(ValueError, name_, "load_state_dict: ", problems.size(), " problem(s): ", os.str());
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = lrs[g];
    groups_[g].weight_decay = wds[g];
  }
  state_ = std::move(loaded);
  if (install_global) install_global();
}

}  // namespace accel::optim
