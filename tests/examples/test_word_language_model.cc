// examples/word_language_model.h against its PyTorch twin
// (tests/examples/torch_word_language_model.py, which wrote word_language_model_fixture
// .safetensors): model.py's tied 2-layer LSTM RNNModel in float64 from the same initial weights
// (twin.h), dropout 0, the same token streams through batchify / get_batch, truncated BPTT with
// clipping and plain SGD, evaluate() and the lr rule after every epoch; every batch's loss, every
// validation loss and lr, and the final weights agree to 1e-10. Then the data helpers.
#include <doctest.h>

#include <cmath>
#include <string>

#include "accel.h"
#include "examples/word_language_model.h"
#include "tests/examples/twin.h"

using namespace accel;
using namespace accel::examples;

namespace {
bool close(double got, double want) {
  return std::abs(got - want) <= 1e-10 * std::max(1.0, std::abs(want));
}
}  // namespace

TEST_CASE("word_language_model: tied LSTM, BPTT, clipping, SGD and lr annealing match PyTorch") {
  const twin::Fixture fx("word_language_model_fixture.safetensors");
  auto meta = [&](const char* k) { return std::stoll(fx.meta(k)); };
  const int64_t ntoken = meta("ntoken"), emsize = meta("emsize"), bptt = meta("bptt");
  const int64_t epochs = meta("epochs"), batches = meta("batches"), bsz = meta("bsz");
  const double clip = std::stod(fx.meta("clip"));

  word_lm::RNNModel model(ntoken, emsize, emsize, meta("nlayers"), 0.0, /*tie_weights=*/true);
  twin::det_init(model);
  CHECK(model.decoder->weight.data_ptr() == model.encoder->weight.data_ptr());  // still tied
  CHECK(twin::checksum(model) ==
        doctest::Approx(std::stod(fx.meta("init_checksum"))).epsilon(1e-12));
  const Tensor train_data = word_lm::batchify(fx["train"], bsz);
  const Tensor val_data = word_lm::batchify(fx["valid"], meta("eval_bsz"));
  word_lm::Annealer schedule{std::stod(fx.meta("lr"))};
  int64_t k = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    word_lm::Hidden hidden = model.init_hidden(bsz);
    int64_t batch = 0;
    for (int64_t i = 0; i < train_data.size(0) - 1 && batch < batches; i += bptt, ++batch) {
      auto [data, targets] = word_lm::get_batch(train_data, i, bptt);
      const double loss = word_lm::train_step(model, data, targets, hidden, schedule.lr, clip);
      const double want = fx.at("losses", k++);
      INFO("epoch ", epoch, " batch ", batch, ": ours ", loss, ", torch ", want);
      CHECK(close(loss, want));
    }
    const double val_loss = word_lm::evaluate(model, val_data, bptt);
    INFO("epoch ", epoch, ": validation ", val_loss, ", torch ", fx.at("val_losses", epoch));
    CHECK(close(val_loss, fx.at("val_losses", epoch)));
    schedule.step(val_loss);
    CHECK(schedule.lr == fx.at("lrs", epoch));
  }
  CHECK(k == fx["losses"].numel());
  CHECK(schedule.lr < std::stod(fx.meta("lr")));  // the fixture anneals at least once
  const double want = std::stod(fx.meta("final_checksum"));
  CHECK(std::abs(twin::checksum(model) - want) <= 1e-10 * std::abs(want));
}

TEST_CASE("word_language_model: tokenize, batchify and get_batch as data.py / main.py") {
  word_lm::Dictionary d;
  const Tensor ids = word_lm::tokenize(d, "a b  a\n\nc\tb\n");
  // "a b a <eos>", "<eos>", "c b <eos>"
  CHECK(ids.numel() == 8);
  CHECK(d.size() == 4);
  CHECK(d.idx2word[2] == "<eos>");
  const std::vector<int64_t> want{0, 1, 0, 2, 2, 3, 1, 2};
  for (int64_t i = 0; i < 8; ++i) CHECK(int64_t(ids[i].item()) == want[size_t(i)]);

  const Tensor stream = arange(11);               // 0..10
  const Tensor b = word_lm::batchify(stream, 2);  // columns 0..4 and 5..9; 10 dropped
  CHECK(b.sizes() == Shape{5, 2});
  CHECK(int64_t(b[0][1].item()) == 5);
  CHECK(int64_t(b[4][0].item()) == 4);
  auto [data, target] = word_lm::get_batch(b, 3, 35);  // seq_len = min(35, 5 - 1 - 3) = 1
  CHECK(data.sizes() == Shape{1, 2});
  CHECK(target.sizes() == Shape{2});
  CHECK(int64_t(target[1].item()) == 9);
  CHECK_THROWS_AS(word_lm::batchify(stream, 6), ValueError);
}

