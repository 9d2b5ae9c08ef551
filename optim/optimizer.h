// Optimizer base: parameter groups (per-group lr and weight decay), per-parameter state, and a
// state_dict that is a flat name -> tensor map (so it can be saved with save_safetensors next
// to the model):
//   "param_groups.<g>.lr", "param_groups.<g>.weight_decay"  0-dim float64
//   "param_groups.<g>.params"                               int64 (n): parameter indices
//   "state.<i>.step"                                        0-dim int64
//   "state.<i>.<slot>"                                      e.g. exp_avg, momentum_buffer
// Parameters are numbered across groups in order, as in PyTorch. Only parameters that have taken
// a step (or were given state by load_state_dict) have state. load_torch_state and torch_state
// (optim/torch_state.h) convert to and from torch's layout.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/tensor.h"
#include "io/tensor_dict.h"

namespace accel::optim {

using io::TensorDict;

struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> lr;            // unset: the optimizer's lr
  std::optional<double> weight_decay;  // unset: the optimizer's weight decay
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient. Runs without recording history.
  virtual void step() = 0;
  // PyTorch's step(closure): calls closure() with grad mode on (it typically zeroes the
  // gradients, runs the forward and backward, and returns the loss), then step(); returns the
  // loss. A subclass that overrides step() hides this overload: add `using Optimizer::step;`
  // (SGD, Adam and AdamW do). LBFGS overrides it: it calls the closure several times per step.
  virtual Tensor step(const std::function<Tensor()>& closure);
  // True for an optimizer that can only step through step(closure) (LBFGS): the accelerator
  // then hands it the closure instead of calling it once and stepping (dist/accelerator.h).
  virtual bool requires_closure() const { return false; }
  // A new optimizer of this type and options over other parameters, one group per entry of
  // `groups` (which must have as many entries as this optimizer has groups): group g keeps this
  // optimizer's lr / weight decay of group g unless groups[g] sets them. No state is copied.
  // ZeRO builds its shard optimizer with it (dist/zero.h). The base refuses with a ValueError
  // naming the type; SGD, Adam and AdamW implement it (a subclass of theirs that does not
  // override it is refused too: a plain SGD would silently drop what the subclass changes).
  virtual std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const;
  void zero_grad(bool set_to_none = true);
  void add_param_group(const ParamGroup& group);

  size_t num_param_groups() const { return groups_.size(); }
  const std::vector<Tensor>& params(size_t group) const;
  double lr(size_t group = 0) const;
  void set_lr(size_t group, double lr);
  void set_lr(double lr);  // every group
  double weight_decay(size_t group = 0) const;
  void set_weight_decay(size_t group, double weight_decay);
  // Steps taken by parameter i (numbered across groups); 0 before its first step.
  int64_t step_count(size_t param_index) const;
  // State tensor `slot` of parameter i; undefined when it has none yet.
  Tensor state(size_t param_index, const std::string& slot) const;

  TensorDict state_dict() const;
  // Checks the dict against this optimizer's groups and parameters (group count and sizes,
  // state shapes, no unknown keys) and throws ValueError listing the problems; state tensors
  // are copied to each parameter's device and dtype.
  void load_state_dict(const TensorDict& state);
  // The same, but a state tensor that already has its parameter's shape, dtype and device and is
  // contiguous is taken as it is (no copy): a checkpoint reader builds the state in place
  // (dist/strategy.h, Note [checkpoint loading]). The dict's other tensors are copied.
  void load_state_dict(TensorDict&& state);

 protected:
  Optimizer(const char* name, std::vector<ParamGroup> groups, double default_lr,
            double default_weight_decay);

  struct Group {
    std::vector<Tensor> params;
    double lr;
    double weight_decay;
    size_t first_index;  // index of params[0] across groups
  };
  struct State {
    int64_t step = 0;
    std::vector<Tensor> slots;  // one per slot_names() entry; undefined until first used
  };
  // For rebuild(): throws ValueError unless this object's dynamic type is `own`; fills each
  // group's unset lr / weight decay from this optimizer's group of the same index.
  std::vector<ParamGroup> rebuild_groups(const std::type_info& own,
                                         std::vector<ParamGroup> groups) const;
  // Names of the per-parameter state tensors, e.g. {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> slot_names() const = 0;
  // State that belongs to the optimizer as a whole rather than to one parameter (LBFGS's
  // history), under keys "state.<name>.*" where <name> is not a parameter index. save adds it to
  // state_dict(); load reads it from the dict, marks the keys it takes in `used`, appends what is
  // wrong to `problems`, and returns what installs it (run only when the whole dict loads).
  virtual void save_global_state(TensorDict& out) const;
  virtual std::function<void()> load_global_state(const TensorDict& state,
                                                  std::set<std::string>& used,
                                                  std::vector<std::string>& problems);

  const char* name_;
  double default_lr_, default_weight_decay_;
  std::vector<Group> groups_;
  std::vector<State> state_;  // one per parameter, across groups

 private:
  void load_state(const TensorDict& state, bool adopt);
  void check_param(const Tensor& p, size_t group) const;
};

}  // namespace accel::optim
