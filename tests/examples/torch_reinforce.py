#!/usr/bin/python3
"""PyTorch twin of examples/reinforce.cc (pytorch/examples reinforcement_learning/reinforce.py):
writes tests/examples/reinforce_fixture.safetensors for tests/examples/test_reinforce.cc.

    /usr/bin/python3 tests/examples/torch_reinforce.py           # the fixture
    /usr/bin/python3 tests/examples/torch_reinforce.py --time    # the real run, timed

The check: reinforce.py's Policy in float64 with twin.det_init weights and dropout off, Adam
(lr 1e-2), EPISODES episodes on the CartPole below (the same arithmetic as examples/reinforce.h,
expression by expression), actions drawn by torch's Categorical. Stored: each episode's initial
state, the actions taken (all episodes, concatenated), each episode's length and policy loss,
and the checksum of the initial and final weights. The C++ test replays the actions.
"""
import math
import os
import sys
import time
from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

EPISODES, GAMMA = 5, 0.99


class CartPole:
    """gym's CartPole-v1, written as examples/reinforce.h's CartPole."""
    max_steps, reward_threshold = 500, 475.0

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def reset(self):
        return self.reset_to(self.rng.uniform(-0.05, 0.05, size=4))

    def reset_to(self, s):
        self.state = [float(v) for v in s]
        self.steps = 0
        return np.array(self.state)

    def step(self, action):
        gravity, masscart, masspole = 9.8, 1.0, 0.1
        total_mass, length = masspole + masscart, 0.5
        polemass_length, force_mag, tau = masspole * length, 10.0, 0.02
        theta_threshold, x_threshold = 12 * 2 * math.pi / 360, 2.4
        x, x_dot, theta, theta_dot = self.state
        force = force_mag if action == 1 else -force_mag
        costheta, sintheta = math.cos(theta), math.sin(theta)
        temp = (force + polemass_length * theta_dot * theta_dot * sintheta) / total_mass
        thetaacc = (gravity * sintheta - costheta * temp) / (
            length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass))
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        x = x + tau * x_dot
        x_dot = x_dot + tau * xacc
        theta = theta + tau * theta_dot
        theta_dot = theta_dot + tau * thetaacc
        self.state = [x, x_dot, theta, theta_dot]
        self.steps += 1
        terminated = x < -x_threshold or x > x_threshold or theta < -theta_threshold \
            or theta > theta_threshold
        return np.array(self.state), 1.0, terminated, self.steps >= self.max_steps


class Policy(nn.Module):  # reinforce.py's, verbatim
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)
        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


eps = np.finfo(np.float32).eps.item()


def select_action(policy, state, dtype):
    state = torch.from_numpy(state).to(dtype).unsqueeze(0)
    probs = policy(state)
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode(policy, optimizer):
    R = 0
    policy_loss = []
    returns = deque()
    for r in policy.rewards[::-1]:
        R = r + GAMMA * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for log_prob, R in zip(policy.saved_log_probs, returns):
        policy_loss.append(-log_prob * R)
    optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]
    return policy_loss.item()


def run_episode(env, policy, dtype, actions=None):
    state = env.reset()
    first = state.copy()
    for t in range(1, 10000):
        action = select_action(policy, state, dtype)
        if actions is not None:
            actions.append(action)
        state, reward, terminated, truncated = env.step(action)
        policy.rewards.append(reward)
        if terminated or truncated:
            break
    return first, t


def fixture():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(543)
    env = CartPole(543)
    policy = Policy()
    twin.det_init(policy)
    policy.dropout.p = 0.0
    init = twin.checksum(policy)
    optimizer = optim.Adam(policy.parameters(), lr=1e-2)
    starts, lengths, losses, actions = [], [], [], []
    for _ in range(EPISODES):
        first, t = run_episode(env, policy, torch.float64, actions)
        starts.append(torch.from_numpy(first))
        lengths.append(t)
        losses.append(finish_episode(policy, optimizer))
    print("lengths", lengths, "losses", losses)
    twin.write_safetensors(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "reinforce_fixture.safetensors"),
        {"starts": torch.stack(starts), "lengths": torch.tensor(lengths, dtype=torch.int64),
         "actions": torch.tensor(actions, dtype=torch.int64), "losses": torch.tensor(losses)},
        {"init_checksum": repr(init), "final_checksum": repr(twin.checksum(policy)),
         "episodes": str(EPISODES), "gamma": repr(GAMMA)})


def time_run(seed=543):
    """The real program (float32, dropout 0.6) until solved: episodes, steps, ms per env step."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    env = CartPole(seed)
    policy = Policy()
    optimizer = optim.Adam(policy.parameters(), lr=1e-2)
    running_reward, steps, t0 = 10, 0, time.perf_counter()
    for i_episode in range(1, 10001):
        _, t = run_episode(env, policy, torch.float32)
        steps += t
        running_reward = 0.05 * t + 0.95 * running_reward
        finish_episode(policy, optimizer)
        if running_reward > CartPole.reward_threshold:
            break
    dt = time.perf_counter() - t0
    print(f"torch {torch.__version__}, 1 thread: solved={running_reward > 475} after {i_episode} "
          f"episodes, {steps} steps, {dt:.1f}s, {1000 * dt / steps:.3f} ms/step")


if __name__ == "__main__":
    time_run() if "--time" in sys.argv else fixture()
