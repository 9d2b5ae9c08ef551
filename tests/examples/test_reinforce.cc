// examples/reinforce.h against its PyTorch twin (tests/examples/torch_reinforce.py, which wrote
// reinforce_fixture.safetensors): reinforce.py's Policy in float64 from the same initial weights
// (twin.h), dropout off, the same CartPole episodes (each episode's start state and PyTorch's
// sampled actions replayed); every episode's length and policy loss, and the final weights,
// agree to 1e-10. Then the environment and the sampling path on their own.
#include <doctest.h>

#include <cmath>
#include <string>

#include "accel.h"
#include "examples/reinforce.h"
#include "tests/examples/twin.h"

using namespace accel;
using namespace accel::examples;

TEST_CASE("reinforce: REINFORCE episodes match PyTorch's reinforce.py") {
  const twin::Fixture fx("reinforce_fixture.safetensors");
  const int64_t episodes = std::stoll(fx.meta("episodes"));
  const double gamma = std::stod(fx.meta("gamma"));

  reinforce::Policy policy;
  twin::det_init(policy);
  policy.dropout->p = 0.0;
  CHECK(twin::checksum(policy) ==
        doctest::Approx(std::stod(fx.meta("init_checksum"))).epsilon(1e-12));
  optim::AdamOptions ao;
  ao.lr(1e-2);
  optim::Adam optimizer(policy.parameters(), ao);
  reinforce::CartPole env;
  int64_t next_action = 0;
  for (int64_t e = 0; e < episodes; ++e) {
    const Tensor start = fx["starts"][e];
    reinforce::CartPole::State state =
        env.reset_to({start[0].item(), start[1].item(), start[2].item(), start[3].item()});
    int64_t t = 1;
    for (; t < 10000; ++t) {
      REQUIRE(next_action < fx["actions"].numel());
      reinforce::select_action(policy, state, int64_t(fx.at("actions", next_action++)));
      const auto r = env.step(int64_t(fx.at("actions", next_action - 1)));
      state = r.state;
      policy.rewards.push_back(r.reward);
      if (r.terminated || r.truncated) break;
    }
    INFO("episode ", e);
    CHECK(t == int64_t(fx.at("lengths", e)));  // the same dynamics end it at the same step
    const double loss = reinforce::finish_episode(policy, optimizer, gamma);
    const double want = fx.at("losses", e);
    INFO("ours ", loss, ", torch ", want);
    CHECK(std::abs(loss - want) <= 1e-10 * std::max(1.0, std::abs(want)));
    CHECK(policy.rewards.empty());
    CHECK(policy.saved_log_probs.empty());
  }
  CHECK(next_action == fx["actions"].numel());
  const double want = std::stod(fx.meta("final_checksum"));
  CHECK(std::abs(twin::checksum(policy) - want) <= 1e-10 * std::abs(want));
}

TEST_CASE("reinforce: CartPole ends on the pole's angle, the cart's position or 500 steps") {
  reinforce::CartPole env(1);
  const auto s = env.reset();
  for (double v : s) CHECK(std::abs(v) <= 0.05);
  // Always pushing right: the pole falls left (theta < -12 degrees) within a few dozen steps.
  int steps = 0;
  reinforce::CartPole::Step r{};
  do r = env.step(1), ++steps;
  while (!r.terminated && steps < 500);
  CHECK(r.terminated);
  CHECK(steps < 100);
  CHECK(r.state[2] < -12 * 2 * M_PI / 360);
  // A hand-written balancing rule (push towards where the pole and cart are heading) keeps it
  // up: the episode is truncated at 500 steps, not terminated.
  r.state = env.reset_to({0.01, 0, 0.02, 0});
  for (steps = 1;; ++steps) {
    const auto& [x, x_dot, theta, theta_dot] = r.state;
    r = env.step(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0 ? 1 : 0);
    if (r.terminated || r.truncated) break;
  }
  CHECK_FALSE(r.terminated);
  CHECK(r.truncated);
  CHECK(steps == reinforce::CartPole::kMaxSteps);
}

TEST_CASE("reinforce: sampled actions follow the policy's probabilities") {
  manual_seed(5);
  reinforce::Policy policy;
  policy.eval();  // no dropout: the probabilities are fixed
  const reinforce::CartPole::State s{0.01, -0.02, 0.03, 0.04};
  const double p1 = [&] {
    NoGradGuard ng;
    return policy
        .forward(
            tensor(std::vector<double>(s.begin(), s.end()), {1, 4}, TensorOptions(kFloat32)))[0][1]
        .item();
  }();
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) ones += int(reinforce::select_action(policy, s) == 1);
  CHECK(policy.saved_log_probs.size() == size_t(n));
  // 4000 draws: the frequency is within 5 standard deviations of p1.
  CHECK(std::abs(double(ones) / n - p1) < 5 * std::sqrt(p1 * (1 - p1) / n));
  // The saved log-probability is that of the action taken.
  CHECK(std::exp(policy.saved_log_probs.back().item()) ==
        doctest::Approx(reinforce::select_action(policy, s, 1) == 1 ? p1 : 1 - p1));
}
