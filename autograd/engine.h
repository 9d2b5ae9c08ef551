// Reverse-mode engine. See autograd/function.h for nodes and how ops record history.
//
// Note [backward order]
// backward() counts, for every node reachable from the roots, how many edges point at it; a node
// runs once all its incoming gradients have arrived. Among ready nodes the most recently created
// (highest sequence number) runs first, which mirrors the forward in reverse: the last layer's
// parameters get their gradients first, which is what DDP's bucket order relies on.
// Backward formulas run with grad mode off, unless create_graph (Note [double backward]).
//
// Note [double backward]
// Tensor::backward(gradient, retain_graph, create_graph), autograd::backward and
// autograd::grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused) take
// libtorch's arguments; retain_graph defaults to create_graph. With create_graph the engine runs
// every backward formula with grad mode on, so the gradients it returns are tensors with history
// (a graph of the backward itself) and can be differentiated again: gradient penalties, MAML,
// Hessian-vector products. What makes that right:
//   - saved tensors carry history: an input is saved as itself, an output gets the running node
//     as grad_fn when unpacked (Note [saved tensors and double backward] in function.h);
//   - leaves' .grad and retain_grad() slots keep history: a differentiable copy, then
//     out-of-place sums (torch's AccumulateGrad under grad mode);
//   - every backward formula is made of differentiable ops when creating_graph() is true. Most
//     always are. A fused op whose backward is a kernel keeps the kernel for the plain backward
//     and switches, under create_graph only, to a differentiable form: an explicit formula
//     (softmax, tanh, relu, gelu, silu, cross_entropy, nll_loss, embedding, prod), the adjoint op
//     (conv2d's input gradient is conv_transpose2d and its weight gradient a conv2d of the input
//     with the output gradient, and the other way round; avg_pool2d's backward is a transposed
//     convolution with a constant kernel; max_pool2d's a scatter to the window maxima), or the
//     op's composed form recomputed on stand-ins of its inputs and differentiated (Note [double
//     backward by recompute] in function.h: layer_norm, rms_norm, group_norm, fused attention, the
//     fused LSTM / GRU layers); in-place nodes through views (CopySlices, AsStridedBackward) gather
//     and scatter with index ops;
//   - the few that cannot (the one-node autocast GEMM routes) throw
//     throw_no_double_backward's ValueError naming the op, listed in docs/design.md.
// Without create_graph nothing of this runs: grad mode is off, every formula takes its fused
// path, saved tensors unpack as before, and the engine is the same code.
// As in torch, backward(create_graph) leaves a reference cycle between a leaf and its .grad (the
// gradient's graph saves the leaf) until .grad is reset (zero_grad(), set_grad(Tensor())):
// autograd::grad(create_graph) does not touch .grad and has none.
//
// Note [end-of-backward callbacks]
// A hook that starts work during a backward (a gradient hook that launches a collective) can ask
// for a function to run once the backward is over: queue_callback(fn), as PyTorch's
// Variable._execution_engine.queue_callback. Callbacks run on the thread that ran the backward,
// in the order queued, after the outermost backward of that thread has finished (a backward run
// inside one, such as an activation checkpoint's recompute, does not end it), before
// Tensor::backward / autograd::grad return, with the caller's grad mode. They run whether the
// backward succeeded or threw (work a hook started must be finished either way), and are told
// which (`succeeded`); an exception of a callback propagates from backward() unless the backward
// itself threw, whose exception wins.
#pragma once

#include <functional>

#include "autograd/function.h"
#include "core/tensor.h"

namespace accel::autograd {

// Number of nodes created so far (sequence numbers); used by tests and DDP bucketing.
uint64_t current_sequence_nr();

// Note [end-of-backward callbacks]. ValueError when no backward runs on this thread.
using BackwardCallback = std::function<void(bool succeeded)>;
void queue_callback(BackwardCallback fn);
// Whether a backward (or autograd::grad) is running on this thread.
bool backward_running();

}  // namespace accel::autograd
