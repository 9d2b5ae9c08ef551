// pytorch/examples word_language_model (main.py, model.py, data.py), ported: a word-level
// language model on the fortunes corpus, callable from the program
// (examples/word_language_model.cc) and from its PyTorch twin test
// (tests/examples/test_word_language_model.cc).
//
//   TransformerModel: encoder(input) * sqrt(ninp) + positional encoding, TransformerEncoder
//             under the causal mask, decoder, log_softmax (--model Transformer)
//   RNNModel: drop(encoder(input)) -> LSTM(ninp, nhid, nlayers, dropout) -> drop -> decoder,
//             log_softmax; decoder.weight tied to encoder.weight with --tied
//             input (bptt, bsz) int64 -> log-probabilities (bptt * bsz, ntoken)
//   training: truncated BPTT over batchify()'d columns, hidden state carried over (detached),
//             clip_grad_norm_ 0.25, plain SGD p -= lr * grad; lr /= 4 when validation does not
//             improve (the program's loop).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "accel.h"
#include "data/data.h"

namespace accel::examples::word_lm {

// data.py's Dictionary: word <-> index in order of first appearance.
class Dictionary {
 public:
  int64_t add_word(const std::string& word) {
    auto [it, inserted] = word2idx.try_emplace(word, int64_t(idx2word.size()));
    if (inserted) idx2word.push_back(word);
    return it->second;
  }
  int64_t size() const { return int64_t(idx2word.size()); }

  std::unordered_map<std::string, int64_t> word2idx;
  std::vector<std::string> idx2word;
};

// data.py's tokenize(): every line's whitespace-separated words and "<eos>", added to the
// dictionary, as int64 ids (N).
inline Tensor tokenize(Dictionary& dictionary, const std::string& text) {
  std::vector<int64_t> ids;
  std::istringstream lines(text);
  std::string line, word;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    while (words >> word) ids.push_back(dictionary.add_word(word));
    ids.push_back(dictionary.add_word("<eos>"));
  }
  return tensor(ids, {int64_t(ids.size())}, TensorOptions(kInt64));
}

// data.py's Corpus on the fortunes text (data::read_fortunes_corpus) instead of wikitext-2's
// three files: its lines are split in order, the first 90 % for training, the next 5 % for
// validation, the last 5 % for the test.
struct Corpus {
  Dictionary dictionary;
  Tensor train, valid, test;  // int64 (N)
};

inline Corpus fortunes_corpus(const std::string& dir = data::kFortunesDir) {
  const std::vector<uint8_t> bytes = data::read_fortunes_corpus(dir);
  std::vector<std::string> lines;
  std::string cur;
  for (uint8_t b : bytes) {
    if (b == '\n') {
      lines.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(char(b));
    }
  }
  if (!cur.empty()) lines.push_back(cur);
  const size_t n = lines.size(), n_train = n * 90 / 100, n_valid = n * 5 / 100;
  auto join = [&](size_t lo, size_t hi) {
    std::string s;
    for (size_t i = lo; i < hi; ++i) s += lines[i] + "\n";
    return s;
  };
  Corpus c;
  c.train = tokenize(c.dictionary, join(0, n_train));
  c.valid = tokenize(c.dictionary, join(n_train, n_train + n_valid));
  c.test = tokenize(c.dictionary, join(n_train + n_valid, n));
  return c;
}

// main.py's batchify: (N) -> (N / bsz, bsz), column j the j-th contiguous slice of the stream
// (the tail that does not fill a row is dropped).
inline Tensor batchify(const Tensor& data, int64_t bsz) {
  const int64_t nbatch = data.size(0) / bsz;
  ACCEL_CHECK(nbatch >= 2, ValueError, "batchify", "a stream of ", data.size(0),
              " tokens is too short for batch size ", bsz);
  return data.narrow(0, 0, nbatch * bsz).view({bsz, -1}).t().contiguous();
}

