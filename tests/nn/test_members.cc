// Members the module sees assigned (Note [module members] in nn/module_members.cc):
// nn::Parameter / nn::Buffer / nn::Child<M> bound to their entries, so assigning a member ties or
// replaces as torch's setattr does; register_* on a used name replaces; None entries; torch's
// spellings on Module (float64() ..., modules(), as<M>()); type-erased calls that leave out
// parameters with default arguments; a wrapped layer's forward called directly.
#include <doctest/doctest.h>

#include <algorithm>

#include "accel.h"
#include "tests/common/check.h"
#include "tests/common/util.h"

using namespace accel;
using accel::test::contains;
using accel::test::error_of;

namespace {

std::vector<std::string> names_of(const nn::Named<Tensor>& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

// A ResNet-ish classifier whose head a transfer-learning program replaces.
struct Net : nn::Module {
  nn::Child<nn::Linear> body = register_module("body", std::make_shared<nn::Linear>(6, 5));
  nn::Child<nn::Linear> fc = register_module("fc", std::make_shared<nn::Linear>(5, 4));
  Tensor forward(const Tensor& x) override { return fc->forward(relu(body->forward(x))); }
};

// libtorch's shape: members declared first, registered in the constructor body.
struct LateNet : nn::Module {
  nn::Child<nn::Linear> fc;
  nn::Parameter scale;
  nn::Buffer shift;
  LateNet() {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
    scale = register_parameter("scale", ones({2}));
    shift = register_buffer("shift", zeros({2}));
  }
  Tensor forward(const Tensor& x) override { return fc->forward(x) * scale + shift; }
};

// A language model whose decoder ties to the embedding by assignment, as torch programs write it.
struct TiedLm : nn::Module {
  nn::Child<nn::Embedding> emb = register_module("emb", std::make_shared<nn::Embedding>(7, 4));
  nn::Child<nn::Linear> head = register_module("head", std::make_shared<nn::Linear>(4, 7, false));
  explicit TiedLm(bool tie) {
    if (tie) head->weight = emb->weight;  // torch: self.head.weight = self.emb.weight
  }
  Tensor forward(const Tensor& idx) override { return head->forward(emb->forward(idx)); }
};

}  // namespace

TEST_CASE("assigning a parameter member ties: listed once, both names in state_dict, one grad") {
  manual_seed(1);
  TiedLm untied(false), tied(true);
  CHECK(untied.parameters().size() == 2);
  REQUIRE(tied.parameters().size() == 1);
  CHECK(tied.head->weight.is_same(tied.emb->weight));
  const io::TensorDict sd = tied.state_dict();
  CHECK(sd.count("emb.weight") == 1);
  CHECK(sd.count("head.weight") == 1);
  CHECK(tied.tied_aliases().at("head.weight") == "emb.weight");

  // The gradient is the sum of both uses (embedding rows + decoder), on the one tensor; an
  // optimizer built afterwards steps it once.
  const Tensor idx = tensor(std::vector<int64_t>{0, 3, 3, 6}, {4});
  Tensor loss = cross_entropy(tied.forward(idx), tensor(std::vector<int64_t>{1, 2, 0, 6}, {4}));
  loss.backward();
  const Tensor g = tied.emb->weight.grad();
  REQUIRE(g.defined());
  // The decoder's contribution alone touches every row; the embedding's only the used rows.
  Tensor only_head;
  {
    Tensor w = tied.emb->weight.detach().clone().requires_grad_(true);
    Tensor e = embedding(w.detach(), idx);
    Tensor l = cross_entropy(linear(e, w), tensor(std::vector<int64_t>{1, 2, 0, 6}, {4}));
    l.backward();
    only_head = w.grad();
  }
  CHECK(!(g).allclose(only_head));  // the embedding's part is in g too
  auto opt = std::make_shared<optim::SGD>(tied.parameters(), optim::SGDOptions(0.1));
  const Tensor before = tied.emb->weight.detach().clone();
  opt->step();
  CHECK((tied.head->weight).allclose(before - g * 0.1));
}

TEST_CASE("assigning a child member replaces it everywhere (transfer learning)") {
  manual_seed(2);
  auto net = std::make_shared<Net>();
  auto old_fc = net->fc;
  int hook_calls = 0;
  net->register_forward_hook(
      [&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>&) { ++hook_calls; });
  net->fc = std::make_shared<nn::Linear>(5, 2);  // torch: net.fc = nn.Linear(512, 2)
  CHECK(net->fc.get() != old_fc.get());
  // parameters(), state_dict(), named_modules() and printing see the new head.
  CHECK(net->parameter("fc.weight").sizes() == Shape{2, 5});
  CHECK(net->state_dict().at("fc.bias").sizes() == Shape{2});
  CHECK(net->parameters().size() == 4);
  bool found = false;
  for (auto& [n, m] : net->named_modules())
    if (n == "fc") found = (m == net->fc.get());
  CHECK(found);
  CHECK(contains(net->repr(), "(fc): Linear(in_features=5, out_features=2"));
  // Hooks on the parent still run, and the forward uses the new head.
  CHECK((*net)(randn({3, 6})).sizes() == Shape{3, 2});
  CHECK(hook_calls == 1);
  // to() converts the new head; an optimizer built afterwards holds its parameters.
  net->to(kFloat64);
  CHECK(net->fc->weight.dtype() == kFloat64);
  CHECK(old_fc->weight.dtype() == kFloat32);
  auto opt = std::make_shared<optim::SGD>(net->parameters(), optim::SGDOptions(0.1));
  bool holds_new = false;
  for (const Tensor& p : opt->params(0)) holds_new = holds_new || p.is_same(net->fc->weight);
  CHECK(holds_new);
  // Loading a state dict reaches the new head.
  io::TensorDict sd = net->state_dict();
  sd["fc.bias"] = full({2}, 0.5, kFloat64);
  net->load_state_dict(sd);
  CHECK((net->fc->bias).allclose(full({2}, 0.5, kFloat64)));
}

TEST_CASE("members registered in the constructor body bind too; copies are plain handles") {
  LateNet net;
  net.scale = full({2}, 3.0);
  CHECK((net.parameter("scale")).allclose(full({2}, 3.0)));
  net.shift = ones({2});
  CHECK((net.buffer("shift")).allclose(ones({2})));
  net.fc = std::make_shared<nn::Linear>(3, 2, false);
  CHECK(names_of(net.named_parameters()) == std::vector<std::string>{"scale", "fc.weight"});

  // A copy is not the member: assigning it changes nothing in the module.
  nn::Parameter copy = net.scale;
  copy = zeros({2});
  CHECK((net.parameter("scale")).allclose(full({2}, 3.0)));
  auto fc_copy = net.fc;
  fc_copy = std::make_shared<nn::Linear>(3, 2);
  CHECK(net.parameter("fc.weight").is_same(net.fc->weight));
  CHECK(!net.fc->bias.defined());
}

TEST_CASE("set_parameter and register_* on a used name update the bound member") {
  auto lin = std::make_shared<nn::Linear>(3, 3);
  const Tensor w = ones({3, 3});
  lin->set_parameter("weight", w);
  CHECK(lin->weight.is_same(w));  // no need to rebind the member by hand any more

  Net net;
  auto replacement = std::make_shared<nn::Linear>(5, 3);
  net.register_module("fc", replacement);  // torch's add_module on a used name replaces
  CHECK(net.fc.get() == replacement.get());
  CHECK(net.children().size() == 2);
  net.replace_module("body", std::make_shared<nn::Linear>(6, 5, false));
  CHECK(!net.body->bias.defined());
  CHECK(net.parameters().size() == 3);

  // A name used by another kind, a child of another type than the member holds, a missing
  // child: errors naming them, nothing changed.
  std::string e = error_of([&] { net.register_parameter("fc", zeros({1})); });
  CHECK(contains(e, "[Module.register_parameter] Net: 'fc' is already registered as a submodule"));
  e = error_of([&] { net.register_module("fc", std::make_shared<nn::ReLU>()); });
  CHECK(
      contains(e, "[Module.register_module] Net: member 'fc' is an nn::Child<accel::nn::Linear>"));
  CHECK(contains(e, "cannot hold a ReLU"));
  CHECK(net.fc.get() == replacement.get());
  e = error_of([&] { net.replace_module("head", std::make_shared<nn::ReLU>()); });
  CHECK(contains(e, "[Module.replace_module] Net has no submodule 'head' (it has: body, fc)"));
  const Tensor leaf = ones({3, 3}).requires_grad_(true);
  e = error_of([&] { lin->weight = leaf * 2.0; });
  CHECK(contains(e, "[Module.setattr] Linear: parameter 'weight' (3, 3) has autograd history"));
  e = error_of([&] { lin->weight = zeros({3, 3}, kInt64); });
  CHECK(contains(e, "must be floating point"));
  CHECK(lin->weight.is_same(w));
}

TEST_CASE("None: an undefined tensor or a null child is listed nowhere until assigned") {
  auto lin = std::make_shared<nn::Linear>(4, 2);
  lin->bias = Tensor();  // torch: lin.bias = None
  CHECK(lin->parameters().size() == 1);
  CHECK(lin->state_dict().count("bias") == 0);
  CHECK(lin->forward(ones({1, 4})).sizes() == Shape{1, 2});
  // A Linear built without bias has a None entry a bias can be assigned to (torch's
  // register_parameter('bias', None)).
  auto nob = std::make_shared<nn::Linear>(4, 2, false);
  nob->bias = zeros({2});
  CHECK(names_of(nob->named_parameters()) == std::vector<std::string>{"weight", "bias"});

  Net net;
  net.fc = nullptr;
  CHECK(net.named_modules().size() == 2);
  CHECK(net.parameters().size() == 2);
  CHECK(contains(net.repr(), "(fc): None"));
  net.fc = std::make_shared<nn::Linear>(5, 1);
  CHECK(net.named_modules().size() == 3);

  auto seq = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(2, 2),
                                              std::make_shared<nn::ReLU>());
  std::string e = error_of([&] { seq->replace_module("0", std::shared_ptr<nn::Module>()); });
  CHECK(contains(e, "[Sequential.set] entry 0 cannot be None"));
}

