// L-BFGS, PyTorch's torch.optim.LBFGS(params, lr=1, max_iter=20, max_eval=max_iter * 5 / 4,
// tolerance_grad=1e-7, tolerance_change=1e-9, history_size=100, line_search_fn=None) algorithm
// (after minFunc): each step(closure) runs up to max_iter quasi-Newton iterations over the
// parameters taken as one flat vector, calling the closure (zero the gradients, forward,
// backward, return the loss) up to max_eval times. The direction comes from the two-loop
// recursion over the last history_size (s, y) pairs; the step length is lr (the first iteration
// of all: min(1, 1 / |g|_1) * lr), or, with line_search = "strong_wolfe", what a line search
// satisfying the strong Wolfe conditions (c1 = 1e-4, c2 = 0.9, at most 25 evaluations) finds.
// Stops early on |g|_inf <= tolerance_grad, on a directional derivative above
// -tolerance_change, or on a step or loss change below tolerance_change.
//
// One parameter group only, all parameters of one dtype and device (as PyTorch). The scalars of
// the recursion (dot products, rho, H_diag, step lengths) are kept in double; the vectors in the
// parameters' dtype (float64 parameters reproduce PyTorch's iterates).
//
// Note [LBFGS and sharding]
// The method needs dot products and a line search over the whole parameter vector, and its
// history (2 * history_size vectors of all parameters) is one global state, not per-parameter
// elementwise state: ZeRO / FSDP cannot step it shard by shard, so rebuild() refuses it (ZeRO
// prepare then fails with a ValueError naming LBFGS before anything collective runs). Under DDP
// and one process it works: Accelerator's step(closure) hands it the closure, the backward of
// each call all-reduces the gradients, and the loss each call returns is averaged across
// processes so every rank's line search takes the same decisions.
//
// State (state_dict, under "state.lbfgs."): func_evals, n_iter (int64), and once iterating d,
// t, old_dirs / old_stps (k x n), ro (k), H_diag, prev_flat_grad (n), prev_loss.
#pragma once

#include <deque>
#include <optional>
#include <string>

#include "optim/optimizer.h"
#include "autograd/options.h"

namespace accel::optim {

// Options in both spellings (Note [options structs] in autograd/options.h):
//   optim::LBFGS(params, optim::LBFGSOptions(1).line_search_fn("strong_wolfe"))
//   optim::LBFGS(params, {.lr = 1, .line_search_fn = "strong_wolfe"})
struct LBFGSFields {
  double lr = 1.0;
  int64_t max_iter = 20;
  std::optional<int64_t> max_eval = std::nullopt;  // unset: max_iter * 5 / 4
  double tolerance_grad = 1e-7;
  double tolerance_change = 1e-9;
  int64_t history_size = 100;
  std::string line_search_fn = "";  // "" (fixed step) or "strong_wolfe"
};

struct LBFGSOptions : LBFGSFields {
  using Fields = LBFGSFields;
  LBFGSOptions(double lr = 1.0) { Fields::lr = lr; }  // NOLINT: implicit, as libtorch's
  ACCEL_OPTIONS_FROM_FIELDS(LBFGSOptions)
  ACCEL_OPTION(lr)
  ACCEL_OPTION(max_iter)
  ACCEL_OPTION(max_eval)
  ACCEL_OPTION(tolerance_grad)
  ACCEL_OPTION(tolerance_change)
  ACCEL_OPTION(history_size)
  ACCEL_OPTION(line_search_fn)
};

class LBFGS : public Optimizer {
 public:
  LBFGS(std::vector<Tensor> params, const LBFGSFields& options = {});
  // Throws ValueError: L-BFGS needs to re-evaluate the loss; call step(closure).
  void step() override;
  // Runs the iterations; returns the loss of the closure's first call.
  Tensor step(const std::function<Tensor()>& closure) override;
  bool requires_closure() const override { return true; }
  // Refuses (Note [LBFGS and sharding]).
  std::unique_ptr<Optimizer> rebuild(std::vector<ParamGroup> groups) const override;
  const LBFGSOptions& options() const { return options_; }
  int64_t func_evals() const { return func_evals_; }
  int64_t n_iter() const { return n_iter_; }

 protected:
  std::vector<std::string> slot_names() const override { return {}; }
  void save_global_state(TensorDict& out) const override;
  std::function<void()> load_global_state(const TensorDict& state, std::set<std::string>& used,
                                          std::vector<std::string>& problems) override;

 private:
  struct Eval {
    double loss;
    Tensor flat_grad;
  };
  int64_t numel() const;
  Tensor gather_flat_grad() const;
  void add_to_params(double step, const Tensor& update);
  Eval evaluate(const std::function<Tensor()>& closure);
  // Loss and gradient at x + t * d; the parameters are x again afterwards.
  Eval directional_evaluate(const std::function<Tensor()>& closure, const std::vector<Tensor>& x,
                            double t, const Tensor& d);
  struct LineSearch {
    double loss;
    Tensor flat_grad;
    double t;
    int64_t evals;
  };
  LineSearch strong_wolfe(const std::function<Tensor()>& closure, double t, const Tensor& d,
                          double f, const Tensor& g, double gtd);

  LBFGSOptions options_;
  int64_t max_eval_;
  // State carried from one step to the next (PyTorch keeps it on the first parameter).
  int64_t func_evals_ = 0, n_iter_ = 0;
  Tensor d_;
  double t_ = 0;
  std::deque<Tensor> old_dirs_, old_stps_;
  std::deque<double> ro_;
  double h_diag_ = 1;
  Tensor prev_flat_grad_;
  double prev_loss_ = 0;
};

}  // namespace accel::optim
