// pytorch/examples word_language_model (main.py, model.py, data.py), ported: a word-level
// language model on the fortunes corpus, callable from the program
// (examples/word_language_model.cc) and from its PyTorch twin test
// (tests/examples/test_word_language_model.cc).
//
//   RNNModel: drop(encoder(input)) -> LSTM(ninp, nhid, nlayers, dropout) -> drop -> decoder,
//             log_softmax; decoder.weight tied to encoder.weight with --tied
//             input (bptt, bsz) int64 -> log-probabilities (bptt * bsz, ntoken)
//   training: truncated BPTT over batchify()'d columns, hidden state carried over (detached),
//             clip_grad_norm_ 0.25, plain SGD p -= lr * grad; lr /= 4 when validation does not
//             improve (the program's loop).
#pragma once

#include <cstdint>
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
      decoder->weight = decoder->set_parameter("weight", encoder->weight);
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
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Embedding> encoder;
  std::shared_ptr<nn::LSTM> rnn;
  std::shared_ptr<nn::Linear> decoder;
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