TEST_CASE("container entries replaced with set(i, m) / replace_module are what forward calls") {
  auto seq = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(2, 2),
                                              std::make_shared<nn::ReLU>());
  seq->set(1, std::make_shared<nn::Tanh>());
  const Tensor x = full({1, 2}, -3.0);
  const Tensor y = seq->forward(x);
  CHECK((y).allclose(tanh((*seq)[0]->forward(x))));
  CHECK(contains(seq->repr(), "(1): Tanh"));
  auto list = std::make_shared<nn::ModuleList>();
  list->push_back(std::make_shared<nn::Linear>(2, 2));
  list->set(0, std::make_shared<nn::Linear>(2, 3));
  CHECK(list->at<nn::Linear>(0)->out_features == 3);
  CHECK(list->parameter("0.weight").sizes() == Shape{3, 2});
  CHECK(contains(error_of([&] { list->set(1, std::make_shared<nn::ReLU>()); }),
                 "[ModuleList.set] index 1 out of range for 1 modules"));
}

TEST_CASE("a buffer member assigned reaches state_dict; persistence is kept") {
  auto bn = std::make_shared<nn::BatchNorm1d>(3);
  bn->running_mean = full({3}, 2.0);
  CHECK((bn->state_dict().at("running_mean")).allclose(full({3}, 2.0)));
  Tensor with_grad = ones({3}).requires_grad_(true) * 1.0;
  bn->running_var = with_grad;  // buffers hold no history
  CHECK(!bn->buffer("running_var").requires_grad());
}

