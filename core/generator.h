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
  // The same state as a plain copy (~2.5 KB, no text): activation checkpointing saves and
  // restores it around every recompute, where state()/set_state() cost ~40-55 us each.
  struct Snapshot {
    std::mt19937_64 engine;
    uint64_t seed = 0;
    bool has_cached_normal = false;
    double cached_normal = 0;
  };
  Snapshot snapshot() const { return {engine_, seed_, has_cached_normal_, cached_normal_}; }
  void restore(const Snapshot& s) {
    engine_ = s.engine;
    seed_ = s.seed;
    has_cached_normal_ = s.has_cached_normal;
    cached_normal_ = s.cached_normal;
  }

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
