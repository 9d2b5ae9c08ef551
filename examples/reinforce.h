// pytorch/examples reinforcement_learning/reinforce.py, ported: REINFORCE on a built-in CartPole
// (gym's CartPole-v1 dynamics), callable from the program (examples/reinforce.cc) and from its
// PyTorch twin test (tests/examples/test_reinforce.cc).
//
//   Policy: affine1 4->128, dropout 0.6, ReLU, affine2 128->2, softmax    (1, 4) -> (1, 2)
//   select_action: a ~ Categorical(probs), log_prob(a) saved
//   finish_episode: discounted returns R_t = r_t + gamma R_{t+1}, normalised
//                   (R - mean) / (std + eps_float32), loss = sum_t -log_prob_t * R_t, Adam step
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "accel.h"

namespace accel::examples::reinforce {

// gym's classic CartPole (CartPole-v1: 500 steps at most, solved at a running reward of 475):
// a pole hinged on a cart pushed left (action 0) or right (action 1) with 10 N; reward 1 per
// step, the episode ends when the pole leans past 12 degrees or the cart leaves [-2.4, 2.4].
// Explicit Euler with tau = 0.02 s, as gym's default.
class CartPole {
 public:
  static constexpr int kMaxSteps = 500;
  static constexpr double kRewardThreshold = 475.0;
  using State = std::array<double, 4>;  // x, x_dot, theta, theta_dot

  explicit CartPole(uint64_t seed = 0) : rng_(seed) {}

  // Each of the four state variables uniform in [-0.05, 0.05).
  State reset() {
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    State s;
    for (double& v : s) v = u(rng_);
    return reset_to(s);
  }
  State reset_to(const State& s) {
    state_ = s;
    steps_ = 0;
    return state_;
  }

  struct Step {
    State state;
    double reward;
    bool terminated, truncated;
  };
  Step step(int64_t action) {
    constexpr double gravity = 9.8, masscart = 1.0, masspole = 0.1;
    constexpr double total_mass = masspole + masscart, length = 0.5;  // half the pole's length
    constexpr double polemass_length = masspole * length, force_mag = 10.0, tau = 0.02;
    const double theta_threshold = 12 * 2 * M_PI / 360, x_threshold = 2.4;
    auto& [x, x_dot, theta, theta_dot] = state_;
    const double force = action == 1 ? force_mag : -force_mag;
    const double costheta = std::cos(theta), sintheta = std::sin(theta);
    const double temp = (force + polemass_length * theta_dot * theta_dot * sintheta) / total_mass;
    const double thetaacc = (gravity * sintheta - costheta * temp) /
                            (length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass));
    const double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    x = x + tau * x_dot;
    x_dot = x_dot + tau * xacc;
    theta = theta + tau * theta_dot;
    theta_dot = theta_dot + tau * thetaacc;
    ++steps_;
    const bool terminated =
        x < -x_threshold || x > x_threshold || theta < -theta_threshold || theta > theta_threshold;
    return {state_, 1.0, terminated, steps_ >= kMaxSteps};
  }

 private:
  std::mt19937_64 rng_;
  State state_{};
  int steps_ = 0;
};

class Policy : public nn::Module {
 public:
  Policy()
      : affine1(register_module("affine1", std::make_shared<nn::Linear>(4, 128))),
        dropout(register_module("dropout", std::make_shared<nn::Dropout>(0.6))),
        affine2(register_module("affine2", std::make_shared<nn::Linear>(128, 2))) {}

  // x: (B, 4) -> action probabilities (B, 2)
  Tensor forward(const Tensor& input) override {
    Tensor x = affine1->forward(input);
    x = dropout->forward(x);
    x = relu(x);
    const Tensor action_scores = affine2->forward(x);
    return softmax(action_scores, 1);
  }

  nn::Child<nn::Linear> affine1;
  nn::Child<nn::Dropout> dropout;
  nn::Child<nn::Linear> affine2;
  std::vector<Tensor> saved_log_probs;  // (1) each, one per step of the episode
  std::vector<double> rewards;
};

// Samples an action from the policy at `state` (or takes `forced`, the twin test's replay of
// PyTorch's samples) and saves its log-probability.
inline int64_t select_action(Policy& policy, const CartPole::State& state,
                             std::optional<int64_t> forced = std::nullopt) {
  const DType dtype = policy.affine1->weight.dtype();
  const Tensor s =
      tensor(std::vector<double>(state.begin(), state.end()), {1, 4}, TensorOptions(dtype));
  const Tensor probs = policy.forward(s);  // (1, 2)
  const auto m = distributions::Categorical::from_probs(probs);
  const Tensor action =
      forced ? tensor(std::vector<int64_t>{*forced}, {1}, TensorOptions(kInt64)) : m.sample();
  policy.saved_log_probs.push_back(m.log_prob(action));
  return int64_t(action.item());
}

// The REINFORCE update from the episode's saved log-probabilities and rewards (then cleared).
// Returns the policy loss.
inline double finish_episode(Policy& policy, optim::Optimizer& optimizer, double gamma) {
  const double eps = double(std::numeric_limits<float>::epsilon());  // np.finfo(np.float32).eps
  const int64_t n = int64_t(policy.rewards.size());
  std::vector<double> returns(static_cast<size_t>(n));
  double R = 0;
  for (int64_t t = n - 1; t >= 0; --t) {
    R = policy.rewards[size_t(t)] + gamma * R;
    returns[size_t(t)] = R;
  }
  // torch.tensor(returns) is float32 in the original (the policy's dtype here: float64 in tests).
  Tensor ret = tensor(returns, {n}, TensorOptions(kFloat64)).to(policy.affine1->weight.dtype());
  ret = div(sub(ret, mean(ret)), add(std_dev(ret), eps));
  optimizer.zero_grad();
  const Tensor policy_loss = sum(mul(neg(cat(policy.saved_log_probs)), ret));
  policy_loss.backward();
  optimizer.step();
  policy.rewards.clear();
  policy.saved_log_probs.clear();
  return policy_loss.item();
}

}  // namespace accel::examples::reinforce
