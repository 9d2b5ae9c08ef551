// torch.save checkpoints (io/torch_format.h): files torch 1.13 wrote read back exactly
// (fixtures/torch_*.pt, made by make_torch_fixtures.py), files accel writes byte for byte
// torch.save's, a torch model's state dict loaded into the same accel model, PtValue's API and the
// writer's refusals.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "accel.h"
#include "io/torch_file.h"
#include "tests/io/pt_compare.h"
#include "tests/io/pt_content.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::expect_error;
using pt_test::check_same;
using pt_test::fixture;
using pt_test::read_file;
using pt_test::TempDir;

TEST_CASE("torch's state dict of every dtype reads back exactly, zip and legacy layouts") {
  const io::PtValue want = io::to_pt_value(pt_content::state());
  for (const std::string name : {"torch_state.pt", "torch_legacy.pt"}) {
    INFO(name);
    const nn::TensorDict sd = io::load_pt(fixture(name));
    REQUIRE(sd.size() == 41);
    // dtype, sizes, strides, offsets and the storages' bytes of every tensor; storage sharing.
    check_same(io::to_pt_value(sd), want);
    for (const auto& d : pt_content::dtypes()) {
      const std::string n = d.name;
      CHECK(sd.at(n).dtype() == d.dtype);
      CHECK(sd.at(n + ".t").storage() == sd.at(n).storage());  // a view of the same storage
      CHECK(sd.at(n + ".t").strides() == Shape{1, 4});
      CHECK(sd.at(n + ".narrow").offset() == 4);
      CHECK(sd.at(n + ".narrow").storage()->nbytes() == 20 * dtype_size(d.dtype));
      CHECK(sd.at(n + ".scalar").dim() == 0);
      CHECK(sd.at(n + ".empty").sizes() == Shape{0, 3});
    }
    CHECK(sd.at("expand").strides() == Shape{0, 1});
    CHECK(sd.at("f32.t").equal(pt_content::make({3, 4}, kFloat32).t()));
    CHECK(sd.at("i64").to_vector<int64_t>()[1] == int64_t(1) << 40);  // (26 % 17 - 8) << 40
  }
}

TEST_CASE("torch's nested tree reads back with its types, order and values") {
  const io::PtValue want = pt_content::tree();
  for (const std::string name : {"torch_tree.pt", "torch_legacy_tree.pt"}) {
    INFO(name);
    const io::PtValue got = io::read_pt(fixture(name));
    check_same(got, want);
    CHECK(got.at("ints").item(14).to_int() == INT64_MIN);
    CHECK(got.at("strings").item(2).to_string() == "h\xc3\xa9llo w\xc3\xb6rld");
    CHECK(got.at("int_keys").at(-7).to_string() == "minus seven");
    CHECK(got.at("int_keys").at(1.0).to_string() == "one");  // Python's 1 == 1.0
    const io::PtValue& od = got.at("od");
    CHECK(od.ordered());
    CHECK(od.type_name() == "OrderedDict");
    REQUIRE(od.attributes().size() == 1);
    CHECK(od.attributes()[0].key.to_string() == "_metadata");
    CHECK(got.at("matrix_t").to_tensor().storage() == got.at("matrix").to_tensor().storage());
    CHECK(got.at("counting").size() == 2001);
    CHECK(got.at("dict_1000").size() == 1000);
  }
}

TEST_CASE("save_pt writes the bytes torch.save writes") {
  TempDir dir;
  // The archive folder inside a torch file is named after the file, so the same name gives the
  // same bytes (make_torch_fixtures.py compares accel_state.pt and accel_tree.pt the same way).
  io::save_pt(dir.file("torch_state.pt"), pt_content::state());
  CHECK(read_file(dir.file("torch_state.pt")) == read_file(fixture("torch_state.pt")));
  io::save_pt(dir.file("torch_tree.pt"), pt_content::tree());
  CHECK(read_file(dir.file("torch_tree.pt")) == read_file(fixture("torch_tree.pt")));
  // The committed files torch loaded when they were made (fixtures/torch_verify.txt).
  io::save_pt(dir.file("accel_state.pt"), pt_content::state());
  CHECK(read_file(dir.file("accel_state.pt")) == read_file(fixture("accel_state.pt")));
  io::detail::save_pt_with(dir.file("accel_zip64.pt"), io::to_pt_value(pt_content::state()),
                           pt_content::kZip64Threshold);
  CHECK(read_file(dir.file("accel_zip64.pt")) == read_file(fixture("accel_zip64.pt")));
  // And accel reads its own zip64 layout.
  check_same(io::to_pt_value(io::load_pt(dir.file("accel_zip64.pt"))),
             io::to_pt_value(pt_content::state()));
}