// main.py's get_batch: rows [i, i + seq_len) as input and the rows one later, flattened, as
// targets; seq_len = min(bptt, rows - 1 - i).
inline std::tuple<Tensor, Tensor> get_batch(const Tensor& source, int64_t i, int64_t bptt) {
  const int64_t seq_len = std::min(bptt, source.size(0) - 1 - i);
  return {source.narrow(0, i, seq_len), source.narrow(0, i + 1, seq_len).reshape({-1})};
}

using Hidden = nn::LSTM::State;  // (h, c), each (nlayers, bsz, nhid)

// model.py's RNNModel with rnn_type 'LSTM': container module with an encoder, a recurrent module,
// and a decoder.
class RNNModel : public nn::Module {
 public:
  RNNModel(int64_t ntoken, int64_t ninp, int64_t nhid, int64_t nlayers, double dropout = 0.5,
           bool tie_weights = false)
      : ntoken(ntoken),
        nhid(nhid),
        nlayers(nlayers),
        drop(register_module("drop", std::make_shared<nn::Dropout>(dropout))),
        encoder(register_module("encoder", std::make_shared<nn::Embedding>(ntoken, ninp))),
        rnn(register_module("rnn",
                            std::make_shared<nn::LSTM>(ninp, nhid, nlayers, true, false, dropout))),
        decoder(register_module("decoder", std::make_shared<nn::Linear>(nhid, ntoken))) {
    // Optionally tie weights as in "Using the Output Embedding to Improve Language Models"
    // (Press & Wolf 2016) and "Tying Word Vectors and Word Classifiers" (Inan et al. 2016).
    if (tie_weights) {
      ACCEL_CHECK(nhid == ninp, ValueError, "RNNModel",
                  "When using the tied flag, nhid must be equal to emsize (got nhid ", nhid,
                  ", emsize ", ninp, ")");
      decoder->weight = encoder->weight;  // torch: self.decoder.weight = self.encoder.weight
    }
    init_weights();
  }

  void init_weights() {
    const double initrange = 0.1;
    nn::init::uniform_(encoder->weight, -initrange, initrange);
    nn::init::zeros_(decoder->bias);
    nn::init::uniform_(decoder->weight, -initrange, initrange);
  }

  // input (bptt, bsz) int64, hidden -> (log-probabilities (bptt * bsz, ntoken), hidden)
  std::tuple<Tensor, Hidden> forward(const Tensor& input, const Hidden& hidden) {
    const Tensor emb = drop->forward(encoder->forward(input));
    auto [output, new_hidden] = (*rnn)(emb, hidden);
    output = drop->forward(output);
    const Tensor decoded = decoder->forward(output).view({-1, ntoken});
    return {log_softmax(decoded, 1), new_hidden};
  }
  Tensor forward(const Tensor& input) override {
    return std::get<0>(forward(input, init_hidden(input.size(1))));
  }

  Hidden init_hidden(int64_t bsz) const {
    const TensorOptions o =
        TensorOptions(encoder->weight.dtype()).with_device(encoder->weight.device());
    return {zeros({nlayers, bsz, nhid}, o), zeros({nlayers, bsz, nhid}, o)};
  }

  int64_t ntoken, nhid, nlayers;
  nn::Child<nn::Dropout> drop;
  nn::Child<nn::Embedding> encoder;
  nn::Child<nn::LSTM> rnn;
  nn::Child<nn::Linear> decoder;
};

// Wraps hidden states in new tensors, to detach them from their history.
inline Hidden repackage_hidden(const Hidden& h) {
  return {std::get<0>(h).detach(), std::get<1>(h).detach()};
}

// One batch of train(): forward from the carried-over (detached) hidden state, nll_loss,
// backward, clip_grad_norm_(clip), p -= lr * grad. Updates `hidden`; returns the loss.
inline double train_step(RNNModel& model, const Tensor& data, const Tensor& targets, Hidden& hidden,
                         double lr, double clip) {
  // Starting each batch, we detach the hidden state from how it was previously produced.
  // If we didn't, the model would try backpropagating all the way to start of the dataset.
  model.zero_grad();
  hidden = repackage_hidden(hidden);
  auto [output, new_hidden] = model.forward(data, hidden);
  hidden = new_hidden;
  const Tensor loss = nll_loss(output, targets);
  loss.backward();
  // `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
  const std::vector<Tensor> params = model.parameters();
  nn::clip_grad_norm_(params, clip);
  {
    NoGradGuard ng;
    for (const Tensor& p : params) p.data().add_(p.grad(), -lr);
  }
  return loss.item();
}

