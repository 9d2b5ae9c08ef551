// Seeded random number generation. The default generator is process-global and seeded with
// manual_seed(); results depend only on the seed and the order of calls, never on threads.
#pragma once

#include <cstdint>
#include <mutex>
#include <random>
#include <string>

namespace accel {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) { manual_seed(seed); }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    engine_.seed(seed);
    has_cached_normal_ = false;  // else a seed's normals would depend on what came before
  }
  uint64_t initial_seed() const { return seed_; }
  uint64_t next_u64() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double next_double() { return double(engine_() >> 11) * 0x1.0p-53; }
  float next_float() { return float(engine_() >> 40) * 0x1.0p-24f; }
  // Standard normal (Box-Muller, both values used).
  double next_normal();
  std::mt19937_64& engine() { return engine_; }
  std::mutex& mutex() { return mu_; }

  // Full state for checkpoints: text form of the engine plus the cached normal.
  std::string state() const;
  void set_state(const std::string& s);

 private:
  uint64_t seed_ = 0;
  std::mt19937_64 engine_;
  bool has_cached_normal_ = false;
  double cached_normal_ = 0;
  std::mutex mu_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace accel
