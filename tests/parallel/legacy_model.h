// The model and optimizer of the format-1 fixtures (tests/parallel/fixtures/legacy, written by
// make_legacy_fixture.cc): a tiny float64 GPT from Generator(5) and AdamW over two groups (matrices
// with weight decay 0.01, the rest without). The legacy reader's context needs exactly these names
// and groups, so the tests that read or load the fixtures build them here, once.
#pragma once

#include <memory>
#include <vector>

#include "core/generator.h"
#include "examples/models.h"
#include "optim/adam.h"

namespace accel::test {

inline constexpr int64_t kLegacyVocab = 8, kLegacyContext = 4;

inline std::shared_ptr<models::Gpt> legacy_model() {
  Generator gen(5);
  models::GptConfig c;
  c.vocab = kLegacyVocab;
  c.context = kLegacyContext;
  c.layers = 1;
  c.heads = 2;
  c.d_model = 8;
  auto model = std::make_shared<models::Gpt>(c, &gen);
  model->to(kFloat64);
  return model;
}

inline std::shared_ptr<optim::AdamW> legacy_optimizer(models::Gpt& model) {
  std::vector<optim::ParamGroup> groups(2);
  for (auto& [name, p] : model.named_parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
  groups[1].weight_decay = 0.0;
  return std::make_shared<optim::AdamW>(groups,
                                        optim::AdamWFields{.lr = 1e-2, .weight_decay = 0.01});
}

}  // namespace accel::test
