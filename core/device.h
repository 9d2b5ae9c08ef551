// Devices: CPU or CUDA:n.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace accel {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(int16_t(i)) {}  // NOLINT
  // Parses "cpu", "cuda", "cuda:1". Throws ValueError otherwise.
  static Device parse(const std::string& s);
  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  static constexpr Device cuda(int i = 0) { return Device(DeviceType::CUDA, i); }

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  constexpr bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  constexpr bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

constexpr Device kCPU = Device::cpu();

std::ostream& operator<<(std::ostream& os, const Device& d);
std::ostream& operator<<(std::ostream& os, DeviceType t);

}  // namespace accel
