#include "optim/lbfgs.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/ops.h"

namespace accel::optim {

namespace {

LBFGSOptions checked(const LBFGSFields& o) {
  ACCEL_CHECK(o.max_iter > 0, ValueError, "LBFGS", "max_iter must be > 0, got ", o.max_iter);
  ACCEL_CHECK(!o.max_eval || *o.max_eval > 0, ValueError, "LBFGS", "max_eval must be > 0, got ",
              *o.max_eval);
  ACCEL_CHECK(o.history_size > 0, ValueError, "LBFGS", "history_size must be > 0, got ",
              o.history_size);
  ACCEL_CHECK(o.tolerance_grad >= 0 && o.tolerance_change >= 0, ValueError, "LBFGS",
              "tolerances must be >= 0, got tolerance_grad ", o.tolerance_grad,
              " and tolerance_change ", o.tolerance_change);
  ACCEL_CHECK(o.line_search_fn.empty() || o.line_search_fn == "strong_wolfe", ValueError, "LBFGS",
              "line_search_fn must be \"\" (none) or \"strong_wolfe\", got \"", o.line_search_fn,
              "\"");
  return o;
}

double dot(const Tensor& a, const Tensor& b) { return sum(a * b).item<double>(); }
double abs_max(const Tensor& a) { return max(abs(a)).item<double>(); }

// Minimiser of the cubic through (x1, f1) and (x2, f2) with slopes g1 and g2, clamped to
// [lo, hi] (default: between x1 and x2); the midpoint of the bounds when the cubic has no
// minimum. PyTorch's _cubic_interpolate (from Schmidt's polyinterp).
double cubic_interpolate(double x1, double f1, double g1, double x2, double f2, double g2,
                         std::optional<std::pair<double, double>> bounds = std::nullopt) {
  const auto [lo, hi] = bounds ? *bounds : (x1 <= x2 ? std::pair{x1, x2} : std::pair{x2, x1});
  const double d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2);
  const double d2_square = d1 * d1 - g1 * g2;
  if (d2_square >= 0) {
    const double d2 = std::sqrt(d2_square);
    const double min_pos = x1 <= x2 ? x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
                                    : x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
    return std::min(std::max(min_pos, lo), hi);
  }
  return (lo + hi) / 2.;
}

}  // namespace

LBFGS::LBFGS(std::vector<Tensor> params, const LBFGSFields& options)
    : Optimizer("LBFGS", {ParamGroup{std::move(params), {}, {}}}, options.lr, 0.0),
      options_(checked(options)),
      max_eval_(options.max_eval.value_or(options.max_iter * 5 / 4)) {
  const Tensor& p0 = groups_[0].params[0];
  for (const Tensor& p : groups_[0].params)
    ACCEL_CHECK(p.dtype() == p0.dtype() && p.device() == p0.device(), ValueError, name_,
                "all parameters must share one dtype and device (a flat vector): got ", p0.dtype(),
                " on ", p0.device(), " and ", p.dtype(), " on ", p.device(), " (shape ", p.sizes(),
                ")");
}

void LBFGS::step() {
  ACCEL_THROW(ValueError, name_,
              "step() without a closure: L-BFGS re-evaluates the loss several times per step; "
              "call step(closure) with a closure that zeroes the gradients, runs forward and "
              "backward and returns the loss");
}

std::unique_ptr<Optimizer> LBFGS::rebuild(std::vector<ParamGroup>) const {
  ACCEL_THROW(ValueError, name_,
              "cannot be sharded (ZeRO stages 1-3 / FSDP): L-BFGS takes dot products and a line "
              "search over the whole parameter vector and keeps one global history of it, not "
              "per-parameter elementwise state; use it under DDP or in one process, or use an "
              "elementwise optimizer (SGD, Adam, AdamW, Adadelta, Adagrad, RMSprop) with ZeRO");
}

int64_t LBFGS::numel() const {
  int64_t n = 0;
  for (const Tensor& p : groups_[0].params) n += p.numel();
  return n;
}

