// Tied parameters (Note [tied parameters] in nn/module.cc): one tensor in two modules,
// by a second registration or set_parameter; counted once, gradient the sum of both uses,
// optimizer state once, state_dict under both names, files written once with an alias map
// (Note [tied tensors in files] in io/safetensors.cc), deferred init.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "accel.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::error_of;

namespace {

std::string tmp_path(const std::string& tag) {
  return "/tmp/accel-tied-" + std::to_string(getpid()) + "-" + tag + ".safetensors";
}

// A word-language-model shape: embedding (V, D), a hidden layer, a decoder (D -> V) whose
// weight is the embedding's when tied.
struct LangModel : nn::Module {
  std::shared_ptr<nn::Embedding> encoder;
  std::shared_ptr<nn::Linear> hidden, decoder;
  LangModel(bool tie, bool rebind) {
    encoder = register_module("encoder", std::make_shared<nn::Embedding>(7, 4));
    hidden = register_module("hidden", std::make_shared<nn::Linear>(4, 4));
    decoder = register_module("decoder", std::make_shared<nn::Linear>(4, 7));
    if (tie && rebind) decoder->weight = decoder->set_parameter("weight", encoder->weight);
  }
  Tensor forward(const Tensor& idx) override {
    return decoder->forward(tanh(hidden->forward(encoder->forward(idx))));
  }
};

// Ties by registering the embedding's tensor in its own constructor (GPT's style of a head
// without a Linear).
struct Head : nn::Module {
  Tensor weight;
  explicit Head(Tensor w) { weight = register_parameter("weight", std::move(w)); }
  Tensor forward(const Tensor& x) override { return matmul(x, weight.transpose(0, 1)); }
};
struct Gptish : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> mix;
  std::shared_ptr<Head> head;
  Gptish() {
    wte = register_module("wte", std::make_shared<nn::Embedding>(6, 3));
    mix = register_module("mix", std::make_shared<nn::Linear>(3, 3));
    head = register_module("head", std::make_shared<Head>(wte->weight));
  }
  Tensor forward(const Tensor& idx) override {
    return head->forward(mix->forward(wte->forward(idx)));
  }
};

Tensor tokens() { return tensor(std::vector<int64_t>{0, 3, 6, 2, 3}, {5}); }

}  // namespace

TEST_CASE("tied parameters appear once, both uses see the tensor, the gradient is the sum") {
  auto m = std::make_shared<LangModel>(true, true);
  CHECK(m->decoder->weight.is_same(m->encoder->weight));
  auto named = m->named_parameters();
  CHECK(named.size() == 4);  // encoder.weight, hidden.{weight,bias}, decoder.bias
  CHECK(named[0].first == "encoder.weight");
  CHECK(m->tied_aliases() ==
        std::map<std::string, std::string>{{"decoder.weight", "encoder.weight"}});
  auto sd = m->state_dict();  // both names, one storage
  REQUIRE(sd.count("decoder.weight"));
  CHECK(sd.at("decoder.weight").storage() == sd.at("encoder.weight").storage());

  // The gradient of the tied tensor is the sum of the two uses: compare with an untied model
  // holding the same values, whose two gradients are added by hand.
  auto u = std::make_shared<LangModel>(false, false);
  {
    NoGradGuard ng;
    u->encoder->weight.copy_(m->encoder->weight);
    u->decoder->weight.copy_(m->encoder->weight);
    u->hidden->weight.copy_(m->hidden->weight);
    u->hidden->bias.copy_(m->hidden->bias);
    u->decoder->bias.copy_(m->decoder->bias);
  }
  m->forward(tokens()).pow(2).sum().backward();
  u->forward(tokens()).pow(2).sum().backward();
  CHECK(allclose(m->encoder->weight.grad(), u->encoder->weight.grad() + u->decoder->weight.grad(),
                 1e-6, 1e-6));
  // The untied gradients differ: a test that the tie is what makes the sum.
  CHECK(!allclose(u->encoder->weight.grad(), m->encoder->weight.grad(), 1e-3, 1e-3));

  // The optimizer holds it once (one state slot) and the step moves both uses.
  optim::Adam opt(m->parameters());
  opt.step();
  size_t slots = 0;
  for (const auto& [k, v] : opt.state_dict())
    if (k.find(".exp_avg_sq") != std::string::npos) ++slots;
  CHECK(slots == 4);
  CHECK(m->decoder->weight.is_same(m->encoder->weight));
}

