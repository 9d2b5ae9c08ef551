// nn::Module machinery: hierarchical names, registration errors, train/eval, to(), zero_grad,
// state_dict round trips and strict-load errors, checkpoints, printing; initialisers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "accel.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::error_of;

namespace {

// A block with a parameter of its own, a buffer and two submodules.
struct Block : nn::Module {
  Tensor scale = register_parameter("scale", ones({4}));
  Tensor steps = register_buffer("steps", zeros({}, kInt64));
  std::shared_ptr<nn::Linear> fc = register_module("fc", std::make_shared<nn::Linear>(4, 4));
  std::shared_ptr<nn::LayerNorm> ln = register_module("ln", std::make_shared<nn::LayerNorm>(4));
  Tensor forward(const Tensor& x) override { return ln->forward(fc->forward(x) * scale); }
};

struct Net : nn::Module {
  std::shared_ptr<nn::Embedding> emb =
      register_module("emb", std::make_shared<nn::Embedding>(10, 4));
  std::shared_ptr<nn::ModuleList> blocks =
      register_module("blocks", std::make_shared<nn::ModuleList>());
  std::shared_ptr<nn::Linear> head =
      register_module("head", std::make_shared<nn::Linear>(4, 3, false));
  explicit Net(int n_blocks = 2) {
    for (int i = 0; i < n_blocks; ++i) blocks->push_back(std::make_shared<Block>());
  }
  Tensor forward(const Tensor& idx) override {
    Tensor x = emb->forward(idx);
    for (const auto& b : *blocks) x = b->forward(x);
    return head->forward(x);
  }
};

std::vector<std::string> names(const nn::Named<Tensor>& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("hierarchical parameter and buffer names in registration order") {
  Net net;
  const std::vector<std::string> expect = {
      "emb.weight",         "blocks.0.scale",     "blocks.0.fc.weight", "blocks.0.fc.bias",
      "blocks.0.ln.weight", "blocks.0.ln.bias",   "blocks.1.scale",     "blocks.1.fc.weight",
      "blocks.1.fc.bias",   "blocks.1.ln.weight", "blocks.1.ln.bias",   "head.weight"};
  CHECK(names(net.named_parameters()) == expect);
  CHECK(names(net.named_buffers()) == std::vector<std::string>{"blocks.0.steps", "blocks.1.steps"});
  CHECK(net.parameters().size() == expect.size());
  CHECK(names(net.named_parameters(false)).empty());
  CHECK(net.num_parameters() == 10 * 4 + 2 * (4 + 16 + 4 + 4 + 4) + 12);
  for (const Tensor& p : net.parameters()) CHECK(p.requires_grad());
  // The member and the table entry are the same tensor.
  auto b0 = net.blocks->at<Block>(0);
  CHECK(net.parameter("blocks.0.fc.weight").is_same(b0->fc->weight));
  CHECK_THROWS_AS(net.parameter("blocks.0.fc.nope"), IndexError);
  CHECK_THROWS_AS(net.blocks->at<nn::Linear>(0), ValueError);
  CHECK_THROWS_AS((*net.blocks)[2], IndexError);
  auto mods = net.named_modules();
  CHECK(mods.size() == 1 + 1 + 1 + 2 * 3 + 1);
  CHECK(mods[0].first.empty());
  CHECK(mods[3].first == "blocks.0");
  CHECK(mods[3].second->type_name() == "Block");
  // A forward pass over the whole tree works and every parameter gets a gradient.
  Tensor out = net.forward(tensor(std::vector<int64_t>{1, 2, 3, 9}, Shape{2, 2}));
  CHECK(out.sizes() == Shape{2, 2, 3});
  out.sum().backward();
  for (const auto& [n, p] : net.named_parameters()) {
    INFO(n);
    CHECK(p.grad().defined());
  }
  net.zero_grad();
  for (const Tensor& p : net.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("registration errors name the module and the problem") {
  struct Bad : nn::Module {
    Bad() { register_parameter("w", ones({2})); }
  };
  Bad b;
  // A name used by another kind is refused; the same kind replaces (torch's behaviour).
  std::string msg = error_of([&] { b.register_buffer("w", ones({2})); });
  CHECK(msg.find("[Module.register_buffer] Bad: 'w' is already registered as a parameter") == 0);
  b.register_parameter("w", zeros({2}));
  CHECK(b.parameters().size() == 1);
  CHECK(b.parameter("w").sum().item<float>() == 0.0f);
  CHECK_THROWS_AS(b.register_parameter("a.b", ones({2})), ValueError);
  CHECK_THROWS_AS(b.register_parameter("", ones({2})), ValueError);
  CHECK_THROWS_AS(b.register_parameter("i", ones({2}, kInt64)), DTypeError);
  // None (torch's register_parameter(name, None)): listed nowhere.
  b.register_parameter("u", Tensor());
  CHECK(b.parameters().size() == 1);
  CHECK(b.state_dict().count("u") == 0);
  CHECK_THROWS_AS(b.register_module("w", std::make_shared<nn::ReLU>()), ValueError);
  CHECK_THROWS_AS(b.register_module("n", std::shared_ptr<nn::ReLU>()), ValueError);
  // forward(x) on a module without one.
  nn::ModuleList list;
  msg = error_of([&] { list.forward(ones({1})); });
  CHECK(msg.find("ModuleList does not define") != std::string::npos);
}

TEST_CASE("train / eval propagate; Sequential chains forwards") {
  auto seq = std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::Linear>(5, 2));
  CHECK(seq->size() == 4);
  CHECK(names(seq->named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias"});
  CHECK(seq->is_training());
  seq->eval();
  for (auto& [n, m] : seq->named_modules()) CHECK_FALSE(m->is_training());
  Tensor x = randn({4, 3});
  // Eval: dropout is the identity, so the output is the composition of the layers.
  auto l0 = seq->at<nn::Linear>(0), l3 = seq->at<nn::Linear>(3);
  Tensor ref = linear(relu(linear(x, l0->weight, l0->bias)), l3->weight, l3->bias);
  CHECK(allclose(seq->forward(x), ref));
  CHECK(allclose((*seq)(x), ref));
  seq->train();
  CHECK(seq->at<nn::Dropout>(2)->is_training());
  // Wrong input width: the module names itself and the shapes.
  std::string msg = error_of([&] { seq->forward(randn({4, 7})); });
  CHECK(msg.find("[Linear] expected input (..., 3), got (4, 7)") == 0);
}

TEST_CASE("to(dtype) converts floating tensors in place; integer buffers stay") {
  Net net(1);
  auto b0 = net.blocks->at<Block>(0);
  Tensor w = b0->fc->weight;  // a handle held before the move
  const std::vector<double> before = w.tolist();
  Tensor out = net.forward(tensor(std::vector<int64_t>{1}, Shape{1}));
  out.sum().backward();
  net.to(kFloat64);
  CHECK(w.dtype() == kFloat64);
  CHECK(b0->fc->weight.dtype() == kFloat64);
  CHECK(w.tolist() == before);
  CHECK(w.requires_grad());
  CHECK(w.grad().dtype() == kFloat64);
  CHECK(b0->steps.dtype() == kInt64);
  // Still trainable after the move.
  net.zero_grad();
  net.forward(tensor(std::vector<int64_t>{1}, Shape{1})).sum().backward();
  CHECK(w.grad().defined());
  CHECK_THROWS_AS(net.to(kInt32), DTypeError);
  net.to(kCPU);  // same device: nothing changes
  CHECK(w.dtype() == kFloat64);
}

TEST_CASE("state_dict round trip into a differently initialised model") {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  CHECK_FALSE(equal(a.parameter("head.weight"), b.parameter("head.weight")));
  {
    NoGradGuard ng;
    a.blocks->at<Block>(1)->steps.fill_(7);
  }
  io::TensorDict sd = a.state_dict();
  CHECK(sd.size() == 12 + 2);
  CHECK(sd.count("blocks.1.steps"));
  nn::LoadResult r = b.load_state_dict(sd);
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  for (const auto& [n, t] : a.state_dict()) {
    INFO(n);
    CHECK(equal(t, b.state_dict().at(n)));
  }
  // Values were copied, not aliased.
  CHECK_FALSE(b.parameter("head.weight").storage() == a.parameter("head.weight").storage());
  Tensor idx = tensor(std::vector<int64_t>{4, 5}, Shape{1, 2});
  CHECK(allclose(a.forward(idx), b.forward(idx)));
}

TEST_CASE("strict load lists missing, unexpected and mis-shaped keys; nothing is copied") {
  Net net;
  Net other(1);  // has no blocks.1.*
  io::TensorDict sd = other.state_dict();
  sd["extra.weight"] = ones({2});
  sd["head.weight"] = ones({5, 4});
  const Tensor before = net.parameter("emb.weight").clone();
  const std::string msg = error_of([&] { net.load_state_dict(sd); });
  // torch's report (Module.load_state_dict), one problem per line.
  CHECK(msg.find("[load_state_dict] Error(s) in loading state_dict for Net:\n\tMissing key(s) in "
                 "state_dict: \"blocks.1.fc.bias\", \"blocks.1.fc.weight\", ") == 0);
  CHECK(msg.find("\n\tUnexpected key(s) in state_dict: \"extra.weight\".\n") != std::string::npos);
  CHECK(msg.find("\n\tsize mismatch for head.weight: copying a param with shape (5, 4) from "
                 "checkpoint, the shape in current model is (3, 4).") != std::string::npos);
  CHECK(msg.find("Missing") < msg.find("Unexpected"));
  CHECK(msg.find("Unexpected") < msg.find("size mismatch"));
  CHECK(equal(net.parameter("emb.weight"), before));

  // Non-strict: missing/unexpected are reported, shape mismatches still throw (naming only them).
  const std::string loose = error_of([&] { net.load_state_dict(sd, false); });
  CHECK(loose.find("size mismatch for head.weight") != std::string::npos);
  CHECK(loose.find("Missing") == std::string::npos);
  CHECK(loose.find("Unexpected") == std::string::npos);
  sd.erase("head.weight");
  nn::LoadResult r = net.load_state_dict(sd, false);
  CHECK(r.missing_keys.size() == 7);  // blocks.1.* (6) and head.weight
  CHECK(r.unexpected_keys == std::vector<std::string>{"extra.weight"});
  CHECK(equal(net.parameter("emb.weight"), other.parameter("emb.weight")));
}

TEST_CASE("a tensor registered twice (tied weights) is one parameter, saved under both names") {
  // GPT-2 style tying: the output head reuses the embedding matrix (same TensorImpl).
  struct Tied : nn::Module {
    std::shared_ptr<nn::Embedding> emb =
        register_module("emb", std::make_shared<nn::Embedding>(6, 3));
    std::shared_ptr<nn::Identity> head = register_module("head", std::make_shared<nn::Identity>());
    Tied() { head->register_parameter("weight", emb->weight); }
  };
  Tied t;
  CHECK(t.parameters().size() == 1);  // an optimizer steps it once
  CHECK(names(t.named_parameters()) == std::vector<std::string>{"emb.weight"});
  io::TensorDict sd = t.state_dict();
  CHECK(sd.size() == 2);
  CHECK(equal(sd.at("head.weight"), sd.at("emb.weight")));
  Tied u;
  u.load_state_dict(sd);
  CHECK(equal(u.emb->weight, t.emb->weight));
}

TEST_CASE("Module::save / load checkpoint through safetensors") {
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string path = dir + "/accel_module_" + std::to_string(::getpid()) + ".safetensors";
  manual_seed(3);
  Net a;
  a.save(path, {{"epoch", "2"}});
  manual_seed(4);
  Net b;
  b.load(path);
  for (const auto& [n, t] : a.state_dict()) CHECK(equal(t, b.state_dict().at(n)));
  io::Metadata meta;
  io::load_safetensors(path, &meta);
  CHECK(meta.at("epoch") == "2");
  Net small(1);
  CHECK_THROWS_AS(small.load(path), ValueError);  // unexpected blocks.1.*
  std::filesystem::remove(path);
}

TEST_CASE("printing shows the tree") {
  Net net(1);
  const std::string s = net.repr();
  CHECK(s.find("Net(\n  (emb): Embedding(10, 4)\n  (blocks): ModuleList(\n    (0): Block(\n") == 0);
  CHECK(s.find("(fc): Linear(in_features=4, out_features=4, bias=true)") != std::string::npos);
  CHECK(s.find("(head): Linear(in_features=4, out_features=3, bias=false)") != std::string::npos);
}

TEST_CASE("default initialisation follows PyTorch and is seed-reproducible") {
  manual_seed(11);
  nn::Linear a(100, 64);
  manual_seed(11);
  nn::Linear b(100, 64);
  CHECK(equal(a.weight, b.weight));
  CHECK(equal(a.bias, b.bias));
  // Kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in)); its std is bound/sqrt(3).
  const double bound = 1.0 / std::sqrt(100.0);
  const std::vector<double> w = a.weight.tolist();
  double mx = 0, ss = 0;
  for (double v : w) {
    mx = std::max(mx, std::abs(v));
    ss += v * v;
  }
  CHECK(mx <= bound);
  CHECK(mx > 0.95 * bound);  // 6400 draws reach the edge
  CHECK(std::sqrt(ss / double(w.size())) == doctest::Approx(bound / std::sqrt(3.0)).epsilon(0.05));
  for (double v : a.bias.tolist()) CHECK(std::abs(v) <= bound);

  // An explicit generator gives the same values regardless of the default generator.
  Generator g1(5), g2(5);
  manual_seed(100);
  nn::Linear c(8, 8, true, &g1);
  manual_seed(200);
  nn::Linear d(8, 8, true, &g2);
  CHECK(equal(c.weight, d.weight));

  // Embedding N(0, 1); norms 1 / 0.
  manual_seed(12);
  nn::Embedding e(200, 50);
  const std::vector<double> ev = e.weight.tolist();
  double mean = 0, var = 0;
  for (double v : ev) mean += v;
  mean /= double(ev.size());
  for (double v : ev) var += (v - mean) * (v - mean);
  var /= double(ev.size());
  CHECK(std::abs(mean) < 0.03);
  CHECK(var == doctest::Approx(1.0).epsilon(0.05));
  nn::LayerNorm ln(6);
  CHECK(ln.weight.tolist() == std::vector<double>(6, 1.0));
  CHECK(ln.bias.tolist() == std::vector<double>(6, 0.0));

  // fan computations and gains.
  auto [fi, fo] = nn::init::calculate_fan_in_and_fan_out(zeros({32, 16, 3, 3}));
  CHECK(fi == 16 * 9);
  CHECK(fo == 32 * 9);
  CHECK(nn::init::calculate_gain("leaky_relu", std::sqrt(5.0)) ==
        doctest::Approx(std::sqrt(1.0 / 3.0)));
  CHECK_THROWS_AS(nn::init::calculate_fan_in_and_fan_out(zeros({3})), ShapeError);
  CHECK_THROWS_AS(nn::init::calculate_gain("swish"), ValueError);
  Tensor x = zeros({1000});
  nn::init::xavier_uniform_(x.view({10, 100}));
  for (double v : x.tolist()) CHECK(std::abs(v) <= std::sqrt(6.0 / 110.0));
}