Tensor LBFGS::gather_flat_grad() const {
  std::vector<Tensor> views;
  for (const Tensor& p : groups_[0].params) {
    const Tensor g = p.grad();
    views.push_back(g.defined() ? g.reshape({-1})
                                : zeros({p.numel()}, TensorOptions(p.dtype(), p.device())));
  }
  return cat(views, 0);
}

void LBFGS::add_to_params(double step, const Tensor& update) {
  int64_t offset = 0;
  for (Tensor& p : groups_[0].params) {
    const int64_t n = p.numel();
    p.add_(update.narrow(0, offset, n).view(p.sizes()), step);
    offset += n;
  }
}

LBFGS::Eval LBFGS::evaluate(const std::function<Tensor()>& closure) {
  Tensor loss;
  {
    EnableGradGuard grad;
    loss = closure();
  }
  ACCEL_CHECK(loss.defined() && loss.numel() == 1, ValueError, name_,
              "the closure must return the loss as one number, got ",
              loss.defined() ? loss.shape_str() : std::string("an undefined tensor"));
  return {loss.item<double>(), gather_flat_grad()};
}

LBFGS::Eval LBFGS::directional_evaluate(const std::function<Tensor()>& closure,
                                        const std::vector<Tensor>& x, double t, const Tensor& d) {
  add_to_params(t, d);
  Eval e = evaluate(closure);
  for (size_t i = 0; i < x.size(); ++i) groups_[0].params[i].copy_(x[i]);
  return e;
}

// PyTorch's _strong_wolfe (from Schmidt's minFunc): bracket a step satisfying the strong Wolfe
// conditions, then zoom into the bracket by cubic interpolation.
LBFGS::LineSearch LBFGS::strong_wolfe(const std::function<Tensor()>& closure, double t,
                                      const Tensor& d, double f, const Tensor& g, double gtd) {
  constexpr double c1 = 1e-4, c2 = 0.9;
  constexpr int64_t max_ls = 25;
  const double tolerance_change = options_.tolerance_change();
  std::vector<Tensor> x;
  for (const Tensor& p : groups_[0].params) x.push_back(p.clone());
  const double d_norm = abs_max(d);

  Eval e = directional_evaluate(closure, x, t, d);
  int64_t evals = 1;
  double gtd_new = dot(e.flat_grad, d);

  double t_prev = 0, f_prev = f, gtd_prev = gtd;
  Tensor g_prev = g;
  bool done = false;
  int64_t ls_iter = 0;
  std::vector<double> bracket, bracket_f, bracket_gtd;
  std::vector<Tensor> bracket_g;
  while (ls_iter < max_ls) {
    if (e.loss > f + c1 * t * gtd || (ls_iter > 1 && e.loss >= f_prev)) {
      bracket = {t_prev, t};
      bracket_f = {f_prev, e.loss};
      bracket_g = {g_prev, e.flat_grad};
      bracket_gtd = {gtd_prev, gtd_new};
      break;
    }
    if (std::abs(gtd_new) <= -c2 * gtd) {
      bracket = {t};
      bracket_f = {e.loss};
      bracket_g = {e.flat_grad};
      done = true;
      break;
    }
    if (gtd_new >= 0) {
      bracket = {t_prev, t};
      bracket_f = {f_prev, e.loss};
      bracket_g = {g_prev, e.flat_grad};
      bracket_gtd = {gtd_prev, gtd_new};
      break;
    }
    // Extrapolate between 1.01 t and 10 t.
    const double min_step = t + 0.01 * (t - t_prev);
    const double max_step = t * 10;
    const double tmp = t;
    t = cubic_interpolate(t_prev, f_prev, gtd_prev, t, e.loss, gtd_new,
                          std::pair{min_step, max_step});
    t_prev = tmp;
    f_prev = e.loss;
    g_prev = e.flat_grad;
    gtd_prev = gtd_new;
    e = directional_evaluate(closure, x, t, d);
    ++evals;
    gtd_new = dot(e.flat_grad, d);
    ++ls_iter;
  }
  if (ls_iter == max_ls) {
    bracket = {0, t};
    bracket_f = {f, e.loss};
    bracket_g = {g, e.flat_grad};
  }

  // Zoom: shrink the bracket until a point satisfies the conditions.
  bool insuf_progress = false;
  size_t low = 0, high = 1;
  if (!(bracket_f.front() <= bracket_f.back())) std::swap(low, high);
  while (!done && ls_iter < max_ls) {
    if (std::abs(bracket[1] - bracket[0]) * d_norm < tolerance_change) break;
    t = cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1],
                          bracket_gtd[1]);
    // A trial too close to an end of the bracket moves to 0.1 of its width inside, when the
    // last trial made too little progress too or it is at (or past) the end.
    const double b_max = std::max(bracket[0], bracket[1]), b_min = std::min(bracket[0], bracket[1]);
    const double eps = 0.1 * (b_max - b_min);
    if (std::min(b_max - t, t - b_min) < eps) {
      if (insuf_progress || t >= b_max || t <= b_min) {
        t = std::abs(t - b_max) < std::abs(t - b_min) ? b_max - eps : b_min + eps;
        insuf_progress = false;
      } else {
        insuf_progress = true;
      }
    } else {
      insuf_progress = false;
    }
    e = directional_evaluate(closure, x, t, d);
    ++evals;
    gtd_new = dot(e.flat_grad, d);
    ++ls_iter;
    if (e.loss > f + c1 * t * gtd || e.loss >= bracket_f[low]) {
      // Armijo fails or no lower than the low end: the trial becomes the high end.
      bracket[high] = t;
      bracket_f[high] = e.loss;
      bracket_g[high] = e.flat_grad;
      bracket_gtd[high] = gtd_new;
      low = bracket_f[0] <= bracket_f[1] ? 0 : 1;
      high = 1 - low;
    } else {
      if (std::abs(gtd_new) <= -c2 * gtd) {
        done = true;
      } else if (gtd_new * (bracket[high] - bracket[low]) >= 0) {
        bracket[high] = bracket[low];
        bracket_f[high] = bracket_f[low];
        bracket_g[high] = bracket_g[low];
        bracket_gtd[high] = bracket_gtd[low];
      }
      bracket[low] = t;
      bracket_f[low] = e.loss;
      bracket_g[low] = e.flat_grad;
      bracket_gtd[low] = gtd_new;
    }
  }
  return {bracket_f[low], bracket_g[low], bracket[low], evals};
}

