#include "optim/torch_state.h"

#include <cmath>
#include <sstream>

#include "optim/adam.h"
#include "optim/sgd.h"

namespace accel::optim {

using io::PtEntry;
using io::PtValue;

// Note [torch optimizer states]
// torch's optimizer.state_dict() is {'state': {i: {...}}, 'param_groups': [{...}]}: parameters are
// numbered across groups in order (as accel numbers them), 'state' holds per-parameter tensors
// (Adam: 'step' as a float32 0-dim tensor since torch 1.12, 'exp_avg', 'exp_avg_sq'; SGD:
// 'momentum_buffer', None without momentum), each group holds its parameter numbers and every
// hyperparameter. accel's Optimizer::state_dict() is flat ("param_groups.<g>.lr",
// "param_groups.<g>.weight_decay", "param_groups.<g>.params", "state.<i>.step",
// "state.<i>.<slot>") and keeps only lr and weight_decay per group; betas, eps, momentum,
// dampening and nesterov are options of the optimizer object. So reading torch's state converts
// what accel keeps and checks that the rest equals the optimizer's options; writing fills each
// group with the optimizer's options and torch 1.13's defaults for what accel does not have
// (amsgrad, maximize, capturable, differentiable, fused: False; foreach: None), which is what
// torch writes for an optimizer built with those options. A step count must be a whole number;
// SGD's state has none in torch, so an SGD state loaded from torch has step 0.

namespace {

constexpr const char* kFrom = "flat_state_from_torch";
constexpr const char* kTo = "torch_state";

std::string group_key(size_t g, const char* name) {
  return "param_groups." + std::to_string(g) + "." + name;
}

double number(const PtValue& v, const std::string& what) {
  ACCEL_CHECK(v.is_int() || v.is_double() || v.is_bool(), ValueError, kFrom, what, " is a ",
              v.type_name(), ", not a number");
  return v.to_double();
}

const PtValue& field(const PtValue& d, const char* key, const std::string& what) {
  ACCEL_CHECK(d.is_dict(), ValueError, kFrom, what, " is a ", d.type_name(), ", not a dict");
  const PtValue* v = d.find(key);
  ACCEL_CHECK(v, ValueError, kFrom, what, " has no '", key, "'");
  return *v;
}

int64_t step_of(const PtValue& v, const std::string& what) {
  double s = 0;
  if (v.is_tensor()) {
    const Tensor& t = v.to_tensor();
    ACCEL_CHECK(t.numel() == 1, ValueError, kFrom, what, " is a tensor of shape ", t.shape_str());
    s = t.to(kFloat64).item<double>();
  } else {
    s = number(v, what);
  }
  ACCEL_CHECK(s >= 0 && s == std::floor(s) && s < 9.0e18, ValueError, kFrom, what, " is ", s,
              ", not a step count");
  return int64_t(s);
}

}  // namespace

TensorDict flat_state_from_torch(const PtValue& pt) {
  TensorDict out;
  const PtValue& groups = field(pt, "param_groups", "the optimizer state");
  ACCEL_CHECK(groups.is_list(), ValueError, kFrom, "'param_groups' is a ", groups.type_name());
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string what = "param_groups[" + std::to_string(g) + "]";
    const PtValue& grp = groups.item(g);
    out[group_key(g, "lr")] =
        scalar_tensor(number(field(grp, "lr", what), what + "['lr']"), kFloat64);
    out[group_key(g, "weight_decay")] = scalar_tensor(
        number(field(grp, "weight_decay", what), what + "['weight_decay']"), kFloat64);
    const PtValue& params = field(grp, "params", what);
    ACCEL_CHECK(params.is_list(), ValueError, kFrom, what, "['params'] is a ", params.type_name());
    std::vector<int64_t> idx;
    for (const PtValue& p : params.items()) {
      ACCEL_CHECK(p.is_int(), ValueError, kFrom, what, "['params'] holds a ", p.type_name());
      idx.push_back(p.to_int());
    }
    out[group_key(g, "params")] = tensor(idx, Shape{int64_t(idx.size())});
  }
  const PtValue& state = field(pt, "state", "the optimizer state");
  ACCEL_CHECK(state.is_dict(), ValueError, kFrom, "'state' is a ", state.type_name());
  for (const PtEntry& e : state.entries()) {
    ACCEL_CHECK(e.key.is_int() && e.key.to_int() >= 0, ValueError, kFrom, "'state' has the key ",
                e.key.repr(), "; torch numbers parameters 0, 1, ...");
    const std::string pre = "state." + std::to_string(e.key.to_int()) + ".";
    const std::string what = "state[" + e.key.repr() + "]";
    ACCEL_CHECK(e.value.is_dict(), ValueError, kFrom, what, " is a ", e.value.type_name());
    for (const PtEntry& s : e.value.entries()) {
      ACCEL_CHECK(s.key.is_string(), ValueError, kFrom, what, " has the key ", s.key.repr());
      const std::string& name = s.key.to_string();
      if (name == "step") {
        out[pre + "step"] = scalar_tensor(step_of(s.value, what + "['step']"), kInt64);
      } else if (s.value.is_tensor()) {
        out[pre + name] = s.value.to_tensor();
      } else {
        // SGD without momentum keeps momentum_buffer None.
        ACCEL_CHECK(s.value.is_none(), ValueError, kFrom, what, "['", name, "'] is a ",
                    s.value.type_name(), ", not a tensor");
      }
    }
  }
  return out;
}

