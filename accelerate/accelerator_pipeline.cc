// Accelerator::forward_backward (accelerate/accelerator.h): one micro-step's forward and backward
// on every mesh, a pipeline step under pp (Note [pp step] in parallel/pp_step.cc).
#include "accelerate/accelerator.h"

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "parallel/pipeline.h"

namespace accel {

Tensor Accelerator::forward_backward(nn::Module& model, const Tensor& inputs, const Tensor& targets,
                                     const LossFn& loss) {
  ACCEL_CHECK(static_cast<bool>(loss), ValueError, "forward_backward", "no loss function");
  const std::vector<dist::PipelineChunk>* chunks = strategy_->pipeline(model);
  if (!chunks) {
    Tensor l = loss(model(inputs), targets);
    backward(l);
    return l.detach();
  }
  // Note [pp step]: every microbatch's backward accumulates locally; the stage's last one syncs
  // on a sync step (one backward over every parameter of a one-chunk stage, as the last
  // micro-batch of an accumulation window); a stage of several chunks syncs with a backward of
  // zero over its parameters after the last one.
  const bool sync = sync_gradients_ && !no_sync_;
  const bool one_chunk = chunks->size() == 1;
  ACCEL_CHECK(one_chunk || strategy_->takes_partial_backwards(), ValueError, "forward_backward",
              "strategy '", strategy_->name(), "' syncs what each backward gives (ZeRO-1/2) or ",
              "releases parameters between backwards (ZeRO-3), and a pipeline stage of ",
              chunks->size(),
              " chunks runs one backward per chunk and microbatch, each reaching part of its "
              "parameters: run AcceleratorConfig::pipeline with chunks = 1 (GPipe or 1F1B), or "
              "the ddp strategy");
  dist::PipelineOptions o;
  o.schedule = config_.pipeline.schedule;
  o.microbatches = config_.pipeline.microbatches;
  o.before_backward = [this, sync, one_chunk](bool last) {
    strategy_->set_sync(sync && one_chunk && last);
  };
  o.backward_loss = [this](const Tensor& l) { return loss_for_backward(l); };
  // The stages' forwards run in the caller's autocast scope (acc.autocast() around this call),
  // their backwards outside it (pipeline_step suspends it).
  // Inside the Accelerator's backward until this returns or throws; the engine's sync setting
  // back to the step's.
  struct Restore {
    Accelerator& acc;
    bool sync, was_inside;
    ~Restore() {
      acc.backward_flags_->in_accelerator_backward = was_inside;
      acc.strategy_->set_sync(sync);
    }
  } restore{*this, sync, backward_flags_->in_accelerator_backward};
  backward_flags_->in_accelerator_backward = true;
  const dist::PipelineResult res =
      dist::pipeline_step(*chunks, mesh_->group("pp"), inputs, targets, loss, o);
  if (sync && !one_chunk) {
    AutocastSuspend no_autocast;
    strategy_->set_sync(true);
    Tensor zero;
    for (const Tensor& p : model.parameters())
      if (p.requires_grad() && p.numel() > 0) {
        Tensor z = mul(p.reshape({-1}).narrow(0, 0, 1), 0.0).sum();
        zero = zero.defined() ? add(zero, z) : z;
      }
    if (zero.defined()) zero.backward();
  }
  return scalar_tensor(res.loss, TensorOptions(kFloat64));
}

}  // namespace accel