TEST_CASE("Module dtype spellings, modules(), as<M>()") {
  Net net;
  net.float64();
  CHECK(net.fc->weight.dtype() == kFloat64);
  net.half();
  CHECK(net.body->weight.dtype() == kFloat16);
  net.bfloat16();
  CHECK(net.fc->bias.dtype() == kBFloat16);
  net.float32();
  CHECK(net.fc->bias.dtype() == kFloat32);

  auto shared = std::make_shared<nn::Linear>(2, 2);
  auto seq = std::make_shared<nn::Sequential>(shared, std::make_shared<nn::ReLU>(), shared);
  // Shared modules are listed once (torch's remove_duplicate); self first.
  std::vector<std::shared_ptr<nn::Module>> all = seq->modules();
  REQUIRE(all.size() == 3);
  CHECK(all[0].get() == seq.get());
  CHECK(all[0].use_count() > 1);  // owning: seq is held by a shared_ptr
  CHECK(seq->modules(false).size() == 2);
  CHECK(all[1]->as<nn::Linear>() == shared.get());
  CHECK(all[2]->as<nn::Linear>() == nullptr);
  // A module on the stack: its own entry is a non-owning alias.
  CHECK(net.modules().front().get() == &net);
}

namespace {
// forward(x, mask, causal = true, scale = 2.0): defaults a ModuleList entry's call may leave out.
struct Masked : nn::TypedModule<Masked> {
  Tensor forward(const Tensor& x, const Tensor& mask, bool causal = true, double scale = 2.0) {
    return (causal ? x * mask : x) * scale;
  }
};
}  // namespace