TEST_CASE("word_language_model: tying needs nhid == emsize; untied weights are separate") {
  CHECK_THROWS_AS(word_lm::RNNModel(10, 8, 6, 1, 0.0, true), ValueError);
  word_lm::RNNModel untied(10, 8, 6, 1, 0.0, false);
  CHECK(untied.decoder->weight.data_ptr() != untied.encoder->weight.data_ptr());
  word_lm::RNNModel tied(10, 8, 8, 2, 0.2, true);
  // One tensor: parameters() holds it once (embedding, decoder bias, 2 LSTM layers).
  int64_t n = 0;
  for (const auto& p : tied.parameters()) n += p.numel();
  CHECK(n == 10 * 8 + 10 + 2 * (4 * 8 * 8 * 2 + 4 * 8 * 2));
  auto [out, hidden] = tied.forward(zeros({7, 3}, TensorOptions(kInt64)), tied.init_hidden(3));
  CHECK(out.sizes() == Shape{21, 10});
  CHECK(std::get<0>(hidden).sizes() == Shape{2, 3, 8});
}

TEST_CASE("word_language_model: the Transformer variant matches PyTorch") {
  // The same loop as the LSTM case with model.py's TransformerModel (causal mask, positional
  // encoding, 2 TransformerEncoderLayers, dropout 0): word_language_model_transformer_fixture.
  const twin::Fixture fx("word_language_model_transformer_fixture.safetensors");
  auto meta = [&](const char* k) { return std::stoll(fx.meta(k)); };
  const int64_t ntoken = meta("ntoken"), bptt = meta("bptt"), bsz = meta("bsz");
  const int64_t epochs = meta("epochs"), batches = meta("batches");
  const double clip = std::stod(fx.meta("clip"));

  word_lm::TransformerModel model(ntoken, meta("emsize"), meta("nhead"), meta("nhid"),
                                  meta("nlayers"), 0.0, kFloat64);
  twin::det_init(model);
  CHECK(twin::checksum(model) ==
        doctest::Approx(std::stod(fx.meta("init_checksum"))).epsilon(1e-12));
  const Tensor train_data = word_lm::batchify(fx["train"], bsz);
  const Tensor val_data = word_lm::batchify(fx["valid"], meta("eval_bsz"));
  word_lm::Annealer schedule{std::stod(fx.meta("lr"))};
  int64_t k = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    int64_t batch = 0;
    for (int64_t i = 0; i < train_data.size(0) - 1 && batch < batches; i += bptt, ++batch) {
      auto [data, targets] = word_lm::get_batch(train_data, i, bptt);
      const double loss = word_lm::train_step(model, data, targets, schedule.lr, clip);
      const double want = fx.at("losses", k++);
      INFO("epoch ", epoch, " batch ", batch, ": ours ", loss, ", torch ", want);
      CHECK(close(loss, want));
    }
    const double val_loss = word_lm::evaluate(model, val_data, bptt);
    INFO("epoch ", epoch, ": validation ", val_loss, ", torch ", fx.at("val_losses", epoch));
    CHECK(close(val_loss, fx.at("val_losses", epoch)));
    schedule.step(val_loss);
    CHECK(schedule.lr == fx.at("lrs", epoch));
  }
  CHECK(k == fx["losses"].numel());
  const double want = std::stod(fx.meta("final_checksum"));
  CHECK(std::abs(twin::checksum(model) - want) <= 1e-10 * std::abs(want));
}

TEST_CASE("word_language_model: causal mask and positional encoding") {
  const Tensor m = word_lm::TransformerModel::generate_square_subsequent_mask(3, kFloat32);
  CHECK(m[0][0].item() == 0);
  CHECK(m[2][1].item() == 0);
  CHECK(std::isinf(m[0][1].item()));
  CHECK(m[0][1].item() < 0);
  word_lm::PositionalEncoding pe(4, 0.0, 10);
  const Tensor out = pe.forward(zeros({3, 2, 4}));
  // position 1: sin(1), cos(1), sin(1 / 100), cos(1 / 100)
  CHECK(out[1][0][0].item() == doctest::Approx(std::sin(1.0)));
  CHECK(out[1][1][1].item() == doctest::Approx(std::cos(1.0)));
  CHECK(out[1][0][2].item() == doctest::Approx(std::sin(0.01)));
  CHECK(out[0][0][3].item() == doctest::Approx(1.0));
  CHECK_THROWS_AS(pe.forward(zeros({11, 1, 4})), ShapeError);
}
