// Recurrent layers: RNN (tanh / relu), LSTM, GRU and their cells, PyTorch's torch.nn.RNN /
// LSTM / GRU / RNNCell / LSTMCell / GRUCell with the same arguments, defaults, shapes, parameter
// names, gate order and initialisation, so a PyTorch state_dict loads unchanged; and
// nn::utils::rnn's pad_sequence / pack_padded_sequence / pad_packed_sequence.
//
// Shapes (L = seq_len, N = batch, D = 2 if bidirectional else 1, H = hidden_size):
//   input   (L, N, input_size), (N, L, input_size) with batch_first, or unbatched (L, input_size)
//   h_0/c_0 (num_layers * D, N, H), unbatched (num_layers * D, H); zeros when not given
//   output  (L, N, D * H) (batch_first: (N, L, D * H)): the last layer's h_t, both directions
//           concatenated (forward first)
//   h_n/c_n (num_layers * D, N, H): the final states, ordered layer 0 forward, layer 0 reverse,
//           layer 1 forward, ...
// Gates (PyTorch's definitions; W_i* = weight_ih rows, W_h* = weight_hh rows, b_* the biases):
//   RNN   h' = tanh(W_ih x + b_ih + W_hh h + b_hh)               (or relu)
//   LSTM  rows [i | f | g | o]: i,f,o = sigmoid(...), g = tanh(...), c' = f c + i g,
//         h' = o tanh(c')
//   GRU   rows [r | z | n]: r,z = sigmoid(W_i* x + b_i* + W_h* h + b_h*),
//         n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h' = (1 - z) n + z h
// Parameters per layer k (suffix _reverse for the reverse direction), G = 1 / 4 / 3 gates:
//   weight_ih_l{k} (G*H, input_size or D*H), weight_hh_l{k} (G*H, H), bias_ih_l{k} (G*H),
//   bias_hh_l{k} (G*H); every one U(-1/sqrt(H), 1/sqrt(H)), drawn in registration order.
//
// Note [recurrent time loop]: per layer and direction, the input projection of every step is one
// GEMM, x (L*N, in) @ W_ih^T + b_ih -> (L, N, G*H); the loop then runs only the recurrent
// (N, H) @ W_hh^T GEMM and the gate arithmetic per step, composed from differentiable ops (no
// kernel of its own), so every device and dtype the ops support works. LSTM and GRU layers
// without lengths record one autograd node per layer direction with a backward written in ops
// (Note [fused LSTM layer] in rnn.cc); RNN layers and masked loops record the per-step ops.
//
// Note [sequence lengths]: PyTorch's packed sequences make each sequence stop at its length.
// Here a sequence's lengths (int64, one per batch entry, each in [1, L]) mask the loop instead:
// at step t, entries with t >= length keep their previous state and output zero. The forward
// direction therefore ends with the state at each sequence's last valid step, and the reverse
// direction starts each sequence at its last valid step from h_0, as torch's packed sequences
// give. Lengths are passed to forward() directly or through utils::rnn::PackedSequence, which
// keeps the padded (L, N, *) tensor and the lengths rather than torch's interleaved data.
#pragma once

#include <array>
#include <deque>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "nn/module.h"
#include "core/generator.h"

namespace accel::nn {

namespace utils::rnn {

// torch.nn.utils.rnn.PackedSequence, as padded data plus lengths (Note [sequence lengths]).
struct PackedSequence {
  Tensor padded;   // (L, N, *) time-major, L = max(lengths)
  Tensor lengths;  // int64 CPU (N), each in [1, L]
};

// Stacks sequences (L_i, *) into (max L_i, N, *) ((N, max L_i, *) with batch_first), filling
// past each sequence's end with padding_value. Differentiable.
Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first = false,
                    double padding_value = 0.0);
// input (L, N, *) ((N, L, *) with batch_first) and one length per sequence (int64 / int32 tensor
// on any device, or a vector). enforce_sorted requires decreasing lengths, as PyTorch's default
// does (unsorted lengths work with enforce_sorted = false; nothing here needs them sorted).
PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths,
                                    bool batch_first = false, bool enforce_sorted = true);
PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                    bool batch_first = false, bool enforce_sorted = true);
// pad_sequence then pack: sequences (L_i, *).
PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted = true);
// (padded, lengths): (T, N, *) or (N, T, *) with batch_first, positions past a sequence's length
// set to padding_value, T = max(lengths) or total_length (which may not be shorter).
std::tuple<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence,
                                               bool batch_first = false, double padding_value = 0.0,
                                               std::optional<int64_t> total_length = std::nullopt);

}  // namespace utils::rnn

namespace detail {

enum class RNNMode { Tanh, ReLU, LSTM, GRU };

// The configuration and weights shared by RNN, LSTM and GRU (not a module: the module classes
// derive from TypedModule<Self> and from this).
class RNNLayers {
 public:
  int64_t input_size, hidden_size, num_layers;
  bool bias, batch_first;
  double dropout;
  bool bidirectional;
  // num_layers * D entries in h_n's order: {weight_ih, weight_hh, bias_ih, bias_hh} (biases
  // undefined without bias), sharing the registered parameters.
  // Bound to the module's entries (Note [module members]): a deque, so that adding a layer never
  // moves (and so unbinds) the earlier ones.
  std::deque<std::array<Parameter, 4>> all_weights;

  // PyTorch's flatten_parameters(): weights are used as registered, so there is nothing to do.
  void flatten_parameters() {}

 protected:
  struct Result {
    Tensor output, h_n, c_n;
  };
  RNNLayers(Module& self, RNNMode mode, int64_t input_size, int64_t hidden_size, int64_t num_layers,
            bool bias, bool batch_first, double dropout, bool bidirectional, Generator* gen);
  void reset_weights(Generator* gen);
  std::string layers_repr() const;
  // The whole stack over input; c_0 / c_n only for LSTM.
  Result run(const std::optional<Tensor>& input, const std::optional<Tensor>& h0,
             const std::optional<Tensor>& c0, const std::optional<Tensor>& lengths,
             bool training) const;

  RNNMode mode_;
  const char* name_;  // "RNN", "LSTM", "GRU": error messages
  Generator* gen_;    // dropout
};

}  // namespace detail

// torch.nn.RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
// batch_first=False, dropout=0.0, bidirectional=False). forward(input, h_0, lengths) ->
// (output, h_n). Dropout applies to every layer's output but the last, in training mode only.
class RNN : public TypedModule<RNN>, public detail::RNNLayers {
 public:
  RNN(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1,
      const std::string& nonlinearity = "tanh", bool bias = true, bool batch_first = false,
      double dropout = 0.0, bool bidirectional = false, Generator* gen = nullptr);
  std::tuple<Tensor, Tensor> forward(const Tensor& input, std::optional<Tensor> h0 = std::nullopt,
                                     std::optional<Tensor> lengths = std::nullopt);
  using TypedModule<RNN>::operator();
  // rnn(packed[, h_0]) -> (packed output, h_n), as PyTorch's module(packed).
  std::tuple<utils::rnn::PackedSequence, Tensor> operator()(utils::rnn::PackedSequence input);
  std::tuple<utils::rnn::PackedSequence, Tensor> operator()(utils::rnn::PackedSequence input,
                                                            Tensor h0);
  void reset_parameters(Generator* gen = nullptr) override { reset_weights(gen); }
  std::string extra_repr() const override;
  std::string nonlinearity;
};

// torch.nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
// dropout=0.0, bidirectional=False). forward(input, h_0, c_0, lengths) -> (output, (h_n, c_n));
// h_0 and c_0 are given together or not at all. (*lstm)(x, std::make_tuple(h0, c0)) is
// PyTorch's lstm(x, (h0, c0)). proj_size is not supported.
class LSTM : public TypedModule<LSTM>, public detail::RNNLayers {
 public:
  using State = std::tuple<Tensor, Tensor>;  // (h, c)
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
       bool batch_first = false, double dropout = 0.0, bool bidirectional = false,
       Generator* gen = nullptr);
  std::tuple<Tensor, State> forward(const Tensor& input, std::optional<Tensor> h0 = std::nullopt,
                                    std::optional<Tensor> c0 = std::nullopt,
                                    std::optional<Tensor> lengths = std::nullopt);
  using TypedModule<LSTM>::operator();
  std::tuple<Tensor, State> operator()(Tensor input, State state);
  std::tuple<Tensor, State> operator()(Tensor input, std::optional<State> state);
  std::tuple<utils::rnn::PackedSequence, State> operator()(utils::rnn::PackedSequence input);
  std::tuple<utils::rnn::PackedSequence, State> operator()(utils::rnn::PackedSequence input,
                                                           State state);
  void reset_parameters(Generator* gen = nullptr) override { reset_weights(gen); }
  std::string extra_repr() const override { return layers_repr(); }
};