void load_torch_state(Optimizer& opt, const PtValue& pt) {
  const auto* adam = dynamic_cast<const Adam*>(&opt);
  const auto* sgd = dynamic_cast<const SGD*>(&opt);
  ACCEL_CHECK(adam || sgd, ValueError, "load_torch_state",
              "reads torch states into SGD, Adam and AdamW; for another optimizer convert with "
              "flat_state_from_torch and check its options yourself");
  std::vector<std::string> diff;
  const PtValue& groups = field(pt, "param_groups", "the optimizer state");
  ACCEL_CHECK(groups.is_list(), ValueError, kFrom, "'param_groups' is a ", groups.type_name());
  for (size_t g = 0; g < groups.size(); ++g) {
    const PtValue& grp = groups.item(g);
    const std::string what = "param_groups[" + std::to_string(g) + "]";
    ACCEL_CHECK(grp.is_dict(), ValueError, kFrom, what, " is a ", grp.type_name());
    auto expect = [&](const char* key, double want, bool required) {
      const PtValue* v = grp.find(key);
      if (!v) {
        if (required) diff.push_back(what + " has no '" + key + "'");
        return;
      }
      const double got = number(*v, what + "['" + key + "']");
      if (got != want) {
        std::ostringstream os;
        os << what << "['" << key << "'] is " << got << ", this optimizer's " << want;
        diff.push_back(os.str());
      }
    };
    if (adam) {
      const auto [b1, b2] = adam->options().betas();
      const PtValue& betas = field(grp, "betas", what);
      ACCEL_CHECK((betas.is_tuple() || betas.is_list()) && betas.size() == 2, ValueError, kFrom,
                  what, "['betas'] is not a pair");
      const double f1 = number(betas.item(0), what + "['betas']");
      const double f2 = number(betas.item(1), what + "['betas']");
      if (f1 != b1 || f2 != b2) {
        std::ostringstream os;
        os << what << "['betas'] is (" << f1 << ", " << f2 << "), this optimizer's (" << b1 << ", "
           << b2 << ")";
        diff.push_back(os.str());
      }
      expect("eps", adam->options().eps(), true);
      expect("amsgrad", 0, false);
    } else {
      expect("momentum", sgd->options().momentum(), true);
      expect("dampening", sgd->options().dampening(), true);
      expect("nesterov", sgd->options().nesterov() ? 1 : 0, true);
    }
    expect("maximize", 0, false);
  }
  if (!diff.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < diff.size(); ++i) os << (i ? "; " : "") << diff[i];
    ACCEL_THROW(ValueError, "load_torch_state",
                "the file's hyperparameters differ from this optimizer's options (construct it "
                "with the file's): ",
                os.str());
  }
  opt.load_state_dict(flat_state_from_torch(pt));
}

PtValue torch_state(const Optimizer& opt) {
  const auto* adamw = dynamic_cast<const AdamW*>(&opt);
  const auto* adam = dynamic_cast<const Adam*>(&opt);
  const auto* sgd = dynamic_cast<const SGD*>(&opt);
  ACCEL_CHECK(adam || sgd, ValueError, kTo, "writes SGD, Adam and AdamW states");
  const TensorDict flat = opt.state_dict();
  const PtValue none;
  // state: {i: {...}} for every parameter with state, in parameter order.
  PtValue state = PtValue::dict();
  size_t n_params = 0;
  for (size_t g = 0; g < opt.num_param_groups(); ++g) n_params += opt.params(g).size();
  for (size_t i = 0; i < n_params; ++i) {
    const std::string pre = "state." + std::to_string(i) + ".";
    auto step = flat.find(pre + "step");
    if (step == flat.end()) continue;
    std::vector<PtEntry> s;
    auto slot = [&](const char* name) -> PtValue {
      auto it = flat.find(pre + name);
      return it == flat.end() ? none : PtValue(it->second);
    };
    if (adam) {
      // torch 1.13 keeps the step as a float32 0-dim tensor (capturable = False).
      s.push_back({"step", scalar_tensor(double(step->second.item<int64_t>()), kFloat32)});
      s.push_back({"exp_avg", slot("exp_avg")});
      s.push_back({"exp_avg_sq", slot("exp_avg_sq")});
    } else {
      s.push_back({"momentum_buffer", slot("momentum_buffer")});
    }
    state.set(int64_t(i), PtValue::dict(std::move(s)));
  }
  std::vector<PtValue> groups;
  for (size_t g = 0; g < opt.num_param_groups(); ++g) {
    std::vector<PtValue> params;
    for (int64_t p : flat.at(group_key(g, "params")).to_vector<int64_t>()) params.push_back(p);
    const double lr = opt.lr(g), wd = opt.weight_decay(g);
    std::vector<PtEntry> e;
    // The keys torch 1.13 writes, in its order.
    if (adam) {
      const auto [b1, b2] = adam->options().betas();
      e = {{"lr", lr},
           {"betas", PtValue::tuple({b1, b2})},
           {"eps", adam->options().eps()},
           {"weight_decay", wd},
           {"amsgrad", false}};
      if (adamw) {
        e.push_back({"foreach", none});
        e.push_back({"maximize", false});
        e.push_back({"capturable", false});
      } else {
        e.push_back({"maximize", false});
        e.push_back({"foreach", none});
        e.push_back({"capturable", false});
        e.push_back({"differentiable", false});
        e.push_back({"fused", false});
      }
    } else {
      e = {{"lr", lr},
           {"momentum", sgd->options().momentum()},
           {"dampening", sgd->options().dampening()},
           {"weight_decay", wd},
           {"nesterov", sgd->options().nesterov()},
           {"maximize", false},
           {"foreach", none},
           {"differentiable", false}};
    }
    e.push_back({"params", PtValue::list(std::move(params))});
    groups.push_back(PtValue::dict(std::move(e)));
  }
  return PtValue::dict(
      {{"state", std::move(state)}, {"param_groups", PtValue::list(std::move(groups))}});
}

}  // namespace accel::optim
