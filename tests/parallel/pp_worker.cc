// Worker for the pipeline tests (test_pipeline.cc): `pp_worker <scenario>`, one process per rank
// under the env contract; the pp group is the world. Exit 0 = passed on this rank ("ok
// <scenario>" printed), 1 = a check failed, 2 = unexpected exception.
//   train   a float64 MLP of 8 Linear + tanh layers cut into world x v chunks (v = 1 for GPipe and
//           1F1B, 2 for interleaved 1F1B; 4 and 8 microbatches): every gradient of this rank's
//           chunks and the loss equal one process's backward of the batch's mean loss (1e-12)
//   gpt     examples/models.h's Gpt cut by dist::pipeline_chunks (even and at a split point; 1F1B,
//           GPipe, interleaved at pp 2): loss and every gradient equal one process's (1e-12), each
//           parameter's gradient on exactly one rank; bad splits refused
//   errors  ranks that disagree on the microbatches, and a batch that does not split, are clear
//           errors on every rank
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "examples/models.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "parallel/pipeline.h"
#include "tests/common/tensors.h"
#include "tests/common/worker_check.h"

using namespace accel;
using namespace accel::dist;
using accel::test::g_failures;
using accel::test::g_rank;
using accel::test::max_abs_diff;
using accel::test::thrown_message;

namespace {

constexpr int kLayers = 8;
constexpr int64_t kBatch = 16, kWidth = 12;

// Layer i: Linear(kWidth, kWidth) then tanh, from one seed on every rank.
std::vector<std::shared_ptr<nn::Linear>> make_layers() {
  Generator gen(17);
  std::vector<std::shared_ptr<nn::Linear>> out;
  for (int i = 0; i < kLayers; ++i) {
    auto l = std::make_shared<nn::Linear>(kWidth, kWidth, true, &gen);
    l->to(kFloat64);
    out.push_back(l);
  }
  return out;
}

Tensor run_layers(const std::vector<std::shared_ptr<nn::Linear>>& layers, int from, int to,
                  const Tensor& x) {
  Tensor h = x;
  for (int i = from; i < to; ++i) h = tanh((*layers[size_t(i)])(h));
  return h;
}

Tensor mse(const Tensor& out, const Tensor& y) { return mean((out - y) * (out - y)); }

void scenario_train(const ProcessGroupPtr& world) {
  const int p = world->size(), r = world->rank();
  Generator data(3);
  const Tensor x = randn({kBatch, kWidth}, TensorOptions(kFloat64), &data);
  const Tensor y = randn({kBatch, kWidth}, TensorOptions(kFloat64), &data);
  struct Case {
    PipelineScheduleKind kind;
    int chunks, microbatches;
  };
  const std::vector<Case> cases = {{PipelineScheduleKind::GPipe, 1, 4},
                                   {PipelineScheduleKind::OneFOneB, 1, 8},
                                   {PipelineScheduleKind::OneFOneB, 1, 4},
                                   {PipelineScheduleKind::Interleaved1F1B, 2, 2 * p}};
  for (const Case& c : cases) {
    const std::string what = schedule_name(c.kind) + " v " + std::to_string(c.chunks) + " m " +
                             std::to_string(c.microbatches);
    if (kLayers % (p * c.chunks) != 0) continue;
    // One process: the whole stack over the whole batch (the mean loss of equal microbatches).
    auto ref = make_layers();
    // The mean over microbatches of each microbatch's mean: the batch's mean.
    const Tensor ref_loss = mse(run_layers(ref, 0, kLayers, x), y);
    ref_loss.backward();
    // Pipelined: virtual stage s = chunk * p + r holds layers [s L, (s + 1) L).
    auto mine = make_layers();
    const int per = kLayers / (p * c.chunks);
    std::vector<PipelineChunk> chunks;
    for (int j = 0; j < c.chunks; ++j) {
      const int s = j * p + r;
      chunks.push_back(
          [&mine, s, per](const Tensor& h) { return run_layers(mine, s * per, (s + 1) * per, h); });
    }
    const PipelineResult res = pipeline_step(chunks, world, x, y, mse,
                                             {.schedule = c.kind, .microbatches = c.microbatches});
    WCHECK(std::abs(res.loss - ref_loss.item<double>()) <= 1e-12,
           what << ": loss " << res.loss << " against " << ref_loss.item<double>());
    for (int j = 0; j < c.chunks; ++j) {
      const int s = j * p + r;
      for (int i = s * per; i < (s + 1) * per; ++i) {
        const Tensor a = mine[size_t(i)]->weight.grad(), b = ref[size_t(i)]->weight.grad();
        WCHECK(a.defined(), what << ": layer " << i << " has no gradient");
        if (a.defined())
          WCHECK(max_abs_diff(a, b) <= 1e-12,
                 what << ": layer " << i << " weight gradient differs by " << max_abs_diff(a, b));
        const double bias = max_abs_diff(mine[size_t(i)]->bias.grad(), ref[size_t(i)]->bias.grad());
        WCHECK(bias <= 1e-12, what << ": layer " << i << " bias gradient differs by " << bias);
      }
    }
    // Layers of other ranks got nothing here.
    for (int i = 0; i < kLayers; ++i) {
      const int s = i / per;
      if (s % p != r) WCHECK(!mine[size_t(i)]->weight.grad().defined(), what << ": layer " << i);
    }
  }
}

// examples/models.h's Gpt through its pipeline form (dist::pipeline_chunks of pipeline_layers():
// embed, 4 blocks, head), float64: the loss and every gradient equal one process's; each
// parameter gets its gradient on exactly one rank.
void scenario_gpt(const ProcessGroupPtr& world) {
  const int p = world->size(), r = world->rank();
  models::GptConfig gc;
  gc.vocab = 32;
  gc.context = 16;
  gc.layers = 4;
  gc.heads = 2;
  gc.d_model = 16;
  Generator data(11);
  const Tensor tokens = randint(0, gc.vocab, {8, gc.context + 1}, TensorOptions(kInt64), &data);
  const Tensor x = tokens.narrow(1, 0, gc.context).contiguous();
  const Tensor y = tokens.narrow(1, 1, gc.context).contiguous();
  auto make = [&] {
    Generator gen(21);
    auto m = std::make_shared<models::Gpt>(gc, &gen);
    m->to(kFloat64);
    return m;
  };
  struct Case {
    PipelineScheduleKind kind;
    int chunks;
    std::vector<std::string> split;
  };
  std::vector<Case> cases = {{PipelineScheduleKind::OneFOneB, 1, {}},
                             {PipelineScheduleKind::GPipe, 1, {}}};
  if (p == 2) {
    cases.push_back({PipelineScheduleKind::Interleaved1F1B, 2, {}});
    cases.push_back({PipelineScheduleKind::OneFOneB, 1, {"blocks.1"}});  // embed + 1 block | rest
  }
  for (const Case& c : cases) {
    const std::string what = schedule_name(c.kind) + " v " + std::to_string(c.chunks) +
                             (c.split.empty() ? "" : " split at " + c.split[0]);
    auto ref = make();
    const Tensor ref_loss = models::lm_loss(ref->forward(x), y);
    ref_loss.backward();
    auto model = make();
    const std::vector<PipelineChunk> chunks =
        pipeline_chunks(model->pipeline_layers(), p, r, c.chunks, c.split);
    const PipelineResult res = pipeline_step(chunks, world, x, y, models::lm_loss,
                                             {.schedule = c.kind, .microbatches = 4});
    WCHECK(std::abs(res.loss - ref_loss.item<double>()) <= 1e-12,
           what << ": loss " << res.loss << " against " << ref_loss.item<double>());
    double held = 0;
    const auto want = ref->named_parameters();
    const auto got = model->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      const Tensor g = got[i].second.grad();
      if (!g.defined()) continue;
      held += 1;
      const double d = max_abs_diff(g, want[i].second.grad());
      WCHECK(d <= 1e-12, what << ": " << got[i].first << " gradient differs by " << d);
    }
    Tensor count = full({1}, held, TensorOptions(kFloat64));
    world->all_reduce(count);
    WCHECK(count.item<double>() == double(got.size()), what << ": " << count.item<double>()
                                                            << " gradients over the ranks for "
                                                            << got.size() << " parameters");
  }
  // A split that names no layer, or goes backwards, is refused.
  auto model = make();
  const std::string e1 =
      thrown_message([&] { pipeline_chunks(model->pipeline_layers(), 2, 0, 1, {"blocks.9"}); });
  WCHECK(e1.find("'blocks.9' names no layer") != std::string::npos, e1);
  const std::string e2 = thrown_message([&] {
    pipeline_chunks(model->pipeline_layers(), 3, 0, 1, {"blocks.2", "blocks.1"});
  });
  WCHECK(e2.find("does not come after the previous one") != std::string::npos, e2);
  const std::string e3 =
      thrown_message([&] { pipeline_chunks(model->pipeline_layers(), 4, 0, 2); });
  WCHECK(e3.find("cannot fill 8 virtual stages") != std::string::npos, e3);
}