TEST_CASE("a torch model's state dict loads strictly into the same accel model; .pt in save/load") {
  auto make_model = [] {
    auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(3, 2),
                                              std::make_shared<nn::BatchNorm1d>(2));
    m->to(kFloat64);
    return m;
  };
  auto model = make_model();
  nn::LoadResult r = model->load(fixture("torch_module.pt"));  // by its extension
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  const nn::TensorDict sd = model->state_dict();
  CHECK(sd.at("0.weight").equal(pt_content::make({2, 3}, kFloat64, 11)));
  CHECK(sd.at("0.bias").equal(pt_content::make({2}, kFloat64, 12)));
  CHECK(sd.at("1.running_mean").equal(pt_content::make({2}, kFloat64, 15)));
  CHECK(sd.at("1.num_batches_tracked").item<int64_t>() == 5);

  TempDir dir;
  // A torch file of another name (Hugging Face's pytorch_model.bin) is recognised by its bytes.
  std::filesystem::copy_file(fixture("torch_module.pt"), dir.file("pytorch_model.bin"));
  auto other = make_model();
  other->load(dir.file("pytorch_model.bin"));
  CHECK(other->state_dict().at("1.bias").equal(sd.at("1.bias")));

  // What is recognised by its first bytes: not a safetensors file whose header length (8 bytes)
  // spells the zip magic, as its header's '{' follows.
  using io::detail::looks_like_torch_file;
  const std::string zip_head = read_file(fixture("torch_module.pt")).substr(0, 16);
  const std::string legacy_head = read_file(fixture("torch_legacy.pt")).substr(0, 16);
  const std::string st_head("PK\x03\x04\0\0\0\0{\"a\": {}}", 17);
  auto looks = [&](const std::string& h) {
    return looks_like_torch_file(reinterpret_cast<const unsigned char*>(h.data()), h.size());
  };
  CHECK(looks(zip_head));
  CHECK(looks(legacy_head));
  CHECK_FALSE(looks(st_head));
  CHECK_FALSE(looks(std::string(16, '\0')));

  // Module::save to .pt / .pth writes torch.save's format.
  for (const char* name : {"m.pt", "m.pth"}) {
    model->save(dir.file(name));
    check_same(io::to_pt_value(io::load_pt(dir.file(name))), io::to_pt_value(sd));
  }
  CHECK(expect_error<std::exception>([&] {
          model->save(dir.file("meta.pt"), {{"epoch", "2"}});
        }).find("a torch.save file has no metadata") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("meta.pt")));

  // strict: torch's report of the missing and unexpected keys.
  auto small = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(3, 2));
  const std::string msg =
      expect_error<std::exception>([&] { small->load(fixture("torch_module.pt")); });
  CHECK(msg.find("Error(s) in loading state_dict for Sequential:\n\tUnexpected key(s) in "
                 "state_dict: \"1.bias\", \"1.num_batches_tracked\", ") != std::string::npos);
  r = small->load(fixture("torch_module.pt"), false);
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys == std::vector<std::string>{"1.bias", "1.num_batches_tracked",
                                                      "1.running_mean", "1.running_var",
                                                      "1.weight"});
}