// torch.nn.GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
// bidirectional=False). forward(input, h_0, lengths) -> (output, h_n).
class GRU : public TypedModule<GRU>, public detail::RNNLayers {
 public:
  GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
      bool batch_first = false, double dropout = 0.0, bool bidirectional = false,
      Generator* gen = nullptr);
  std::tuple<Tensor, Tensor> forward(const Tensor& input, std::optional<Tensor> h0 = std::nullopt,
                                     std::optional<Tensor> lengths = std::nullopt);
  using TypedModule<GRU>::operator();
  std::tuple<utils::rnn::PackedSequence, Tensor> operator()(utils::rnn::PackedSequence input);
  std::tuple<utils::rnn::PackedSequence, Tensor> operator()(utils::rnn::PackedSequence input,
                                                            Tensor h0);
  void reset_parameters(Generator* gen = nullptr) override { reset_weights(gen); }
  std::string extra_repr() const override { return layers_repr(); }
};

// The cells: one step. input (N, input_size) or unbatched (input_size); states (N, H) or (H),
// zeros when not given. Parameters weight_ih (G*H, input_size), weight_hh (G*H, H), bias_ih,
// bias_hh (G*H), each U(-1/sqrt(H), 1/sqrt(H)).
namespace detail {
class CellWeights {
 public:
  int64_t input_size, hidden_size;
  bool bias;
  Parameter weight_ih, weight_hh, bias_ih, bias_hh;

 protected:
  CellWeights(Module& self, RNNMode mode, int64_t input_size, int64_t hidden_size, bool bias,
              Generator* gen);
  void reset_weights(Generator* gen);
  std::string cell_repr() const;
  // (h', c') for one step; c only for LSTM.
  std::tuple<Tensor, Tensor> step(const Tensor& input, const std::optional<Tensor>& h,
                                  const std::optional<Tensor>& c) const;
  RNNMode mode_;
  const char* name_;
};
}  // namespace detail

// torch.nn.RNNCell(input_size, hidden_size, bias=True, nonlinearity='tanh'): h' = forward(x, h).
class RNNCell : public TypedModule<RNNCell>, public detail::CellWeights {
 public:
  RNNCell(int64_t input_size, int64_t hidden_size, bool bias = true,
          const std::string& nonlinearity = "tanh", Generator* gen = nullptr);
  Tensor forward(const Tensor& input, std::optional<Tensor> hx = std::nullopt);
  void reset_parameters(Generator* gen = nullptr) override { reset_weights(gen); }
  std::string extra_repr() const override;
  std::string nonlinearity;
};

// torch.nn.LSTMCell(input_size, hidden_size, bias=True): (h', c') = forward(x, h, c);
// (*cell)(x, std::make_tuple(h, c)) as PyTorch's cell(x, (h, c)).
class LSTMCell : public TypedModule<LSTMCell>, public detail::CellWeights {
 public:
  using State = std::tuple<Tensor, Tensor>;
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true, Generator* gen = nullptr);
  State forward(const Tensor& input, std::optional<Tensor> hx = std::nullopt,
                std::optional<Tensor> cx = std::nullopt);
  using TypedModule<LSTMCell>::operator();
  State operator()(Tensor input, State state);
  void reset_parameters(Generator* gen = nullptr) override { reset_weights(gen); }
  std::string extra_repr() const override { return cell_repr(); }
};

// torch.nn.GRUCell(input_size, hidden_size, bias=True): h' = forward(x, h).
class GRUCell : public TypedModule<GRUCell>, public detail::CellWeights {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& input, std::optional<Tensor> hx = std::nullopt);
  void reset_parameters(Generator* gen = nullptr) override { reset_weights(gen); }
  std::string extra_repr() const override { return cell_repr(); }
};

}  // namespace accel::nn