TEST_CASE("tying by a second registration; set_parameter errors") {
  auto g = std::make_shared<Gptish>();
  CHECK(g->parameters().size() == 3);  // wte.weight, mix.weight, mix.bias
  CHECK(g->tied_aliases().at("head.weight") == "wte.weight");
  auto lin = std::make_shared<nn::Linear>(3, 3);
  std::string e = error_of([&] { lin->set_parameter("wieght", zeros({3, 3})); });
  CHECK(e.find("no parameter 'wieght' (it has: weight, bias)") != std::string::npos);
  Tensor w = zeros({3, 3}).requires_grad_(true);
  e = error_of([&] { lin->set_parameter("weight", w * 2.0); });
  CHECK(e.find("has autograd history") != std::string::npos);
  e = error_of([&] { lin->set_parameter("weight", zeros({3, 3}, kInt64)); });
  CHECK(e.find("floating point") != std::string::npos);
  // Moving keeps the tie (one TensorImpl, converted once).
  g->to(kFloat64);
  CHECK(g->head->weight.is_same(g->wte->weight));
  CHECK(g->head->weight.dtype() == kFloat64);
}

TEST_CASE("files hold a tied tensor once, with an alias map, and load back into both names") {
  auto m = std::make_shared<LangModel>(true, true);
  const std::string path = tmp_path("save");
  m->save(path, {{"format", "pt"}});
  // The file: one copy, the alias in the metadata as safetensors.torch.save_model writes it.
  io::Metadata md;
  io::TensorDict raw = io::load_safetensors(path, &md);
  CHECK(md.at("encoder.weight") == "decoder.weight");  // kept: the sorted-first name
  CHECK(md.at("format") == "pt");
  CHECK(raw.size() == 5);  // the alias is restored by load_safetensors
  CHECK(raw.at("encoder.weight").is_same(raw.at("decoder.weight")));
  // The byte buffer after the header: 7x4 + 4x4 + 4 + 7 floats, the (7, 4) weight once.
  {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    REQUIRE(f != nullptr);
    uint64_t header_len = 0;
    REQUIRE(std::fread(&header_len, 8, 1, f) == 1);
    std::fclose(f);
    CHECK(std::filesystem::file_size(path) - 8 - header_len == 4 * (7 * 4 + 4 * 4 + 4 + 7));
  }
  // Into a fresh tied model, and into an untied one (both names get the value).
  auto t = std::make_shared<LangModel>(true, true);
  t->load(path);
  CHECK(allclose(t->encoder->weight, m->encoder->weight, 0, 0));
  CHECK(t->decoder->weight.is_same(t->encoder->weight));
  auto u = std::make_shared<LangModel>(false, false);
  u->load(path);
  CHECK(allclose(u->decoder->weight, m->encoder->weight, 0, 0));
  CHECK(allclose(u->encoder->weight, m->encoder->weight, 0, 0));
  // A user metadata key that is a tensor name: that alias is written as a copy instead.
  io::TensorDict d = m->state_dict();
  io::save_safetensors(path, d, {{"encoder.weight", "user value"}});
  io::Metadata md2;
  io::TensorDict back = io::load_safetensors(path, &md2);
  CHECK(md2.at("encoder.weight") == "user value");
  CHECK(back.size() == 5);
  CHECK(!back.at("encoder.weight").is_same(back.at("decoder.weight")));
  CHECK(allclose(back.at("encoder.weight"), back.at("decoder.weight"), 0, 0));
  // Views that only overlap are separate tensors (copies).
  Tensor base = arange(6, TensorOptions(kFloat32));
  io::save_safetensors(path, {{"a", base.narrow(0, 0, 4)}, {"b", base.narrow(0, 2, 4)}});
  io::Metadata md3;
  io::TensorDict ov = io::load_safetensors(path, &md3);
  CHECK(md3.empty());
  CHECK(ov.at("b").tolist() == std::vector<double>{2, 3, 4, 5});
  std::filesystem::remove(path);
}

TEST_CASE("deferred init: the owner initialises a tied tensor, in any materialization order") {
  manual_seed(11);
  auto eager = std::make_shared<LangModel>(true, true);
  auto eager_g = std::make_shared<Gptish>();
  for (bool reverse : {false, true}) {
    CAPTURE(reverse);
    manual_seed(11);
    std::shared_ptr<LangModel> d;
    std::shared_ptr<Gptish> dg;
    {
      nn::DeferredInit deferred;
      d = std::make_shared<LangModel>(true, true);
      dg = std::make_shared<Gptish>();
    }
    CHECK(nn::is_deferred(*d));
    for (nn::Module* m : {static_cast<nn::Module*>(d.get()), static_cast<nn::Module*>(dg.get())}) {
      auto mods = m->named_modules();
      if (reverse) std::reverse(mods.begin(), mods.end());
      for (auto& [name, mod] : mods) nn::reset_module_parameters(*mod);
    }
    CHECK(!nn::is_deferred(*d));
    CHECK(d->decoder->weight.is_same(d->encoder->weight));
    for (auto& [n, t] : eager->state_dict()) CHECK(allclose(d->state_dict().at(n), t, 0, 0));
    for (auto& [n, t] : eager_g->state_dict()) CHECK(allclose(dg->state_dict().at(n), t, 0, 0));
  }
}
