#include "core/generator.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace accel {

double Generator::next_normal() {
  if (has_cached_normal_) {
    has_cached_normal_ = false;
    return cached_normal_;
  }
  // Box-Muller on (0, 1]: u1 never 0 so log is finite.
  const double u1 = 1.0 - next_double();
  const double u2 = next_double();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * M_PI * u2;
  cached_normal_ = r * std::sin(theta);
  has_cached_normal_ = true;
  return r * std::cos(theta);
}

std::string Generator::state() const {
  std::ostringstream os;
  os << seed_ << ' ' << has_cached_normal_ << ' ';
  os.precision(17);
  os << cached_normal_ << ' ' << engine_;
  return os.str();
}

void Generator::set_state(const std::string& s) {
  std::istringstream is(s);
  uint64_t seed;
  bool has;
  double cached;
  std::mt19937_64 eng;
  is >> seed >> has >> cached >> eng;
  ACCEL_CHECK(!is.fail(), ValueError, "Generator.set_state", "malformed generator state (",
              s.size(), " bytes)");
  seed_ = seed;
  has_cached_normal_ = has;
  cached_normal_ = cached;
  engine_ = eng;
}

Generator& default_generator() {
  static Generator g(0x5eed);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace accel