TEST_CASE("type-erased calls leave out parameters that have default arguments") {
  auto list = std::make_shared<nn::ModuleList>();
  list->push_back(std::make_shared<Masked>());
  const Tensor x = full({2}, 3.0), mask = tensor({1.0f, 0.0f});
  const Tensor typed = (*list->at<Masked>(0))(x, mask);
  CHECK(((*list)[0]->call<Tensor>(x, mask)).allclose(typed));
  CHECK(((*list)[0]->call<Tensor>(x, mask, false)).allclose(x * 2.0));
  CHECK(((*list)[0]->call<Tensor>(x, mask, true, 1.0)).allclose(x * mask));
  std::string e = error_of([&] { (*list)[0]->call<Tensor>(x); });
  CHECK(contains(e,
                 "[Module.call] Masked.forward(Tensor, Tensor, bool, double) -> Tensor: called "
                 "with (Tensor)"));
  CHECK(contains(e, "parameters with default arguments"));
  // With a hook the erased path runs too (operator() packs the arguments).
  list->at<Masked>(0)->register_forward_pre_hook([](nn::Module&, std::vector<Tensor>&) {});
  CHECK(((*list)[0]->call<Tensor>(x, mask)).allclose(typed));
}

TEST_CASE("a wrapped layer's forward called directly raises; calls through the wrapper work") {
  auto lin = std::make_shared<nn::Linear>(2, 2);
  int wrapped = 0;
  lin->set_call_wrapper([&](nn::Module&, nn::Values& in, const nn::CallFn& call) {
    ++wrapped;
    return call(in);
  });
  const Tensor x = ones({1, 2});
  CHECK((*lin)(x).sizes() == Shape{1, 2});
  CHECK(lin->call<Tensor>(x).sizes() == Shape{1, 2});
  CHECK(wrapped == 2);
  const std::string e = error_of([&] { lin->forward(x); });
  CHECK(contains(e,
                 "[Module.forward] Linear's forward was called directly, but an engine wraps "
                 "this module"));
  // A container entry wrapped for a unit routes forward() through the wrapper.
  auto seq = std::make_shared<nn::Sequential>(lin);
  seq->wrap(0);
  CHECK(seq->forward(x).sizes() == Shape{1, 2});
  lin->set_call_wrapper({});
  CHECK(lin->forward(x).sizes() == Shape{1, 2});
}

TEST_CASE("a registration kept outside its module outlives it safely") {
  nn::Parameter outside;
  {
    auto lin = std::make_shared<nn::Linear>(2, 2);
    outside = lin->register_parameter("extra", zeros({2}));
    outside = ones({2});
    CHECK((lin->parameter("extra")).allclose(ones({2})));
  }
  outside = full({2}, 4.0);  // the module is gone: a plain handle now
  CHECK((outside).allclose(full({2}, 4.0)));
}

TEST_CASE("deferred init: a tie made by assignment keeps the owner's values") {
  manual_seed(5);
  TiedLm eager(true);
  manual_seed(5);
  std::shared_ptr<TiedLm> deferred;
  {
    nn::DeferredInit guard;
    deferred = std::make_shared<TiedLm>(true);
  }
  CHECK(nn::is_deferred(*deferred));
  nn::materialize(*deferred);
  CHECK((deferred->emb->weight).allclose(eager.emb->weight));
  CHECK(deferred->head->weight.is_same(deferred->emb->weight));
}