Tensor LBFGS::step(const std::function<Tensor()>& closure) {
  ACCEL_CHECK(bool(closure), ValueError, name_, "step(closure): empty closure");
  ACCEL_CHECK(groups_.size() == 1, ValueError, name_,
              "supports one parameter group only (as PyTorch's), got ", groups_.size());
  NoGradGuard no_grad;
  const double lr = groups_[0].lr;
  const double tolerance_grad = options_.tolerance_grad();
  const double tolerance_change = options_.tolerance_change();
  const size_t history_size = size_t(options_.history_size());

  Tensor orig_loss;
  {
    EnableGradGuard grad;
    orig_loss = closure();
  }
  ACCEL_CHECK(orig_loss.defined() && orig_loss.numel() == 1, ValueError, name_,
              "the closure must return the loss as one number, got ",
              orig_loss.defined() ? orig_loss.shape_str() : std::string("an undefined tensor"));
  double loss = orig_loss.item<double>();
  int64_t current_evals = 1;
  ++func_evals_;
  Tensor flat_grad = gather_flat_grad();
  bool opt_cond = abs_max(flat_grad) <= tolerance_grad;
  if (opt_cond) return orig_loss;

  std::vector<double> al(history_size);
  int64_t n_iter = 0;
  while (n_iter < options_.max_iter()) {
    ++n_iter;
    ++n_iter_;

    // Direction.
    if (n_iter_ == 1) {
      d_ = neg(flat_grad);
      old_dirs_.clear();
      old_stps_.clear();
      ro_.clear();
      h_diag_ = 1;
    } else {
      const Tensor y = sub(flat_grad, prev_flat_grad_);
      const Tensor s = mul(d_, t_);
      const double ys = dot(y, s);
      if (ys > 1e-10) {
        if (old_dirs_.size() == history_size) {
          old_dirs_.pop_front();
          old_stps_.pop_front();
          ro_.pop_front();
        }
        old_dirs_.push_back(y);
        old_stps_.push_back(s);
        ro_.push_back(1. / ys);
        h_diag_ = ys / dot(y, y);
      }
      // Two-loop recursion: d = -H g.
      const size_t num_old = old_dirs_.size();
      Tensor q = neg(flat_grad);
      for (size_t i = num_old; i-- > 0;) {
        al[i] = dot(old_stps_[i], q) * ro_[i];
        q.add_(old_dirs_[i], -al[i]);
      }
      Tensor r = mul(q, h_diag_);
      for (size_t i = 0; i < num_old; ++i) {
        const double be_i = dot(old_dirs_[i], r) * ro_[i];
        r.add_(old_stps_[i], al[i] - be_i);
      }
      d_ = r;
    }
    if (!prev_flat_grad_.defined()) {
      prev_flat_grad_ = flat_grad.clone();
    } else {
      prev_flat_grad_.copy_(flat_grad);
    }
    prev_loss_ = loss;

    // Step length.
    t_ = n_iter_ == 1 ? std::min(1., 1. / sum(abs(flat_grad)).item<double>()) * lr : lr;
    const double gtd = dot(flat_grad, d_);
    if (gtd > -tolerance_change) break;  // not a descent direction any more

    int64_t ls_func_evals = 0;
    if (options_.line_search_fn() == "strong_wolfe") {
      LineSearch ls = strong_wolfe(closure, t_, d_, loss, flat_grad, gtd);
      loss = ls.loss;
      flat_grad = ls.flat_grad;
      t_ = ls.t;
      ls_func_evals = ls.evals;
      add_to_params(t_, d_);
      opt_cond = abs_max(flat_grad) <= tolerance_grad;
    } else {
      add_to_params(t_, d_);
      if (n_iter != options_.max_iter()) {
        // Re-evaluated except after the last iteration (in a stochastic setting it would not
        // be used).
        Eval e = evaluate(closure);
        loss = e.loss;
        flat_grad = e.flat_grad;
        opt_cond = abs_max(flat_grad) <= tolerance_grad;
        ls_func_evals = 1;
      }
    }
    current_evals += ls_func_evals;
    func_evals_ += ls_func_evals;

    if (n_iter == options_.max_iter()) break;
    if (current_evals >= max_eval_) break;
    if (opt_cond) break;
    if (abs_max(mul(d_, t_)) <= tolerance_change) break;        // no progress in x
    if (std::abs(loss - prev_loss_) < tolerance_change) break;  // nor in the loss
  }
  return orig_loss;
}

