// reinforce: pytorch/examples reinforcement_learning/reinforce.py on the built-in CartPole of
// examples/reinforce.h (no gym): REINFORCE with a 4-128-2 policy and Adam (lr 1e-2) until the
// running reward passes CartPole-v1's threshold (475).
//
//   build/examples/reinforce [--gamma 0.99] [--seed 543] [--log-interval 10]
//
// The original ignores gym's 500-step truncation (`state, reward, done, _, _`) and plays on; here
// an episode ends at termination or at 500 steps, as CartPole-v1 defines it.
#include <chrono>
#include <cstdio>

#include "examples/common.h"
#include "examples/reinforce.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  double gamma = 0.99;
  uint64_t seed = 543;
  int64_t log_interval = 10, max_episodes = 10000;
  int threads = 1;
  CLI::App app("PyTorch's REINFORCE example on a built-in CartPole", "reinforce");
  app.add_option("--gamma", gamma, "discount factor")->capture_default_str();
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--log-interval", log_interval, "interval between training status logs")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-episodes", max_episodes, "give up after this many episodes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "OpenMP threads (a 4-128-2 net: 1 is fastest)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  return run_example(app, argc, argv, [&] {
    omp_set_num_threads(threads);
    reinforce::CartPole env(seed);
    manual_seed(seed);
    reinforce::Policy policy;
    optim::AdamOptions ao;
    ao.lr(1e-2);
    optim::Adam optimizer(policy.parameters(), ao);

    const auto t0 = std::chrono::steady_clock::now();
    double running_reward = 10;
    int64_t total_steps = 0;
    for (int64_t i_episode = 1; i_episode <= max_episodes; ++i_episode) {
      reinforce::CartPole::State state = env.reset();
      double ep_reward = 0;
      int t = 1;
      for (; t < 10000; ++t) {
        const int64_t action = reinforce::select_action(policy, state);
        const auto r = env.step(action);
        state = r.state;
        policy.rewards.push_back(r.reward);
        ep_reward += r.reward;
        if (r.terminated || r.truncated) break;
      }
      total_steps += t;
      running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward;
      reinforce::finish_episode(policy, optimizer, gamma);
      if (i_episode % log_interval == 0) {
        std::printf("Episode %lld\tLast reward: %.2f\tAverage reward: %.2f\n",
                    static_cast<long long>(i_episode), ep_reward, running_reward);
        std::fflush(stdout);
      }
      if (running_reward > reinforce::CartPole::kRewardThreshold) {
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf(
            "Solved! Running reward is now %g and the last episode runs to %d time steps! "
            "(%lld episodes, %lld steps, %.1fs, %.3f ms/step)\n",
            running_reward, t, static_cast<long long>(i_episode),
            static_cast<long long>(total_steps), secs, 1000 * secs / double(total_steps));
        return 0;
      }
    }
    std::printf("not solved after %lld episodes (running reward %.2f)\n",
                static_cast<long long>(max_episodes), running_reward);
    return 1;
  });
}
