#!/usr/bin/python3
"""Writes tests/optim/optim_fixture.txt: PyTorch's trajectories for the optimizers and the
ReduceLROnPlateau scheduler that tests/optim/test_optim_torch.cc replays.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/optim/make_optim_fixture.py
The test never runs Python; it reads the committed text file. Every value is float64 written with
17 significant digits.

Lines:
  opt|<case>|<step>|<p1 values>|<p2 values>        parameters after each step (1-based)
  lbfgs|<case>|<step>|<loss returned>|<x values>   after each step(closure)
  plateau|<case>|<step>|<metric>|<lr of group 0>,<lr of group 1>
"""
import math
import os

import torch

torch.set_default_dtype(torch.float64)

P1 = [0.5, -1.0, 2.0, 0.0, -0.25]
P2 = [[0.3, -0.7], [1.2, 0.9]]
STEPS = 5


def fmt(vals):
    return ",".join("%.17g" % v for v in vals)


def loss_of(p1, p2):
    # sum(0.7 * p^3 / 3 + p) + sum(p2^2 * 0.5 - 0.3 * p2^3 / 3)
    return (p1.pow(3) * (0.7 / 3) + p1).sum() + (p2.pow(2) * 0.5 - p2.pow(3) * (0.3 / 3)).sum()


def trajectory(make):
    p1 = torch.tensor(P1, requires_grad=True)
    p2 = torch.tensor(P2, requires_grad=True)
    opt = make(p1, p2)
    rows = []
    for s in range(1, STEPS + 1):
        opt.zero_grad()
        loss_of(p1, p2).backward()
        opt.step()
        rows.append((s, p1.detach().flatten().tolist(), p2.detach().flatten().tolist()))
    return rows


def groups(p1, p2, lr0, wd0):
    # group 0: its own lr and weight decay; group 1: the optimizer's defaults
    return [{"params": [p1], "lr": lr0, "weight_decay": wd0}, {"params": [p2]}]


OPT_CASES = {
    "adadelta": lambda a, b: torch.optim.Adadelta(groups(a, b, 0.5, 0.1), lr=1.0, rho=0.9,
                                                  eps=1e-6, weight_decay=0.0),
    "adadelta_wd": lambda a, b: torch.optim.Adadelta(groups(a, b, 2.0, 0.0), lr=1.0, rho=0.8,
                                                     eps=1e-4, weight_decay=0.05),
    "adagrad": lambda a, b: torch.optim.Adagrad(groups(a, b, 0.2, 0.1), lr=0.1, lr_decay=0.01,
                                                weight_decay=0.0,
                                                initial_accumulator_value=0.1, eps=1e-10),
    "adagrad_plain": lambda a, b: torch.optim.Adagrad(groups(a, b, 0.05, 0.0), lr=0.1,
                                                      weight_decay=0.02),
    "rmsprop": lambda a, b: torch.optim.RMSprop(groups(a, b, 0.02, 0.1), lr=0.01, alpha=0.99,
                                                eps=1e-8),
    "rmsprop_momentum": lambda a, b: torch.optim.RMSprop(groups(a, b, 0.02, 0.1), lr=0.01,
                                                         alpha=0.9, eps=1e-6, momentum=0.8),
    "rmsprop_centered": lambda a, b: torch.optim.RMSprop(groups(a, b, 0.02, 0.0), lr=0.01,
                                                         alpha=0.95, weight_decay=0.05,
                                                         centered=True),
    "rmsprop_centered_momentum": lambda a, b: torch.optim.RMSprop(
        groups(a, b, 0.03, 0.1), lr=0.01, alpha=0.9, momentum=0.5, centered=True),
    "sgd_nesterov": lambda a, b: torch.optim.SGD(groups(a, b, 0.05, 0.1), lr=0.1, momentum=0.9,
                                                 nesterov=True),
}


def rosenbrock(x):
    # x: (4,) as two parameters a (2,), b (2,) concatenated
    return (100.0 * (x[1:] - x[:-1].pow(2)).pow(2) + (1.0 - x[:-1]).pow(2)).sum()


LBFGS_CASES = {
    "plain": dict(lr=0.05, max_iter=4, history_size=3),
    "strong_wolfe": dict(lr=1.0, max_iter=6, history_size=4, line_search_fn="strong_wolfe"),
    "strong_wolfe_eval": dict(lr=1.0, max_iter=20, max_eval=9, tolerance_grad=1e-9,
                              tolerance_change=1e-12, history_size=10,
                              line_search_fn="strong_wolfe"),
}
LBFGS_STEPS = 6


def lbfgs_rows(kw):
    a = torch.tensor([-1.2, 1.0], requires_grad=True)
    b = torch.tensor([0.8, -0.5], requires_grad=True)
    opt = torch.optim.LBFGS([a, b], **kw)

    def closure():
        opt.zero_grad()
        loss = rosenbrock(torch.cat([a, b]))
        loss.backward()
        return loss

    rows = []
    for s in range(1, LBFGS_STEPS + 1):
        loss = opt.step(closure)
        rows.append((s, float(loss), torch.cat([a, b]).detach().tolist()))
    return rows


METRICS = [1.0, 0.9, 0.95, 0.91, 0.92, 0.93, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.5, 0.51,
           0.52, 0.53, 0.54, 0.55, 0.56, 0.57, 0.58, 0.59, 0.6]
PLATEAU_CASES = {
    "min_rel": dict(mode="min", factor=0.5, patience=2, threshold=0.05, threshold_mode="rel",
                    cooldown=1, min_lr=[0.001, 0.02]),
    "min_abs": dict(mode="min", factor=0.1, patience=1, threshold=0.02, threshold_mode="abs",
                    cooldown=0, min_lr=0.0),
    "max_rel": dict(mode="max", factor=0.3, patience=3, threshold=1e-4, threshold_mode="rel",
                    cooldown=2, min_lr=0.004),
    "max_abs_eps": dict(mode="max", factor=0.9, patience=0, threshold=0.0, threshold_mode="abs",
                        cooldown=0, min_lr=0.0, eps=0.004),
}


def plateau_rows(kw):
    p = torch.zeros(1, requires_grad=True)
    q = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [p], "lr": 0.1}, {"params": [q], "lr": 0.05}], lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **kw)
    rows = []
    for s, m in enumerate(METRICS, 1):
        sched.step(m)
        rows.append((s, m, [g["lr"] for g in opt.param_groups]))
    return rows


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_fixture.txt")
    with open(out, "w") as f:
        f.write("# Generated by tests/optim/make_optim_fixture.py (torch %s).\n" % torch.__version__)
        f.write("# opt|case|step|p1|p2   lbfgs|case|step|loss|x   plateau|case|step|metric|lrs\n")
        for name, make in OPT_CASES.items():
            for s, a, b in trajectory(make):
                f.write("opt|%s|%d|%s|%s\n" % (name, s, fmt(a), fmt(b)))
        for name, kw in LBFGS_CASES.items():
            for s, loss, x in lbfgs_rows(kw):
                assert all(math.isfinite(v) for v in x), (name, x)
                f.write("lbfgs|%s|%d|%s|%s\n" % (name, s, fmt([loss]), fmt(x)))
        for name, kw in PLATEAU_CASES.items():
            for s, m, lrs in plateau_rows(kw):
                f.write("plateau|%s|%d|%s|%s\n" % (name, s, fmt([m]), fmt(lrs)))


if __name__ == "__main__":
    main()