void LBFGS::save_global_state(TensorDict& out) const {
  if (func_evals_ == 0 && n_iter_ == 0) return;
  const std::string pre = "state.lbfgs.";
  out[pre + "func_evals"] = scalar_tensor(func_evals_, kInt64);
  out[pre + "n_iter"] = scalar_tensor(n_iter_, kInt64);
  if (!d_.defined()) return;
  out[pre + "d"] = d_.detach();
  out[pre + "t"] = scalar_tensor(t_, kFloat64);
  out[pre + "H_diag"] = scalar_tensor(h_diag_, kFloat64);
  out[pre + "prev_loss"] = scalar_tensor(prev_loss_, kFloat64);
  if (prev_flat_grad_.defined()) out[pre + "prev_flat_grad"] = prev_flat_grad_.detach();
  if (!old_dirs_.empty()) {
    out[pre + "old_dirs"] = stack({old_dirs_.begin(), old_dirs_.end()}, 0);
    out[pre + "old_stps"] = stack({old_stps_.begin(), old_stps_.end()}, 0);
    std::vector<double> ro(ro_.begin(), ro_.end());
    out[pre + "ro"] = tensor(ro, Shape{int64_t(ro.size())});
  }
}

std::function<void()> LBFGS::load_global_state(const TensorDict& sd, std::set<std::string>& used,
                                               std::vector<std::string>& problems) {
  const std::string pre = "state.lbfgs.";
  const Tensor& p0 = groups_[0].params[0];
  const int64_t n = numel();
  const size_t before = problems.size();
  auto find = [&](const std::string& name) -> const Tensor* {
    auto it = sd.find(pre + name);
    if (it == sd.end() || !it->second.defined()) return nullptr;
    used.insert(pre + name);
    return &it->second;
  };
  auto number = [&](const std::string& name, bool is_int, double fallback) -> double {
    const Tensor* t = find(name);
    if (!t) return fallback;
    if (t->numel() != 1 || is_floating(t->dtype()) == is_int) {
      problems.push_back(pre + name + " must be a single " + (is_int ? "integer" : "float") +
                         ", got " + std::string(dtype_name(t->dtype())) + " " + t->shape_str());
      return fallback;
    }
    return t->item<double>();
  };
  // A vector of the parameters' dtype and device, of shape `shape`.
  auto vec = [&](const std::string& name, const Shape& shape) -> Tensor {
    const Tensor* t = find(name);
    if (!t) return {};
    if (t->sizes() != shape || !is_floating(t->dtype())) {
      problems.push_back(pre + name + ": checkpoint " + std::string(dtype_name(t->dtype())) + " " +
                         t->shape_str() + ", expected floating " + shape_str(shape) +
                         " (the parameters hold " + std::to_string(n) + " numbers)");
      return {};
    }
    Tensor c = empty(shape, TensorOptions(p0.dtype(), p0.device()));
    c.copy_(*t);
    return c;
  };
  const int64_t func_evals = int64_t(number("func_evals", true, 0));
  const int64_t n_iter = int64_t(number("n_iter", true, 0));
  const double t = number("t", false, 0), h_diag = number("H_diag", false, 1);
  const double prev_loss = number("prev_loss", false, 0);
  Tensor d = vec("d", Shape{n}), prev_flat_grad = vec("prev_flat_grad", Shape{n});
  const Tensor* dirs = find("old_dirs");
  const int64_t k = dirs && dirs->dim() == 2 ? dirs->size(0) : 0;
  if (dirs) used.erase(pre + "old_dirs");  // vec() marks it again
  Tensor old_dirs = dirs ? vec("old_dirs", Shape{k, n}) : Tensor();
  Tensor old_stps = dirs ? vec("old_stps", Shape{k, n}) : vec("old_stps", Shape{0, n});
  std::vector<double> ro;
  if (const Tensor* r = find("ro")) {
    if (r->sizes() != Shape{k} || !is_floating(r->dtype())) {
      problems.push_back(pre + "ro: checkpoint " + r->shape_str() + ", expected " +
                         shape_str(Shape{k}));
    } else {
      ro = r->to(kFloat64).to_vector<double>();
    }
  }
  if (k > options_.history_size())
    problems.push_back(pre + "old_dirs holds " + std::to_string(k) +
                       " pairs, more than history_size " + std::to_string(options_.history_size()));
  if (dirs && (!old_stps.defined() || ro.size() != size_t(k)) && problems.size() == before)
    problems.push_back(pre + "old_dirs needs old_stps and ro of as many pairs");
  if (problems.size() != before) return {};
  return [=, this] {
    func_evals_ = func_evals;
    n_iter_ = n_iter;
    d_ = d;
    t_ = t;
    h_diag_ = h_diag;
    prev_loss_ = prev_loss;
    prev_flat_grad_ = prev_flat_grad;
    old_dirs_.clear();
    old_stps_.clear();
    ro_.clear();
    for (int64_t i = 0; i < k; ++i) {
      old_dirs_.push_back(old_dirs.select(0, i).clone());
      old_stps_.push_back(old_stps.select(0, i).clone());
      ro_.push_back(ro[size_t(i)]);
    }
  };
}

}  // namespace accel::optim
