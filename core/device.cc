#include "core/device.h"

#include <ostream>
#include <string>

#include "core/error.h"

namespace accel {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    ACCEL_CHECK(
        !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos && idx.size() < 5,
        ValueError, "device", "invalid device string '", s, "'");
    return Device::cuda(std::stoi(idx));
  }
  ACCEL_THROW(ValueError, "device", "invalid device string '", s,
              "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }
std::ostream& operator<<(std::ostream& os, DeviceType t) {
  return os << (t == DeviceType::CPU ? "cpu" : "cuda");
}

}  // namespace accel