// main.py's evaluate(): the mean loss per target token over the whole stream, batchified by
// the caller, in eval mode (no dropout), hidden state carried across batches.
inline double evaluate(RNNModel& model, const Tensor& data_source, int64_t bptt) {
  model.eval();
  NoGradGuard ng;
  double total_loss = 0;
  Hidden hidden = model.init_hidden(data_source.size(1));
  for (int64_t i = 0; i < data_source.size(0) - 1; i += bptt) {
    auto [data, targets] = get_batch(data_source, i, bptt);
    auto [output, new_hidden] = model.forward(data, hidden);
    hidden = repackage_hidden(new_hidden);
    total_loss += double(data.size(0)) * nll_loss(output, targets).item();
  }
  model.train();
  return total_loss / double(data_source.size(0) - 1);
}

// model.py's PositionalEncoding: adds sin / cos of the position at geometric frequencies to
// each embedding (Vaswani et al. 2017), then dropout.
//   PE(pos, 2i) = sin(pos / 10000^(2i / d_model)), PE(pos, 2i + 1) = cos(pos / 10000^(2i /
//   d_model))
// x: (S, N, d_model) -> (S, N, d_model). The table is computed in float64 and stored in `dtype`
// (the original computes it in float32; a float64 model, as in the PyTorch check, wants the
// float64 table rather than float32 values converted).
class PositionalEncoding : public nn::Module {
 public:
  explicit PositionalEncoding(int64_t d_model, double dropout = 0.1, int64_t max_len = 5000,
                              DType dtype = kFloat32)
      : dropout(register_module("dropout", std::make_shared<nn::Dropout>(dropout))) {
    std::vector<double> pe(static_cast<size_t>(max_len * d_model), 0.0);
    const double scale = -std::log(10000.0) / double(d_model);
    for (int64_t i = 0; 2 * i < d_model; ++i) {
      const double div_term = std::exp(double(2 * i) * scale);
      for (int64_t pos = 0; pos < max_len; ++pos) {
        const double angle = double(pos) * div_term;
        pe[size_t(pos * d_model + 2 * i)] = std::sin(angle);
        if (2 * i + 1 < d_model) pe[size_t(pos * d_model + 2 * i + 1)] = std::cos(angle);
      }
    }
    register_buffer("pe", tensor(pe, {max_len, 1, d_model}, TensorOptions(kFloat64)).to(dtype));
  }

  Tensor forward(const Tensor& x) override {
    const Tensor& pe = buffer("pe");
    ACCEL_CHECK(x.size(0) <= pe.size(0), ShapeError, "PositionalEncoding", "sequence of ",
                x.size(0), " positions, the table has ", pe.size(0));
    return dropout->forward(add(x, pe.narrow(0, 0, x.size(0))));
  }

  nn::Child<nn::Dropout> dropout;
};

// model.py's TransformerModel: "Container module with an encoder, a recurrent or transformer
// module, and a decoder." Embedding * sqrt(ninp), PositionalEncoding, a TransformerEncoder of
// nlayers TransformerEncoderLayer(ninp, nhead, nhid, dropout) under the causal (square
// subsequent) mask, decoder, log_softmax.
// src (S, N) int64 -> log-probabilities (S, N, ntoken).
class TransformerModel : public nn::Module {
 public:
  TransformerModel(int64_t ntoken, int64_t ninp, int64_t nhead, int64_t nhid, int64_t nlayers,
                   double dropout = 0.5, DType table_dtype = kFloat32)
      : ninp(ninp),
        pos_encoder(register_module(
            "pos_encoder", std::make_shared<PositionalEncoding>(ninp, dropout, 5000, table_dtype))),
        transformer_encoder(register_module(
            "transformer_encoder",
            std::make_shared<nn::TransformerEncoder>(
                std::make_shared<nn::TransformerEncoderLayer>(ninp, nhead, nhid, dropout),
                nlayers))),
        encoder(register_module("encoder", std::make_shared<nn::Embedding>(ntoken, ninp))),
        decoder(register_module("decoder", std::make_shared<nn::Linear>(ninp, ntoken))) {
    init_weights();
  }

