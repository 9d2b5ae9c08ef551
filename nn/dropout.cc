#include "nn/dropout.h"

#include <string>

#include "autograd/ops.h"

namespace accel::nn {

namespace {
void check_p(const char* module, double p) {
  ACCEL_CHECK(p >= 0 && p <= 1, ValueError, module, "p must be in [0, 1], got ", p);
}
std::string dropout_repr(double p, bool inplace) {
  return "p=" + std::to_string(p) + (inplace ? ", inplace=true" : "");
}
}  // namespace

Dropout1d::Dropout1d(double p_, bool inplace_, Generator* gen)
    : p(p_), inplace(inplace_), gen_(gen) {
  check_p("Dropout1d", p_);
}
Tensor Dropout1d::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  if (!inplace) return dropout1d(x, p, true, gen_);
  Tensor y = x;  // the caller's impl, overwritten (torch's inplace=True)
  return dropout1d_(y, p, true, gen_);
}
std::string Dropout1d::extra_repr() const { return dropout_repr(p, inplace); }

Dropout2d::Dropout2d(double p_, Generator* gen) : Dropout2d(p_, false, gen) {}
Dropout2d::Dropout2d(double p_, bool inplace_, Generator* gen)
    : p(p_), inplace(inplace_), gen_(gen) {
  check_p("Dropout2d", p_);
}
Tensor Dropout2d::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  if (!inplace) return dropout2d(x, p, true, gen_);
  Tensor y = x;
  return dropout2d_(y, p, true, gen_);
}
std::string Dropout2d::extra_repr() const { return dropout_repr(p, inplace); }

Dropout3d::Dropout3d(double p_, bool inplace_, Generator* gen)
    : p(p_), inplace(inplace_), gen_(gen) {
  check_p("Dropout3d", p_);
}
Tensor Dropout3d::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  if (!inplace) return dropout3d(x, p, true, gen_);
  Tensor y = x;
  return dropout3d_(y, p, true, gen_);
}
std::string Dropout3d::extra_repr() const { return dropout_repr(p, inplace); }

}  // namespace accel::nn
