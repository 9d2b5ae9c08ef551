// Activation checkpointing (torch.utils.checkpoint): trade compute for memory by not keeping a
// segment's intermediate activations; the backward recomputes them.
//
//   // y = block(x), but only x is kept after the forward:
//   Tensor y = autograd::checkpoint([&](const Tensor& in) { return block->forward(in); }, x);
//   loss(y).backward();   // block's forward runs again here, then its backward
//
//   // several inputs / outputs:
//   std::vector<Tensor> ys = autograd::checkpoint(
//       [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; },
//       {a, b});
//
// Gradients of the inputs and of every parameter used inside fn are bit-identical to the run
// without checkpointing (same ops, same order, same dropout masks); the parameters' .grad is
// accumulated and their post-accumulate hooks fire as usual (DDP / ZeRO hang on them). Details,
// limits and costs: Note [activation checkpointing] below and docs/checkpointing.md.
//
// Note [activation checkpointing]
// Forward (grad mode on and some input requires grad): fn runs under NoGradGuard, so no graph
// and no saved activations; one CheckpointNode becomes the grad_fn of the outputs (detached
// aliases of what fn returned, so fn returning an input or a parameter never rewires that
// tensor's history). The node keeps fn, detached aliases of the inputs (with their storage
// versions), the default generator's state, the tensor-parallel layout random ops see
// (core/sharded_random.h) and the autocast state.
// When no input requires grad (the first segment of a model fed token ids), whether a parameter
// inside fn requires grad is unknown without running it with grad mode on, so fn runs once with
// grad mode on (a probe): if no output requires grad, the outputs are returned as they are (fn
// was called, nothing to differentiate); otherwise the recorded graph is dropped (the outputs are
// detached) and the node is attached as above. The probe holds one segment's activations during
// that segment's forward only, as the recompute does in backward.
// Backward (CheckpointNode::apply, called by the engine with one gradient per output): checks
// that no input was modified in place since (storage version), sets the default generator to its
// forward-time state and autocast to its forward-time state, turns grad mode on and runs fn
// again on fresh leaves that alias the inputs; then puts the generator back to its state before
// the recompute (the training run's random stream is not shifted) and runs a nested
// run_backward from the recomputed outputs with the incoming gradients. That nested backward
// accumulates into the parameters' .grad (firing their hooks) and into the fresh input leaves,
// whose .grad the node returns as the inputs' gradients. The engine keeps all of its state
// local to one execute() call, so a backward inside a node's backward needs no engine change,
// and nested checkpoints work: an inner checkpoint runs plainly in the outer forward (grad mode
// is off there) and records its own node during the outer recompute.
// Why bit-identical: the engine runs nodes in decreasing sequence number (Note [backward order]),
// which is a topological order; the recompute creates the segment's nodes in the same relative
// order, so every gradient buffer inside the segment receives its contributions in the same
// order as without checkpointing, and the ops see the same values (ops compute the same in
// grad and no-grad mode; dropout draws the same mask from the restored generator).
// Limits (as torch's reentrant variant):
//   - An input also used outside the segment, and used twice or more inside it, receives its
//     inner contributions summed first and then added to the outer ones: the same value up to
//     float addition order (bit-identical when there are only two contributions in all).
//   - A parameter used in several checkpointed segments, or inside one and outside it (tied
//     weights), gets one accumulation, and one post-accumulate hook call, per use site (without
//     checkpointing: one per backward); DDP / ZeRO-1/2 then stop with "arrived twice in one
//     backward" (ZeRO-3 units count each parameter once and reduce the root, where a tied one
//     lives, at the end of backward: dist/fsdp.h).
//   - autograd::grad() through a segment also accumulates into .grad of the parameters used
//     inside it (the recompute's backward is a plain backward), and reports them as unused.
//   - With create_graph (Note [double backward] in autograd/engine.h) the recompute runs on
//     stand-ins of the inputs (Note [stand-ins] in autograd/function.h) and its backward records
//     a graph: the inputs' gradients and the parameters' .grad have history (torch's
//     non-reentrant checkpoint supports double backward the same way).
//   - Only the default generator is saved and restored; a dropout given its own Generator* draws
//     from it unrestored.
//   - fn and what it captures must stay valid until the backward (the node holds a copy of fn).
//   - An output that the recompute finds not depending on anything gets no gradient; if no
//     output does, the backward throws ValueError.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace accel::autograd {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs fn(inputs) without keeping its activations; backward recomputes them (Note [activation
// checkpointing]). Outside grad mode, or when nothing fn uses requires grad, it is fn(inputs).
// Throws ValueError when fn returns an undefined tensor.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);
// One input, one output.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

// True on this thread while a checkpoint's backward runs its fn again (the recompute), false in
// the first forward. For code with forward hooks that must tell the two apart: a ZeRO-3 unit
// that frees its gathered parameters after its forward must keep them after the recompute,
// because the backward of the recomputed graph runs right after it and reads them.
bool checkpoint_recomputing();

}  // namespace accel::autograd