TEST_CASE("a training checkpoint: read_pt, Parameters, numbers, to_tensor_dict") {
  const io::PtValue ck = io::read_pt(fixture("torch_ckpt.pt"));
  CHECK(ck.at("epoch").to_int() == 3);
  CHECK(ck.at("lr").to_double() == 0.5);
  CHECK(ck.at("names").is_tuple());
  CHECK(ck.at("names").item(1).to_string() == "b");
  const nn::TensorDict model = io::to_tensor_dict(ck.at("model"), "ckpt['model']");
  CHECK(model.size() == 7);
  // Parameters (torch._utils._rebuild_parameter) require grad and share the state dict's storage.
  const io::PtValue& params = ck.at("params");
  REQUIRE(params.size() == 4);
  const Tensor& w = params.item(0).to_tensor();
  CHECK(w.requires_grad());
  CHECK(w.storage() == model.at("0.weight").storage());
  CHECK_FALSE(model.at("0.weight").requires_grad());
  CHECK(ck.at("grad_leaf").to_tensor().requires_grad());
  CHECK(ck.at("grad_leaf").to_tensor().equal(pt_content::make({2}, kFloat32, 13)));

  // load_pt wants a state dict and says what the file holds instead.
  const std::string msg =
      expect_error<std::exception>([] { io::load_pt(fixture("torch_ckpt.pt")); });
  INFO(msg);
  CHECK(msg.find("[load_pt] '" + fixture("torch_ckpt.pt") +
                 "' is not a state dict: it holds an OrderedDict under 'model', not a tensor") ==
        0);
  CHECK(expect_error<std::exception>([&] {
          io::to_tensor_dict(ck.at("params"), "ckpt['params']");
        }).find("ckpt['params'] holds a list, not a dict of tensors") != std::string::npos);
}

TEST_CASE("PtValue: Python's dict keys, lookup, repr and type errors") {
  io::PtValue d = io::PtValue::dict({{1, "one"}, {"a", 2.5}, {io::PtValue::tuple({1, "x"}), 3}});
  CHECK(d.at(true).to_string() == "one");  // True == 1
  CHECK(d.at(io::PtValue::tuple({1.0, "x"})).to_int() == 3);
  CHECK(d.find("b") == nullptr);
  CHECK(expect_error<std::exception>([&] { d.at("b"); }).find("has no key 'b'") !=
        std::string::npos);
  CHECK(expect_error<std::exception>([] {
          io::PtValue::dict({{1, 1}, {1.0, 2}});
        }).find("the key 1.0 twice") != std::string::npos);
  CHECK(expect_error<std::exception>([] {
          io::PtValue::dict({{io::PtValue::list(), 1}});
        }).find("a dict key of type list") != std::string::npos);
  d.set("a", io::PtValue());
  CHECK(d.at("a").is_none());
  CHECK(d.size() == 3);
  CHECK(d.repr() == "{1: 'one', 'a': None, (1, 'x'): 3}");
  CHECK(io::PtValue::list({1.0, 0.1, io::PtValue::tuple({true})}).repr() == "[1.0, 0.1, (True,)]");
  CHECK(expect_error<std::exception>([] {
          io::PtValue("s").to_int();
        }).find("the value is a str, not an int") != std::string::npos);
  CHECK_THROWS_AS(io::PtValue::list({1}).item(1), IndexError);
  CHECK(io::PtValue(3).to_double() == 3.0);  // float(3), as Python
}

TEST_CASE("save_pt refuses what torch could not load, before creating the file") {
  TempDir dir;
  const std::string p = dir.file("bad.pt");
  nn::TensorDict undefined{{"w", Tensor()}};
  CHECK(expect_error<std::exception>([&] {
          io::save_pt(p, undefined);
        }).find("'w'] is undefined") != std::string::npos);
  // Two dtypes over one storage.
  const Tensor f = ones({4}, kFloat32);
  const Tensor as_int(make_intrusive<TensorImpl>(f.storage(), Shape{4}, Shape{1}, 0, kInt32));
  CHECK(expect_error<std::exception>([&] {
          io::save_pt(p, nn::TensorDict{{"a", f}, {"b", as_int}});
        }).find("a storage another tensor views as float32") != std::string::npos);
  // Deeper than the reader accepts.
  io::PtValue deep = io::PtValue::list();
  for (int i = 0; i < 120; ++i) deep = io::PtValue::list({deep});
  CHECK(expect_error<std::exception>([&] {
          io::save_pt(p, deep);
        }).find("nests deeper than 100 levels") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(p));
  // A tree as deep as the reader accepts round-trips.
  io::PtValue ok = io::PtValue::list();
  for (int i = 0; i < 99; ++i) ok = io::PtValue::list({ok});
  io::save_pt(p, ok);
  check_same(io::read_pt(p), ok);
}