  // (sz, sz) float: 0 on and below the diagonal, -inf above.
  static Tensor generate_square_subsequent_mask(int64_t sz, DType dtype) {
    const Tensor ones_above = triu(ones({sz, sz}, TensorOptions(dtype)), 1);
    return masked_fill(zeros({sz, sz}, TensorOptions(dtype)), gt(ones_above, 0.0),
                       -std::numeric_limits<double>::infinity());
  }

  void init_weights() {
    const double initrange = 0.1;
    nn::init::uniform_(encoder->weight, -initrange, initrange);
    nn::init::zeros_(decoder->bias);
    nn::init::uniform_(decoder->weight, -initrange, initrange);
  }

  Tensor forward(const Tensor& src_ids) override { return forward(src_ids, true); }
  Tensor forward(const Tensor& src_ids, bool has_mask) {
    std::optional<Tensor> mask;
    if (has_mask) {
      const DType dtype = encoder->weight.dtype();
      if (!src_mask_.defined() || src_mask_.size(0) != src_ids.size(0) ||
          src_mask_.dtype() != dtype)
        src_mask_ = generate_square_subsequent_mask(src_ids.size(0), dtype);
      mask = src_mask_;
    }
    Tensor src = mul(encoder->forward(src_ids), std::sqrt(double(ninp)));
    src = pos_encoder->forward(src);
    const Tensor output = transformer_encoder->forward(src, mask);
    return log_softmax(decoder->forward(output), -1);
  }

  int64_t ninp;
  std::shared_ptr<PositionalEncoding> pos_encoder;
  nn::Child<nn::TransformerEncoder> transformer_encoder;
  nn::Child<nn::Embedding> encoder;
  nn::Child<nn::Linear> decoder;

 private:
  Tensor src_mask_;
};

// train_step for the Transformer (no hidden state): forward, nll_loss over (S * N, ntoken),
// backward, clip_grad_norm_(clip), p -= lr * grad. Returns the loss.
inline double train_step(TransformerModel& model, const Tensor& data, const Tensor& targets,
                         double lr, double clip) {
  model.zero_grad();
  const Tensor output = model.forward(data);
  const Tensor loss = nll_loss(output.view({-1, output.size(-1)}), targets);
  loss.backward();
  const std::vector<Tensor> params = model.parameters();
  nn::clip_grad_norm_(params, clip);
  {
    NoGradGuard ng;
    for (const Tensor& p : params) p.data().add_(p.grad(), -lr);
  }
  return loss.item();
}

// evaluate() for the Transformer.
inline double evaluate(TransformerModel& model, const Tensor& data_source, int64_t bptt) {
  model.eval();
  NoGradGuard ng;
  double total_loss = 0;
  for (int64_t i = 0; i < data_source.size(0) - 1; i += bptt) {
    auto [data, targets] = get_batch(data_source, i, bptt);
    const Tensor output = model.forward(data);
    total_loss +=
        double(data.size(0)) * nll_loss(output.view({-1, output.size(-1)}), targets).item();
  }
  model.train();
  return total_loss / double(data_source.size(0) - 1);
}

// main.py's learning-rate rule: after every epoch, a validation loss below the best so far is
// the new best (the program saves the model); otherwise lr /= 4.
struct Annealer {
  double lr;
  std::optional<double> best_val_loss{};
  // Returns true when val_loss is the best so far.
  bool step(double val_loss) {
    if (!best_val_loss || val_loss < *best_val_loss) {
      best_val_loss = val_loss;
      return true;
    }
    // Anneal the learning rate if no improvement has been seen in the validation dataset.
    lr /= 4.0;
    return false;
  }
};

}  // namespace accel::examples::word_lm