void scenario_errors(const ProcessGroupPtr& world) {
  const int p = world->size(), r = world->rank();
  auto layers = make_layers();
  const std::vector<PipelineChunk> one = {
      [&](const Tensor& h) { return run_layers(layers, r, r + 1, h); }};
  const Tensor x = zeros({kBatch, kWidth}, TensorOptions(kFloat64)), y = x.clone();
  // Ranks that disagree on the microbatches: refused on every rank.
  const std::string e1 = thrown_message(
      [&] { pipeline_step(one, world, x, y, mse, {.microbatches = r == 0 ? 4 : 2}); });
  WCHECK(e1.find("disagree on the chunks per rank, the microbatches") != std::string::npos, e1);
  // 16 rows do not split into 3 microbatches (on the ranks that read them).
  const std::string e2 =
      thrown_message([&] { pipeline_step(one, world, x, y, mse, {.microbatches = 3}); });
  if (r == 0 || r == p - 1)
    WCHECK(e2.find("does not split into 3 microbatches") != std::string::npos, e2);
  WCHECK(thrown_message([&] {
           pipeline_schedule(PipelineScheduleKind::Interleaved1F1B, p, r, p + 1, 2);
         }).find("multiple of the pipeline stages") != std::string::npos,
         "interleaved m % p");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: pp_worker <scenario>\n";
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    InitOptions io;
    io.timeout = std::chrono::milliseconds(60000);
    auto world = init_process_group(io);
    g_rank = world->rank();
    if (scenario == "train") {
      scenario_train(world);
    } else if (scenario == "gpt") {
      scenario_gpt(world);
    } else if (scenario == "errors") {
      scenario_errors(world);
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
    if (g_failures == 0) std::cout << "rank " << g_rank << " ok " << scenario << std::endl;
    world->barrier();
    world.reset();
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " unexpected exception: " << e.what() << std::endl;
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
