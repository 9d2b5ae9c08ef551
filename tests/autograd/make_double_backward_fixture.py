#!/usr/bin/python3
"""Writes tests/autograd/double_backward_fixture.txt: PyTorch's results for the double-backward
scenarios that tests/autograd/test_double_backward.cc replays, all in float64:

  wgan_gp   a WGAN-GP critic step: a conv critic (conv 3x3 stride 2 -> LeakyReLU(0.2) -> conv 3x3
            stride 2 -> LeakyReLU(0.2) -> linear), the gradient penalty
            ((||grad_x D(x_hat)||_2 - 1)^2).mean() on x_hat = eps real + (1 - eps) fake, and the
            critic loss D(fake).mean() - D(real).mean() + 10 gp, backward to the parameters.
  maml      one MAML inner SGD step with create_graph on two tasks (an MLP Linear -> ReLU ->
            Linear: cross_entropy on a classification task, mse_loss on a regression task), the
            query losses on the adapted weights, and the meta-gradients w.r.t. the initial weights.
  hvp       a Hessian-vector product: f(x) = sum(tanh(W2 softplus(W1 x + b1))) with softplus
            written log1p(exp(z)) (accel has no softplus op), Hv = grad(grad(f, x) . v, x), and
            the same w.r.t. W1.

Run with Debian's python3-torch:  /usr/bin/python3 tests/autograd/make_double_backward_fixture.py
The test never runs Python; it reads the committed text file.

One tensor per line:  name|shape|values   (values comma-separated; shape "" for a 0-dim tensor)
"""
import os

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
gen = torch.Generator().manual_seed(36)
rows = []


def rnd(*shape, lo=-1.0, hi=1.0):
    return lo + (hi - lo) * torch.rand(shape, generator=gen)


def put(name, t):
    t = t.detach()
    rows.append("|".join([name, ",".join(str(d) for d in t.shape),
                          ",".join(repr(float(v)) for v in t.reshape(-1).tolist())]))


# ---- WGAN-GP, conv critic ----
N = 3
p = {
    "c1w": rnd(4, 1, 3, 3, lo=-0.5, hi=0.5), "c1b": rnd(4, lo=-0.1, hi=0.1),
    "c2w": rnd(6, 4, 3, 3, lo=-0.3, hi=0.3), "c2b": rnd(6, lo=-0.1, hi=0.1),
    "lw": rnd(1, 24, lo=-0.3, hi=0.3), "lb": rnd(1, lo=-0.1, hi=0.1),
}
real, fake, eps = rnd(N, 1, 8, 8), rnd(N, 1, 8, 8), rnd(N, 1, 1, 1, lo=0.0, hi=1.0)
for k, v in p.items():
    put("wgan." + k, v)
    v.requires_grad_(True)
put("wgan.real", real)
put("wgan.fake", fake)
put("wgan.eps", eps)


def critic(x):
    h = F.leaky_relu(F.conv2d(x, p["c1w"], p["c1b"], stride=2, padding=1), 0.2)  # (N, 4, 4, 4)
    h = F.leaky_relu(F.conv2d(h, p["c2w"], p["c2b"], stride=2, padding=1), 0.2)  # (N, 6, 2, 2)
    return F.linear(h.reshape(h.shape[0], -1), p["lw"], p["lb"])  # (N, 1)


x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
d_hat = critic(x_hat)
(g,) = torch.autograd.grad(d_hat, x_hat, torch.ones_like(d_hat), create_graph=True)
gp = ((g.reshape(N, -1).norm(2, dim=1) - 1) ** 2).mean()
loss = critic(fake).mean() - critic(real).mean() + 10 * gp
loss.backward()
put("wgan.gp", gp)
put("wgan.loss", loss)
for k, v in p.items():
    put("wgan.grad." + k, v.grad)

# ---- MAML: one inner step with create_graph, two tasks ----
m = {"w1": rnd(16, 4, lo=-0.5, hi=0.5), "b1": rnd(16, lo=-0.1, hi=0.1),
     "w2": rnd(3, 16, lo=-0.5, hi=0.5), "b2": rnd(3, lo=-0.1, hi=0.1)}
for k, v in m.items():
    put("maml." + k, v)
    v.requires_grad_(True)
names = ["w1", "b1", "w2", "b2"]
xs_c, ys_c = rnd(5, 4), torch.randint(0, 3, (5,), generator=gen)
xq_c, yq_c = rnd(6, 4), torch.randint(0, 3, (6,), generator=gen)
xs_r, ys_r = rnd(5, 4), rnd(5, 3)
xq_r, yq_r = rnd(6, 4), rnd(6, 3)
for k, v in [("xs_c", xs_c), ("ys_c", ys_c), ("xq_c", xq_c), ("yq_c", yq_c), ("xs_r", xs_r),
             ("ys_r", ys_r), ("xq_r", xq_r), ("yq_r", yq_r)]:
    put("maml." + k, v.to(torch.float64))


def mlp(x, w):
    return F.linear(F.relu(F.linear(x, w[0], w[1])), w[2], w[3])


alpha = 0.4
params = [m[k] for k in names]
meta_loss = 0
for loss_fn, xs, ys, xq, yq, tag in [(F.cross_entropy, xs_c, ys_c, xq_c, yq_c, "c"),
                                     (F.mse_loss, xs_r, ys_r, xq_r, yq_r, "r")]:
    inner = loss_fn(mlp(xs, params), ys)
    grads = torch.autograd.grad(inner, params, create_graph=True)
    adapted = [w - alpha * gw for w, gw in zip(params, grads)]
    outer = loss_fn(mlp(xq, adapted), yq)
    put("maml.outer_" + tag, outer)
    meta_loss = meta_loss + outer
meta = torch.autograd.grad(meta_loss, params)
for k, gk in zip(names, meta):
    put("maml.meta." + k, gk)

# ---- Hessian-vector product ----
h = {"w1": rnd(6, 5), "b1": rnd(6, lo=-0.2, hi=0.2), "w2": rnd(4, 6)}
x, v, vw = rnd(5), rnd(5), rnd(6, 5)
for k, t in h.items():
    put("hvp." + k, t)
put("hvp.x", x)
put("hvp.v", v)
put("hvp.vw", vw)
x.requires_grad_(True)
h["w1"].requires_grad_(True)


def f(x, w1):
    z = w1 @ x + h["b1"]
    return torch.tanh(h["w2"] @ torch.log1p(torch.exp(z))).sum()


y = f(x, h["w1"])
(gx,) = torch.autograd.grad(y, x, create_graph=True)
(hv,) = torch.autograd.grad((gx * v).sum(), x)
put("hvp.f", y)
put("hvp.grad", gx)
put("hvp.hv", hv)
(gw,) = torch.autograd.grad(f(x, h["w1"]), h["w1"], create_graph=True)
(hvw,) = torch.autograd.grad((gw * vw).sum(), h["w1"])
put("hvp.hv_w1", hvw)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "double_backward_fixture.txt")
with open(path, "w") as out:
    out.write("# Generated by tests/autograd/make_double_backward_fixture.py (torch %s).\n"
              % torch.__version__)
    out.write("# name|shape|values (float64)\n")
    for r in rows:
        out.write(r + "\n")
print("wrote", len(rows), "tensors to", path)
