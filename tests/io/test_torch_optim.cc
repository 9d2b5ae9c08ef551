// Optimizer states in torch's layout (optim/torch_state.h) against torch 1.13: the states
// torch wrote (fixtures/torch_{adam,adamw,sgd}.pt: two steps, the parameters then and after a
// third step) equal accel's after the same steps and continue in accel as in torch; the states
// accel writes are the committed accel_*.pt that torch loaded and continued from
// (make_torch_fixtures.py, fixtures/torch_verify.txt).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "accel.h"
#include "tests/io/pt_compare.h"
#include "tests/io/pt_content.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::expect_error;
using accel::test::max_abs_diff;
using pt_test::fixture;
using pt_test::read_file;
using pt_test::TempDir;

namespace {

// Two torch-layout optimizer states are equal: param_groups exactly (every key torch writes),
// state tensors within `tol`.
void check_same_state(const io::PtValue& got, const io::PtValue& want, double tol) {
  const io::PtValue& gg = got.at("param_groups");
  const io::PtValue& wg = want.at("param_groups");
  REQUIRE(gg.size() == wg.size());
  for (size_t g = 0; g < gg.size(); ++g) {
    // torch puts a group's explicit lr / weight_decay first; torch.optim does not read the order.
    REQUIRE(gg.item(g).size() == wg.item(g).size());
    for (const io::PtEntry& e : wg.item(g).entries()) {
      INFO(e.key.repr());
      const io::PtValue* v = gg.item(g).find(e.key);
      REQUIRE(v);
      CHECK(v->repr() == e.value.repr());
    }
  }
  const io::PtValue& gs = got.at("state");
  const io::PtValue& ws = want.at("state");
  REQUIRE(gs.size() == ws.size());
  for (const io::PtEntry& e : ws.entries()) {
    const io::PtValue& s = gs.at(e.key);
    REQUIRE(s.size() == e.value.size());
    for (const io::PtEntry& slot : e.value.entries()) {
      INFO(e.key.repr() << " " << slot.key.repr());
      const io::PtValue& v = s.at(slot.key);
      if (slot.value.is_none()) {
        CHECK(v.is_none());
        continue;
      }
      CHECK(v.to_tensor().dtype() == slot.value.to_tensor().dtype());
      CHECK(max_abs_diff(v.to_tensor(), slot.value.to_tensor()) <= tol);
    }
  }
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(const Tensor&, const Tensor&)>;

// pt_content.h's constructions (what make_torch_fixtures.py's OPTIMIZERS builds in torch).
std::unique_ptr<optim::Optimizer> adam(const Tensor& w, const Tensor& b) {
  return std::make_unique<optim::Adam>(
      std::vector<optim::ParamGroup>{{{w}, 0.01, 0.1}, {{b}, 0.02, 0.0}},
      optim::AdamFields{.lr = 0.01, .betas = {0.9, 0.99}, .eps = 1e-6, .weight_decay = 0.1});
}
std::unique_ptr<optim::Optimizer> adamw(const Tensor& w, const Tensor& b) {
  return std::make_unique<optim::AdamW>(
      std::vector<Tensor>{w, b},
      optim::AdamWFields{.lr = 0.01, .betas = {0.8, 0.9}, .eps = 1e-7, .weight_decay = 0.05});
}
std::unique_ptr<optim::Optimizer> sgd(const Tensor& w, const Tensor& b) {
  return std::make_unique<optim::SGD>(
      std::vector<Tensor>{w, b},
      optim::SGDFields{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
}

struct Case {
  const char* name;
  MakeOpt make;
  io::PtValue (*run)();
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {{"adam", adam, pt_content::adam_run},
                                      {"adamw", adamw, pt_content::adamw_run},
                                      {"sgd", sgd, pt_content::sgd_run}};
  return c;
}

}  // namespace

TEST_CASE("accel's optimizer state after two steps is torch's, in torch's layout") {
  for (const Case& c : cases()) {
    INFO(c.name);
    const io::PtValue torch = io::read_pt(fixture(std::string("torch_") + c.name + ".pt"));
    const io::PtValue accel = c.run();
    check_same_state(accel.at("optimizer"), torch.at("optimizer"), 1e-12);
    for (const char* p : {"weight", "bias"})
      CHECK(max_abs_diff(accel.at("params").at(p).to_tensor(),
                         torch.at("params").at(p).to_tensor()) <= 1e-12);
  }
}

TEST_CASE("torch's optimizer state loads and the next step is torch's") {
  for (const Case& c : cases()) {
    INFO(c.name);
    const io::PtValue torch = io::read_pt(fixture(std::string("torch_") + c.name + ".pt"));
    Tensor w = torch.at("params").at("weight").to_tensor().clone().requires_grad_(true);
    Tensor b = torch.at("params").at("bias").to_tensor().clone().requires_grad_(true);
    auto opt = c.make(w, b);
    optim::load_torch_state(*opt, torch.at("optimizer"));
    if (std::string(c.name) != "sgd") CHECK(opt->step_count(0) == 2);  // torch's float step
    // Written back in torch's layout it is the file's state (SGD's momentum buffers carry no step
    // count; they are state all the same).
    check_same_state(optim::torch_state(*opt), torch.at("optimizer"), 0);
    w.set_grad(pt_content::grad({2, 3}, 3, 0));
    b.set_grad(pt_content::grad({2}, 3, 1));
    opt->step();
    CHECK(max_abs_diff(w.detach(), torch.at("params3").at("weight").to_tensor()) <= 1e-12);
    CHECK(max_abs_diff(b.detach(), torch.at("params3").at("bias").to_tensor()) <= 1e-12);
  }
}

TEST_CASE("the optimizer states accel writes are the files torch loaded") {
  TempDir dir;
  for (const Case& c : cases()) {
    INFO(c.name);
    const std::string name = std::string("accel_") + c.name + ".pt";
    io::save_pt(dir.file(name), c.run());
    CHECK(read_file(dir.file(name)) == read_file(fixture(name)));
  }
}

TEST_CASE("hyperparameters torch keeps per group must equal the optimizer's options") {
  const io::PtValue adam_state = io::read_pt(fixture("torch_adam.pt")).at("optimizer");
  Tensor w = zeros({2, 3}, kFloat64).requires_grad_(true);
  Tensor b = zeros({2}, kFloat64).requires_grad_(true);
  optim::Adam other({w, b}, {.lr = 0.01, .betas = {0.9, 0.999}, .eps = 1e-8});
  const std::string msg =
      expect_error<std::exception>([&] { optim::load_torch_state(other, adam_state); });
  CHECK(msg.find("[load_torch_state] the file's hyperparameters differ from this optimizer's "
                 "options") == 0);
  CHECK(msg.find("param_groups[0]['betas'] is (0.9, 0.99), this optimizer's (0.9, 0.999)") !=
        std::string::npos);
  CHECK(msg.find("param_groups[1]['eps'] is 1e-06, this optimizer's 1e-08") != std::string::npos);
  CHECK(other.step_count(0) == 0);  // nothing loaded

  // Another class's state: SGD has no betas; an Adam state has no momentum.
  CHECK(expect_error<std::exception>([&] {
          optim::load_torch_state(other, io::read_pt(fixture("torch_sgd.pt")).at("optimizer"));
        }).find("param_groups[0] has no 'betas'") != std::string::npos);
  optim::SGD s({w, b}, {.lr = 0.1, .momentum = 0.9});
  CHECK(expect_error<std::exception>([&] {
          optim::load_torch_state(s, adam_state);
        }).find("param_groups[0] has no 'momentum'") != std::string::npos);
  // Group structure is checked by Optimizer::load_state_dict: one group here, two in the file.
  optim::Adam one({w, b}, {.lr = 0.01, .betas = {0.9, 0.99}, .eps = 1e-6});
  CHECK_THROWS_AS(optim::load_torch_state(one, adam_state), ValueError);

  // Optimizers without a torch mapping.
  optim::RMSprop r({w});
  CHECK(expect_error<std::exception>([&] {
          optim::torch_state(r);
        }).find("writes SGD, Adam and AdamW states") != std::string::npos);
  CHECK(expect_error<std::exception>([&] {
          optim::load_torch_state(r, adam_state);
        }).find("reads torch states into SGD, Adam and AdamW") != std::string::npos);
  // A malformed state.
  io::PtValue bad = io::PtValue::dict({{"state", io::PtValue::dict({{"0", io::PtValue::dict()}})},
                                       {"param_groups", io::PtValue::list()}});
  CHECK(expect_error<std::exception>([&] {
          optim::flat_state_from_torch(bad);
        }).find("'state' has the key '0'; torch numbers parameters 0, 1, ...") !=
        std::string::npos);
}
