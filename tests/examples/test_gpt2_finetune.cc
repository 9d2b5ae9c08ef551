// examples/gpt2_finetune.h against its PyTorch twin (tests/examples/torch_gpt2_finetune.py, which
// wrote gpt2_finetune_fixture/ and gpt2_finetune_fixture.safetensors): a small random GPT-2 loaded
// from its Hugging Face folder in float64, the twin's text tokenized by the GPT-2 tokenizer and
// grouped into the same blocks, five AdamW steps of two accumulated micro-batches through the
// Accelerator (weight-decay groups, linear warm-up and decay, gradient clipping), the validation
// loss and greedy generation after them: every loss, lr and gradient norm, the final weights and
// the eval loss within 1e-10, the greedy tokens equal. Then save_pretrained's folder, and the
// data helpers and error paths of the program.
#include <doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "accel.h"
#include "io/safetensors.h"
#include "examples/gpt2_finetune.h"
#include "tests/examples/twin.h"

using namespace accel;
namespace ft = accel::examples::gpt2_ft;

namespace {

bool close(double got, double want) {
  return std::abs(got - want) <= 1e-10 * std::max(1.0, std::abs(want));
}

std::string tokenizer_dir() {
  return std::string(ACCEL_SOURCE_ROOT) + "/tests/hf/fixtures/gpt2_tokenizer";
}

std::vector<int64_t> to_vector(const Tensor& t) {
  const Tensor c = t.to(kInt64).contiguous();
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

bool same(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && to_vector(a) == to_vector(b);
}

AcceleratorConfig test_config(int accum) {
  AcceleratorConfig c;
  c.cpu = true;
  c.read_env = false;
  c.log_with = {};
  c.project_dir = "/tmp";
  c.gradient_accumulation_steps = accum;
  return c;
}

std::string scratch(const std::string& tag) {
  const std::string d = "/tmp/accel-gpt2ft-" + std::to_string(getpid()) + "-" + tag;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE(
    "gpt2_finetune: data, AdamW steps with accumulation and clipping, eval and greedy "
    "tokens match PyTorch") {
  const twin::Fixture fx("gpt2_finetune_fixture.safetensors");
  auto meta = [&](const char* k) { return std::stoll(fx.meta(k)); };
  auto metad = [&](const char* k) { return std::stod(fx.meta(k)); };
  const int64_t block = meta("block_size"), batch = meta("batch_size"), steps = meta("steps");
  const int accum = int(meta("accum"));

  // The data: the twin's text through the example's tokenizer and group_texts.
  const ft::TextTokenizer tok = ft::TextTokenizer::for_folder(tokenizer_dir());
  REQUIRE(!tok.is_bytes());
  const Tensor text_bytes = fx["text"];
  const std::string text(text_bytes.data<uint8_t>(),
                         text_bytes.data<uint8_t>() + text_bytes.numel());
  auto [train_lines, val_lines] =
      ft::split_validation(ft::split_lines(text), metad("validation_split_percentage"));
  const Tensor train_blocks = ft::group_texts(tok, train_lines, block);
  const Tensor val_blocks = ft::group_texts(tok, val_lines, block);
  CHECK(same(train_blocks, fx["train_blocks"]));
  CHECK(same(val_blocks, fx["val_blocks"]));
  CHECK(tok.encode(fx.meta("prompt_text")) == to_vector(fx["prompt"]));

  // The model, its optimizer and schedule, through the Accelerator.
  std::shared_ptr<hf::CausalLM> model =
      hf::from_pretrained(twin::fixture_path("gpt2_finetune_fixture"), {.dtype = kFloat64});
  model->train();
  CHECK(twin::checksum(*model) == doctest::Approx(metad("init_checksum")).epsilon(1e-12));
  Accelerator acc(test_config(accum));
  auto opt = ft::make_optimizer(*model, metad("lr"), metad("weight_decay"));
  auto sched = ft::make_scheduler(*opt, "linear", meta("warmup"), steps);
  auto [m, o, s] = acc.prepare(model, opt, sched);

  const Tensor order = fx["order"];
  int64_t step = 0;
  for (int64_t micro = 0; micro < steps * accum; ++micro) {
    const Tensor ids = index_select(train_blocks, 0, order.narrow(0, micro * batch, batch));
    const double lr = o->lr();
    const ft::MicroStep r = ft::train_micro_step(acc, *m, *o, *s, ids, metad("max_grad_norm"));
    INFO("micro-batch ", micro, ": loss ", r.loss, ", torch ", fx.at("losses", micro));
    CHECK(close(r.loss, fx.at("losses", micro)));
    if ((micro + 1) % accum == 0) {
      CHECK(acc.sync_gradients());
      CHECK(close(lr, fx.at("lrs", step)));
      CHECK(close(r.grad_norm, fx.at("grad_norms", step)));
      ++step;
    } else {
      CHECK(std::isnan(r.grad_norm));
    }
  }
  CHECK(acc.optimizer_steps() == steps);
  const double want = metad("final_checksum");
  CHECK(std::abs(twin::checksum(*m) - want) <= 1e-10 * std::abs(want));

  // Validation loss (batches of 2, each batch's mean counted per block) and greedy tokens.
  data::DataLoaderOptions vo;
  vo.batch_size = meta("eval_batch_size");
  auto loader = acc.prepare_data_loader(std::make_shared<data::DataLoader>(
      std::make_shared<data::TensorDataset>(std::vector<Tensor>{val_blocks}), vo));
  const double eval_loss = ft::evaluate(acc, *m, *loader);
  CHECK(close(eval_loss, fx.at("eval_loss", 0)));
  m->eval();
  const Tensor greedy = hf::generate(
      *m, fx["prompt"], {.max_new_tokens = fx["greedy"].size(1) - fx["prompt"].size(1)});
  CHECK(same(greedy, fx["greedy"]));

  // The fine-tuned model saved as a Hugging Face folder reads back with the same logits; the
  // file has transformers' names and Conv1D (in, out) layout, the tied head once.
  const std::string dir = scratch("save");
  hf::save_pretrained(*m, dir);
  tok.bpe()->save_pretrained(dir, 16);
  nn::Metadata md;
  const nn::TensorDict saved = nn::load_safetensors(dir + "/model.safetensors", &md);
  CHECK(md.at("format") == "pt");
  CHECK(!saved.count("lm_head.weight"));
  CHECK(saved.at("transformer.h.0.attn.c_attn.weight").sizes() == Shape{8, 24});
  CHECK(saved.at("transformer.h.1.mlp.c_proj.weight").sizes() == Shape{32, 8});
  CHECK(saved.at("transformer.wte.weight").sizes() == Shape{557, 8});
  const auto back = hf::from_pretrained(dir, {.dtype = kFloat64});
  {
    NoGradGuard ng;
    const Tensor x = fx["train_blocks"].narrow(0, 0, 3);
    CHECK(max(abs((*back)(x) - (*m)(x))).item<double>() == 0.0);
  }
  CHECK(ft::TextTokenizer::for_folder(dir).encode(text) == tok.encode(text));
  std::filesystem::remove_all(dir);
}

TEST_CASE("gpt2_finetune: lines, validation split, group_texts, loss") {
  using S = std::vector<std::string>;
  CHECK(ft::split_lines("a\nb\n\nc") == S{"a\n", "b\n", "\n", "c"});
  CHECK(ft::split_lines("a\nb\n", false) == S{"a", "b"});
  CHECK(ft::split_lines("").empty());
  const S lines{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13"};
  auto [train, val] = ft::split_validation(lines, 10);  // round(1.4) = 1 line
  CHECK(val == S{"0"});
  CHECK(train.size() == 13);
  CHECK(ft::split_validation(lines, 25).second.size() == 4);  // round(3.5) = 4
  CHECK(ft::split_validation(lines, 0).second.empty());

  // Bytes as tokens; groups of 2 lines, each group's remainder dropped: "abc" + "de" -> 5
  // tokens -> one block of 4; "fghij" -> one block; "k" -> none.
  const auto bytes = ft::TextTokenizer::bytes();
  const Tensor b = ft::group_texts(bytes, S{"abc", "de", "fghij", "", "k"}, 4, 2);
  CHECK(b.sizes() == Shape{2, 4});
  CHECK(to_vector(b) == std::vector<int64_t>{'a', 'b', 'c', 'd', 'f', 'g', 'h', 'i'});
  CHECK(ft::group_texts(bytes, S{"ab"}, 4).sizes() == Shape{0, 4});
  CHECK_THROWS_AS(ft::group_texts(bytes, S{"ab"}, 1), ValueError);

  // clm_loss: position t predicts token t + 1.
  const Tensor ids = tensor(std::vector<int64_t>{1, 2, 0}, {1, 3}, TensorOptions(kInt64));
  Tensor logits = zeros({1, 3, 4}, TensorOptions(kFloat64));
  logits.select(1, 0).select(1, 2).fill_(50.0);  // position 0 sure of token 2 (right)
  logits.select(1, 1).select(1, 3).fill_(50.0);  // position 1 sure of token 3 (wrong: 0)
  const double l = ft::clm_loss(logits, ids).item<double>();
  CHECK(l == doctest::Approx(50.0 / 2).epsilon(1e-6));
}

TEST_CASE("gpt2_finetune: byte fallback, optimizer groups, schedules, prompts") {
  const std::string dir = scratch("no-tokenizer");
  std::string note;
  const auto tok = ft::TextTokenizer::for_folder(dir, &note);
  CHECK(tok.is_bytes());
  CHECK(note.find("no tokenizer in '" + dir + "'") != std::string::npos);
  CHECK(note.find("bytes") != std::string::npos);
  CHECK(tok.encode("h\xc3\xa9") == std::vector<int64_t>{'h', 0xC3, 0xA9});
  CHECK(tok.decode(std::vector<int64_t>{'o', 'k'}) == "ok");
  CHECK(tok.decode(std::vector<int64_t>{'h', 0xC3, 0xA9, 0xC3}) == "h\xc3\xa9\xef\xbf\xbd");
  CHECK_THROWS_AS(tok.decode(std::vector<int64_t>{256}), ValueError);
  CHECK(ft::prompt_ids(tok, "") == std::vector<int64_t>{'\n'});
  // A folder with a broken tokenizer file is an error, not the fallback.
  std::ofstream(dir + "/tokenizer.json") << "{";
  CHECK_THROWS_AS(ft::TextTokenizer::for_folder(dir), IoError);
  std::filesystem::remove_all(dir);
  const auto bpe = ft::TextTokenizer::for_folder(tokenizer_dir());
  CHECK(ft::prompt_ids(bpe, "") == std::vector<int64_t>{556});  // <|endoftext|>

  // Weight decay on the Conv1D weights and embeddings only: not on biases, not on LayerNorms.
  auto model = hf::from_pretrained(twin::fixture_path("gpt2_finetune_fixture"));
  auto opt = ft::make_optimizer(*model, 1e-3, 0.1);
  REQUIRE(opt->num_param_groups() == 2);
  CHECK(opt->weight_decay(0) == 0.1);
  CHECK(opt->weight_decay(1) == 0.0);
  int64_t decayed = 0, kept = 0;
  for (const Tensor& p : opt->params(0)) decayed += p.numel();
  for (const Tensor& p : opt->params(1)) kept += p.numel();
  // wte 557 x 8, wpe 16 x 8; per layer c_attn 8 x 24, c_proj 8 x 8, c_fc 8 x 32, mlp c_proj 32 x 8
  CHECK(decayed == 557 * 8 + 16 * 8 + 2 * (8 * 24 + 8 * 8 + 8 * 32 + 32 * 8));
  // per layer 2 LayerNorms (16) + biases 24 + 8 + 32 + 8; ln_f 16
  CHECK(kept == 2 * (2 * 16 + 24 + 8 + 32 + 8) + 16);
  CHECK(decayed + kept == model->num_parameters());

  // get_scheduler: linear (warm-up 2 of 6), constant_with_warmup; unknown names.
  auto lrs = [&](const std::string& type) {
    auto o = ft::make_optimizer(*model, 1.0, 0.0);
    auto s = ft::make_scheduler(*o, type, 2, 6);
    std::vector<double> out;
    for (int i = 0; i < 7; ++i) {
      out.push_back(o->lr());
      s->step();
    }
    return out;
  };
  const std::vector<double> linear = lrs("linear");
  const std::vector<double> want{0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0};
  for (size_t i = 0; i < want.size(); ++i) CHECK(linear[i] == doctest::Approx(want[i]));
  CHECK(lrs("constant_with_warmup") == std::vector<double>{0, 0.5, 1, 1, 1, 1, 1});
  CHECK(lrs("constant") == std::vector<double>(7, 1.0));
  CHECK(lrs("cosine")[4] == doctest::Approx(0.5));
  auto o = ft::make_optimizer(*model, 1.0, 0.0);
  CHECK_THROWS_AS(ft::make_scheduler(*o, "polynomial", 0, 5), ValueError);
}
