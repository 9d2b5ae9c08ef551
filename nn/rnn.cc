#include "nn/rnn.h"

#include <algorithm>
#include <cmath>

#include "autograd/function.h"
#include "nn/init.h"
#include "autograd/ops.h"

namespace accel::nn {

namespace {

using detail::RNNMode;

const char* mode_name(RNNMode m) {
  switch (m) {
    case RNNMode::Tanh:
    case RNNMode::ReLU: return "RNN";
    case RNNMode::LSTM: return "LSTM";
    case RNNMode::GRU: return "GRU";
  }
  return "RNN";
}

const char* cell_name(RNNMode m) {
  switch (m) {
    case RNNMode::Tanh:
    case RNNMode::ReLU: return "RNNCell";
    case RNNMode::LSTM: return "LSTMCell";
    case RNNMode::GRU: return "GRUCell";
  }
  return "RNNCell";
}

int64_t gate_count(RNNMode m) { return m == RNNMode::LSTM ? 4 : m == RNNMode::GRU ? 3 : 1; }

RNNMode parse_nonlinearity(const char* who, const std::string& s) {
  ACCEL_CHECK(s == "tanh" || s == "relu", ValueError, who,
              "nonlinearity must be \"tanh\" or \"relu\", got \"", s, "\"");
  return s == "tanh" ? RNNMode::Tanh : RNNMode::ReLU;
}

// One step from the input projection xw = W_ih x + b_ih (N, G*H) and the state (N, H): returns
// (h', c'); c is undefined unless LSTM.
std::tuple<Tensor, Tensor> cell_step(RNNMode mode, const Tensor& xw, const Tensor& h,
                                     const Tensor& c, const Tensor& w_hh, const Tensor& b_hh) {
  Tensor hw = linear(h, w_hh, b_hh);  // (N, G*H)
  switch (mode) {
    case RNNMode::Tanh: return {tanh(xw + hw), Tensor()};
    case RNNMode::ReLU: return {relu(xw + hw), Tensor()};
    case RNNMode::LSTM: {
      const int64_t H = h.size(-1);
      Tensor g = xw + hw;  // [i | f | g | o]
      Tensor i_f = sigmoid(g.narrow(-1, 0, 2 * H));
      Tensor i = i_f.narrow(-1, 0, H), f = i_f.narrow(-1, H, H);
      Tensor cand = tanh(g.narrow(-1, 2 * H, H));
      Tensor o = sigmoid(g.narrow(-1, 3 * H, H));
      Tensor c2 = f * c + i * cand;
      return {o * tanh(c2), c2};
    }
    case RNNMode::GRU: {
      const int64_t H = h.size(-1);
      // r and z see both projections; n sees r * (W_hn h + b_hn), PyTorch's definition.
      Tensor rz = sigmoid(xw.narrow(-1, 0, 2 * H) + hw.narrow(-1, 0, 2 * H));
      Tensor r = rz.narrow(-1, 0, H), z = rz.narrow(-1, H, H);
      Tensor n = tanh(xw.narrow(-1, 2 * H, H) + r * hw.narrow(-1, 2 * H, H));
      return {n + z * (h - n), Tensor()};
    }
  }
  return {};
}

// The fused layers' backward under create_graph (Note [double backward by recompute] in
// autograd/function.h): the layer recomputed step by step with cell_step on stand-ins of
// in = (xw, h0, c0, w_hh, b_hh) (c0 for LSTM, b_hh for GRU; the others undefined), then
// differentiated with the incoming gradients of (output, h_n[, c_n]). One gradient per entry of in.
autograd::Grads recompute_layer(RNNMode mode, const std::vector<Tensor>& in,
                                const autograd::Grads& g, bool reverse) {
  const bool lstm = mode == RNNMode::LSTM;
  return autograd::recompute_grads(in, g, [mode, lstm, reverse](const std::vector<Tensor>& s) {
    const int64_t T = s[0].size(0);
    std::vector<Tensor> outs(static_cast<size_t>(T));
    Tensor h = s[1], c = s[2];
    for (int64_t k = 0; k < T; ++k) {
      const int64_t t = reverse ? T - 1 - k : k;
      auto [h2, c2] = cell_step(mode, s[0].select(0, t), h, c, s[3], s[4]);
      outs[size_t(t)] = h2;
      h = h2;
      c = c2;
    }
    std::vector<Tensor> r{stack(outs, 0), h};
    if (lstm) r.push_back(c);
    return r;
  });
}

// Note [fused LSTM layer]
// An LSTM layer direction without a length mask runs as one autograd node instead of ~12 per
// step. The forward loop is the composed one run without recording (the activated gates, tanh(g),
// tanh(c) and the states are kept); the backward walks the steps in reverse with framework ops:
//   dh_t += dout_t;  dc += dh_t o (1 - tanh(c_t)^2);  do = dh_t tanh(c_t)
//   di = dc g;  df = dc c_{t-1};  dg = dc i;  dc <- dc f
//   dgates_t = [di i(1-i) | df f(1-f) | dg (1-g^2) | do o(1-o)] (N, 4H);  dh <- dgates_t W_hh
// and then the gradient of W_hh as one GEMM over every step, dG^T (4H, T*N) @ H_prev (T*N, H),
// where the per-op graph would run T GEMMs with K = N. Biases enter through the input projection
// (b_ih + b_hh once per layer), so their gradients are one reduction too. Being written with ops
// it runs on every device. Under create_graph the layer is recomputed from the composed steps and
// differentiated instead (recompute_layer above), so double backward works.
// `xw` (T, N, 4H) holds W_ih x + b_ih + b_hh; returns (output (T, N, H), h_n, c_n).
std::tuple<Tensor, Tensor, Tensor> lstm_layer_fused(const Tensor& xw, const Tensor& h0,
                                                    const Tensor& c0, const Tensor& w_hh,
                                                    bool reverse) {
  const int64_t T = xw.size(0), H = h0.size(-1);
  std::vector<Tensor> hs(static_cast<size_t>(T)), cs(hs.size()), sig(hs.size()), tg(hs.size()),
      tc(hs.size());
  {
    NoGradGuard no_grad;
    Tensor h = h0, c = c0;
    for (int64_t k = 0; k < T; ++k) {
      const size_t t = size_t(reverse ? T - 1 - k : k);
      Tensor g = xw.select(0, int64_t(t)) + linear(h, w_hh);  // (N, 4H): [i | f | g | o]
      sig[t] = sigmoid(g);                                    // g's quarter is unused
      tg[t] = tanh(g.narrow(-1, 2 * H, H));
      c = sig[t].narrow(-1, H, H) * c + sig[t].narrow(-1, 0, H) * tg[t];
      tc[t] = tanh(c);
      h = sig[t].narrow(-1, 3 * H, H) * tc[t];
      hs[t] = h;
      cs[t] = c;
    }
  }
  Tensor out = stack(hs, 0);
  const size_t last = size_t(reverse ? 0 : T - 1);
  Tensor h_n = hs[last], c_n = cs[last];
  if (autograd::needs_grad(xw, h0, c0, w_hh)) {
    // hs / cs / sig / tg / tc are this node's own tensors; only hs[last] and cs[last] are handed
    // out (as h_n, c_n), and the backward reads neither: they are no step's previous state.
    autograd::record(
        "lstm_layer", {&xw, &h0, &c0, &w_hh}, {&out, &h_n, &c_n},
        [hs, cs, sig, tg, tc, reverse, T, H, x_dtype = xw.dtype(), xs = autograd::save_input(xw, 0),
         h0 = autograd::save_input(h0, 1), c0 = autograd::save_input(c0, 2),
         w = autograd::save_input(w_hh, 3)](const autograd::Grads& g) -> autograd::Grads {
          if (autograd::creating_graph()) {
            const autograd::Grads r = recompute_layer(
                RNNMode::LSTM, {xs.unpack(), h0.unpack(), c0.unpack(), w.unpack(), Tensor()}, g,
                reverse);
            return {r[0], r[1], r[2], r[3]};  // xw, h0, c0, w_hh
          }
          const Tensor h_init = h0.unpack();
          const Tensor c_init = c0.unpack();
          const Tensor w_hh = w.unpack();
          Tensor dh = g[1].defined() ? g[1] : zeros_like(h_init);
          Tensor dc = g[2].defined() ? g[2] : zeros_like(c_init);
          std::vector<Tensor> dgs(static_cast<size_t>(T));
          for (int64_t k = T - 1; k >= 0; --k) {
            const size_t t = size_t(reverse ? T - 1 - k : k);
            const size_t tp = size_t(reverse ? T - k : k - 1);  // the previous step (k > 0)
            if (g[0].defined()) dh = dh + g[0].select(0, int64_t(t));
            const Tensor& s = sig[t];
            const Tensor i = s.narrow(-1, 0, H), f = s.narrow(-1, H, H), o = s.narrow(-1, 3 * H, H);
            const Tensor& c_prev = k == 0 ? c_init : cs[tp];
            const Tensor d_o = dh * tc[t];
            dc = dc + dh * o * (1.0 - tc[t] * tc[t]);
            const Tensor di = dc * tg[t] * i * (1.0 - i);
            const Tensor df = dc * c_prev * f * (1.0 - f);
            const Tensor dgg = dc * i * (1.0 - tg[t] * tg[t]);
            dc = dc * f;
            dgs[t] = cat({di, df, dgg, d_o * o * (1.0 - o)}, -1);  // (N, 4H)
            dh = matmul(dgs[t], w_hh);
          }
          Tensor dG = stack(dgs, 0);  // (T, N, 4H)
          // H_prev: each step's previous state, in time order.
          std::vector<Tensor> prev(static_cast<size_t>(T));
          for (int64_t t = 0; t < T; ++t) {
            const int64_t p = reverse ? t + 1 : t - 1;
            prev[size_t(t)] = (p < 0 || p >= T) ? h_init : hs[size_t(p)];
          }
          const int64_t rows = T * h_init.size(0);
          Tensor dw = matmul(dG.reshape({rows, 4 * H}).t(), stack(prev, 0).reshape({rows, H}));
          // Under autocast the forward mixes bf16 projections with float32 states: each
          // gradient takes its input's dtype.
          return {dG.to(x_dtype), dh.to(h_init.dtype()), dc.to(c_init.dtype()),
                  dw.to(w_hh.dtype())};
        });
  }
  return {out, h_n, c_n};
}

// A GRU layer direction without a length mask, as one node (Note [fused LSTM layer]). `xw`
// (T, N, 3H) holds W_ih x + b_ih; b_hh stays per step (n sees r * (W_hn h + b_hn)). Backward:
//   dn = dh (1 - z);  dz = dh (h - n);  dh_prev = dh z + dHW W_hh
//   da_n = dn (1 - n^2);  da_r = da_n hn r (1 - r);  da_z = dz z (1 - z)
//   dXW_t = [da_r | da_z | da_n],  dHW_t = [da_r | da_z | da_n r]
// with dW_hh = dHW^T H_prev and db_hh = sum(dHW) once over every step.
std::tuple<Tensor, Tensor> gru_layer_fused(const Tensor& xw, const Tensor& h0, const Tensor& w_hh,
                                           const Tensor& b_hh, bool reverse) {
  const int64_t T = xw.size(0), H = h0.size(-1);
  std::vector<Tensor> hs(static_cast<size_t>(T)), rz(hs.size()), n(hs.size()), hn(hs.size());
  {
    NoGradGuard no_grad;
    Tensor h = h0;
    for (int64_t k = 0; k < T; ++k) {
      const size_t t = size_t(reverse ? T - 1 - k : k);
      const Tensor x = xw.select(0, int64_t(t));
      const Tensor hw = linear(h, w_hh, b_hh);  // (N, 3H)
      rz[t] = sigmoid(x.narrow(-1, 0, 2 * H) + hw.narrow(-1, 0, 2 * H));
      hn[t] = hw.narrow(-1, 2 * H, H);
      n[t] = tanh(x.narrow(-1, 2 * H, H) + rz[t].narrow(-1, 0, H) * hn[t]);
      h = n[t] + rz[t].narrow(-1, H, H) * (h - n[t]);
      hs[t] = h;
    }
  }
  Tensor out = stack(hs, 0);
  Tensor h_n = hs[size_t(reverse ? 0 : T - 1)];
  if (autograd::needs_grad(xw, h0, w_hh, b_hh)) {
    autograd::record(
        "gru_layer", {&xw, &h0, &w_hh, &b_hh}, {&out, &h_n},
        [hs, rz, n, hn, reverse, T, H, x_dtype = xw.dtype(),
         b_dtype = b_hh.defined() ? b_hh.dtype() : xw.dtype(), xs = autograd::save_input(xw, 0),
         h0 = autograd::save_input(h0, 1), w = autograd::save_input(w_hh, 2),
         bs = autograd::save_input(b_hh, 3),
         has_bias = b_hh.defined()](const autograd::Grads& g) -> autograd::Grads {
          if (autograd::creating_graph()) {
            const autograd::Grads r = recompute_layer(
                RNNMode::GRU, {xs.unpack(), h0.unpack(), Tensor(), w.unpack(), bs.unpack()}, g,
                reverse);
            return {r[0], r[1], r[3], r[4]};  // xw, h0, w_hh, b_hh
          }
          const Tensor h_init = h0.unpack();
          const Tensor w_hh = w.unpack();
          Tensor dh = g[1].defined() ? g[1] : zeros_like(h_init);
          std::vector<Tensor> dxs(static_cast<size_t>(T)), dhws(dxs.size()), prev(dxs.size());
          for (int64_t k = T - 1; k >= 0; --k) {
            const size_t t = size_t(reverse ? T - 1 - k : k);
            const size_t tp = size_t(reverse ? T - k : k - 1);
            if (g[0].defined()) dh = dh + g[0].select(0, int64_t(t));
            const Tensor& h_prev = k == 0 ? h_init : hs[tp];
            prev[t] = h_prev;
            const Tensor r = rz[t].narrow(-1, 0, H), z = rz[t].narrow(-1, H, H);
            const Tensor da_n = dh * (1.0 - z) * (1.0 - n[t] * n[t]);
            const Tensor da_r = da_n * hn[t] * r * (1.0 - r);
            const Tensor da_z = dh * (h_prev - n[t]) * z * (1.0 - z);
            dxs[t] = cat({da_r, da_z, da_n}, -1);
            dhws[t] = cat({da_r, da_z, da_n * r}, -1);
            dh = dh * z + matmul(dhws[t], w_hh);
          }
          const int64_t rows = T * h_init.size(0);
          Tensor dHW = stack(dhws, 0).reshape({rows, 3 * H});
          Tensor dw = matmul(dHW.t(), stack(prev, 0).reshape({rows, H}));
          Tensor db = has_bias ? sum(dHW, {0}) : Tensor();
          return {stack(dxs, 0).to(x_dtype), dh.to(h_init.dtype()), dw.to(w_hh.dtype()),
                  has_bias ? db.to(b_dtype) : db};
        });
  }
  return {out, h_n};
}

void check_sizes(const char* who, int64_t input_size, int64_t hidden_size) {
  ACCEL_CHECK(input_size > 0 && hidden_size > 0, ValueError, who,
              "input_size and hidden_size must be positive, got ", input_size, " and ",
              hidden_size);
}

// Lengths as host values: one per batch entry, each in [1, max_len] (max_len < 0: unbounded).
std::vector<int64_t> host_lengths(const char* who, const Tensor& lengths, int64_t batch,
                                  int64_t max_len) {
  ACCEL_CHECK(lengths.defined(), ValueError, who, "lengths is undefined");
  ACCEL_CHECK(lengths.dtype() == kInt64 || lengths.dtype() == kInt32, DTypeError, who,
              "lengths must be int64 or int32, got ", lengths.dtype());
  ACCEL_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, ShapeError, who,
              "lengths must be (batch) = (", batch, "), got ", lengths.sizes());
  std::vector<int64_t> out;
  for (double v : lengths.to(kCPU).tolist()) out.push_back(int64_t(v));
  for (size_t b = 0; b < out.size(); ++b)
    ACCEL_CHECK(out[b] >= 1 && (max_len < 0 || out[b] <= max_len), ValueError, who, "lengths[", b,
                "] = ", out[b], " is outside [1, ",
                max_len < 0 ? std::string("inf") : std::to_string(max_len), "]");
  return out;
}

// (T, N, 1) bool on `device`: t < lengths[n].
Tensor length_mask(const std::vector<int64_t>& lengths, int64_t T, Device device) {
  const int64_t N = int64_t(lengths.size());
  std::vector<int64_t> m(size_t(T * N));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) m[size_t(t * N + n)] = t < lengths[size_t(n)] ? 1 : 0;
  return tensor(m, {T, N, 1}).to(kBool).to(device);
}

}  // namespace

namespace detail {

// ---------------- RNNLayers ----------------

RNNLayers::RNNLayers(Module& self, RNNMode mode, int64_t input_size_, int64_t hidden_size_,
                     int64_t num_layers_, bool bias_, bool batch_first_, double dropout_,
                     bool bidirectional_, Generator* gen)
    : input_size(input_size_),
      hidden_size(hidden_size_),
      num_layers(num_layers_),
      bias(bias_),
      batch_first(batch_first_),
      dropout(dropout_),
      bidirectional(bidirectional_),
      mode_(mode),
      name_(mode_name(mode)),
      gen_(gen) {
  check_sizes(name_, input_size, hidden_size);
  ACCEL_CHECK(num_layers >= 1, ValueError, name_, "num_layers must be at least 1, got ",
              num_layers);
  ACCEL_CHECK(dropout >= 0 && dropout <= 1, ValueError, name_,
              "dropout must be a probability in [0, 1], got ", dropout);
  const int64_t G = gate_count(mode) * hidden_size, D = bidirectional ? 2 : 1;
  for (int64_t l = 0; l < num_layers; ++l) {
    const int64_t in = l == 0 ? input_size : D * hidden_size;
    for (int64_t d = 0; d < D; ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d == 1 ? "_reverse" : "");
      std::array<Parameter, 4>& w = all_weights.emplace_back();
      w[0] = self.register_parameter("weight_ih" + sfx, empty({G, in}));
      w[1] = self.register_parameter("weight_hh" + sfx, empty({G, hidden_size}));
      if (bias) {
        w[2] = self.register_parameter("bias_ih" + sfx, empty({G}));
        w[3] = self.register_parameter("bias_hh" + sfx, empty({G}));
      }
    }
  }
  reset_weights(gen);
}

void RNNLayers::reset_weights(Generator* gen) {
  const double bound = 1.0 / std::sqrt(double(hidden_size));
  for (auto& w : all_weights)
    for (auto& t : w)
      if (t.defined()) init::uniform_(t, -bound, bound, gen);
}

std::string RNNLayers::layers_repr() const {
  std::string s = std::to_string(input_size) + ", " + std::to_string(hidden_size);
  if (num_layers != 1) s += ", num_layers=" + std::to_string(num_layers);
  if (!bias) s += ", bias=false";
  if (batch_first) s += ", batch_first=true";
  if (dropout != 0) s += ", dropout=" + std::to_string(dropout);
  if (bidirectional) s += ", bidirectional=true";
  return s;
}

RNNLayers::Result RNNLayers::run(const std::optional<Tensor>& input_opt,
                                 const std::optional<Tensor>& h0, const std::optional<Tensor>& c0,
                                 const std::optional<Tensor>& lengths, bool training) const {
  const char* who = name_;
  const bool lstm = mode_ == RNNMode::LSTM;
  ACCEL_CHECK(input_opt && input_opt->defined(), ValueError, who, "input is undefined");
  const Tensor& input = *input_opt;
  const std::string layout = batch_first ? "(batch, seq_len, " : "(seq_len, batch, ";
  ACCEL_CHECK((input.dim() == 3 || input.dim() == 2) && input.size(-1) == input_size, ShapeError,
              who, "expected input ", layout, input_size, ") or unbatched (seq_len, ", input_size,
              "), got ", input.sizes());
  ACCEL_CHECK(input.is_floating_point(), DTypeError, who, "input must be floating, got ",
              input.dtype());
  ACCEL_CHECK(!lstm || h0.has_value() == c0.has_value(), ValueError, who,
              "h_0 and c_0 are given together or not at all (got only ", h0 ? "h_0" : "c_0", ")");
  const bool batched = input.dim() == 3;
  ACCEL_CHECK(batched || !lengths, ValueError, who, "lengths need a batched input, got unbatched ",
              input.sizes());
  // x: (T, N, in), time-major.
  Tensor x = batched ? (batch_first ? input.transpose(0, 1) : input) : input.unsqueeze(1);
  const int64_t T = x.size(0), N = x.size(1), H = hidden_size, D = bidirectional ? 2 : 1;
  ACCEL_CHECK(T >= 1, ShapeError, who, "input has no time steps: ", input.sizes());
  const Shape state_shape = batched ? Shape{num_layers * D, N, H} : Shape{num_layers * D, H};

  auto initial = [&](const std::optional<Tensor>& s, const char* what) {
    if (!s || !s->defined()) return zeros({num_layers * D, N, H}, {x.dtype(), x.device()});
    ACCEL_CHECK(s->sizes() == state_shape, ShapeError, who, "expected ", what, " ", state_shape,
                " for input ", input.sizes(), ", got ", s->sizes());
    ACCEL_CHECK(s->dtype() == x.dtype() && s->device() == x.device(), DTypeError, who, what,
                " must match the input's dtype and device (", x.dtype(), ", ", x.device(),
                "), got ", s->dtype(), ", ", s->device());
    return batched ? *s : s->unsqueeze(1);
  };
  const Tensor h_init = initial(h0, "h_0");
  const Tensor c_init = lstm ? initial(c0, "c_0") : Tensor();

  Tensor mask;  // (T, N, 1) bool, only when some sequence is shorter than T
  if (lengths && lengths->defined()) {
    std::vector<int64_t> len = host_lengths(who, *lengths, N, T);
    for (int64_t l : len)
      if (l < T) mask = length_mask(len, T, x.device());
  }

  std::vector<Tensor> h_n, c_n;
  Tensor layer_in = x;
  for (int64_t l = 0; l < num_layers; ++l) {
    const int64_t in = layer_in.size(2);
    std::vector<Tensor> dir_out;
    for (int64_t d = 0; d < D; ++d) {
      const auto& w = all_weights[size_t(l * D + d)];
      Tensor h = h_init.select(0, l * D + d), c = lstm ? c_init.select(0, l * D + d) : Tensor();
      if (lstm && !mask.defined()) {  // Note [fused LSTM layer]
        const Tensor b = w[2].defined() ? w[2] + w[3] : Tensor();
        Tensor xw = linear(layer_in.reshape({T * N, in}), w[0], b).reshape({T, N, w[0].size(0)});
        auto [o, hl, cl] = lstm_layer_fused(xw, h, c, w[1], d == 1);
        dir_out.push_back(o);
        h_n.push_back(hl);
        c_n.push_back(cl);
        continue;
      }
      // Note [recurrent time loop]: every step's input projection in one GEMM.
      Tensor xw = linear(layer_in.reshape({T * N, in}), w[0], w[2]).reshape({T, N, w[0].size(0)});
      if (mode_ == RNNMode::GRU && !mask.defined()) {
        auto [o, hl] = gru_layer_fused(xw, h, w[1], w[3], d == 1);
        dir_out.push_back(o);
        h_n.push_back(hl);
        continue;
      }
      std::vector<Tensor> outs(static_cast<size_t>(T));
      for (int64_t s = 0; s < T; ++s) {
        const int64_t t = d == 0 ? s : T - 1 - s;
        auto [h2, c2] = cell_step(mode_, xw.select(0, t), h, c, w[1], w[3]);
        if (mask.defined()) {
          const Tensor m = mask.select(0, t);  // (N, 1)
          outs[size_t(t)] = where(m, h2, 0.0);
          h = where(m, h2, h);
          if (lstm) c = where(m, c2, c);
        } else {
          outs[size_t(t)] = h2;
          h = h2;
          c = c2;
        }
      }
      dir_out.push_back(stack(outs, 0));  // (T, N, H)
      h_n.push_back(h);
      if (lstm) c_n.push_back(c);
    }
    layer_in = D == 1 ? dir_out[0] : cat(dir_out, 2);
    if (training && dropout > 0 && l + 1 < num_layers)
      layer_in = accel::dropout(layer_in, dropout, true, gen_);
  }
  Result r;
  r.output = batched ? (batch_first ? layer_in.transpose(0, 1) : layer_in) : layer_in.squeeze(1);
  r.h_n = stack(h_n, 0);
  if (lstm) r.c_n = stack(c_n, 0);
  if (!batched) {
    r.h_n = r.h_n.squeeze(1);
    if (lstm) r.c_n = r.c_n.squeeze(1);
  }
  return r;
}

// ---------------- CellWeights ----------------

CellWeights::CellWeights(Module& self, RNNMode mode, int64_t input_size_, int64_t hidden_size_,
                         bool bias_, Generator* gen)
    : input_size(input_size_),
      hidden_size(hidden_size_),
      bias(bias_),
      mode_(mode),
      name_(cell_name(mode)) {
  check_sizes(name_, input_size, hidden_size);
  const int64_t G = gate_count(mode) * hidden_size;
  weight_ih = self.register_parameter("weight_ih", empty({G, input_size}));
  weight_hh = self.register_parameter("weight_hh", empty({G, hidden_size}));
  if (bias) {
    bias_ih = self.register_parameter("bias_ih", empty({G}));
    bias_hh = self.register_parameter("bias_hh", empty({G}));
  }
  reset_weights(gen);
}

void CellWeights::reset_weights(Generator* gen) {
  const double bound = 1.0 / std::sqrt(double(hidden_size));
  for (Tensor* t : {&weight_ih, &weight_hh, &bias_ih, &bias_hh})
    if (t->defined()) init::uniform_(*t, -bound, bound, gen);
}

std::string CellWeights::cell_repr() const {
  return std::to_string(input_size) + ", " + std::to_string(hidden_size) +
         (bias ? "" : ", bias=false");
}

std::tuple<Tensor, Tensor> CellWeights::step(const Tensor& input, const std::optional<Tensor>& h,
                                             const std::optional<Tensor>& c) const {
  const char* who = name_;
  const bool lstm = mode_ == RNNMode::LSTM;
  ACCEL_CHECK(input.defined(), ValueError, who, "input is undefined");
  ACCEL_CHECK((input.dim() == 2 || input.dim() == 1) && input.size(-1) == input_size, ShapeError,
              who, "expected input (batch, ", input_size, ") or unbatched (", input_size, "), got ",
              input.sizes());
  ACCEL_CHECK(input.is_floating_point(), DTypeError, who, "input must be floating, got ",
              input.dtype());
  const bool batched = input.dim() == 2;
  const Tensor x = batched ? input : input.unsqueeze(0);
  const int64_t N = x.size(0);
  const Shape state_shape = batched ? Shape{N, hidden_size} : Shape{hidden_size};
  auto state = [&](const std::optional<Tensor>& s, const char* what) {
    if (!s || !s->defined()) return zeros({N, hidden_size}, {x.dtype(), x.device()});
    ACCEL_CHECK(s->sizes() == state_shape, ShapeError, who, "expected ", what, " ", state_shape,
                " for input ", input.sizes(), ", got ", s->sizes());
    ACCEL_CHECK(s->dtype() == x.dtype() && s->device() == x.device(), DTypeError, who, what,
                " must match the input's dtype and device (", x.dtype(), ", ", x.device(),
                "), got ", s->dtype(), ", ", s->device());
    return batched ? *s : s->unsqueeze(0);
  };
  const Tensor h0 = state(h, "hx"), c0 = lstm ? state(c, "cx") : Tensor();
  auto [h2, c2] = cell_step(mode_, linear(x, weight_ih, bias_ih), h0, c0, weight_hh, bias_hh);
  if (!batched) {
    h2 = h2.squeeze(0);
    if (lstm) c2 = c2.squeeze(0);
  }
  return {h2, c2};
}

}  // namespace detail

// ---------------- RNN / LSTM / GRU ----------------

namespace {
using utils::rnn::PackedSequence;

// Packed input in the module's layout (packed data is time-major).
Tensor packed_input(const PackedSequence& p, bool batch_first) {
  return batch_first ? p.padded.transpose(0, 1) : p.padded;
}
PackedSequence packed_output(const Tensor& out, const PackedSequence& p, bool batch_first) {
  return {batch_first ? out.transpose(0, 1) : out, p.lengths};
}
}  // namespace

RNN::RNN(int64_t input_size_, int64_t hidden_size_, int64_t num_layers_,
         const std::string& nonlinearity_, bool bias_, bool batch_first_, double dropout_,
         bool bidirectional_, Generator* gen)
    : RNNLayers(*this, parse_nonlinearity("RNN", nonlinearity_), input_size_, hidden_size_,
                num_layers_, bias_, batch_first_, dropout_, bidirectional_, gen),
      nonlinearity(nonlinearity_) {}

std::tuple<Tensor, Tensor> RNN::forward(const Tensor& input, std::optional<Tensor> h0,
                                        std::optional<Tensor> lengths) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  Result r = run(input, h0, std::nullopt, lengths, is_training());
  return {r.output, r.h_n};
}

std::tuple<PackedSequence, Tensor> RNN::operator()(PackedSequence input) {
  auto [out, h] = (*this)(packed_input(input, batch_first), std::nullopt, input.lengths);
  return {packed_output(out, input, batch_first), h};
}
std::tuple<PackedSequence, Tensor> RNN::operator()(PackedSequence input, Tensor h0) {
  auto [out, h] = (*this)(packed_input(input, batch_first), h0, input.lengths);
  return {packed_output(out, input, batch_first), h};
}

std::string RNN::extra_repr() const {
  std::string s = layers_repr();
  if (nonlinearity != "tanh") s += ", nonlinearity=" + nonlinearity;
  return s;
}

LSTM::LSTM(int64_t input_size_, int64_t hidden_size_, int64_t num_layers_, bool bias_,
           bool batch_first_, double dropout_, bool bidirectional_, Generator* gen)
    : RNNLayers(*this, RNNMode::LSTM, input_size_, hidden_size_, num_layers_, bias_, batch_first_,
                dropout_, bidirectional_, gen) {}

std::tuple<Tensor, LSTM::State> LSTM::forward(const Tensor& input, std::optional<Tensor> h0,
                                              std::optional<Tensor> c0,
                                              std::optional<Tensor> lengths) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  Result r = run(input, h0, c0, lengths, is_training());
  return {r.output, {r.h_n, r.c_n}};
}

std::tuple<Tensor, LSTM::State> LSTM::operator()(Tensor input, State state) {
  return (*this)(input, std::get<0>(state), std::get<1>(state));
}
std::tuple<Tensor, LSTM::State> LSTM::operator()(Tensor input, std::optional<State> state) {
  if (!state) return (*this)(input, std::nullopt, std::nullopt);
  return (*this)(input, std::get<0>(*state), std::get<1>(*state));
}
std::tuple<PackedSequence, LSTM::State> LSTM::operator()(PackedSequence input) {
  auto [out, hc] =
      (*this)(packed_input(input, batch_first), std::nullopt, std::nullopt, input.lengths);
  return {packed_output(out, input, batch_first), hc};
}
std::tuple<PackedSequence, LSTM::State> LSTM::operator()(PackedSequence input, State state) {
  auto [out, hc] = (*this)(packed_input(input, batch_first), std::get<0>(state), std::get<1>(state),
                           input.lengths);
  return {packed_output(out, input, batch_first), hc};
}

GRU::GRU(int64_t input_size_, int64_t hidden_size_, int64_t num_layers_, bool bias_,
         bool batch_first_, double dropout_, bool bidirectional_, Generator* gen)
    : RNNLayers(*this, RNNMode::GRU, input_size_, hidden_size_, num_layers_, bias_, batch_first_,
                dropout_, bidirectional_, gen) {}

std::tuple<Tensor, Tensor> GRU::forward(const Tensor& input, std::optional<Tensor> h0,
                                        std::optional<Tensor> lengths) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  Result r = run(input, h0, std::nullopt, lengths, is_training());
  return {r.output, r.h_n};
}

std::tuple<PackedSequence, Tensor> GRU::operator()(PackedSequence input) {
  auto [out, h] = (*this)(packed_input(input, batch_first), std::nullopt, input.lengths);
  return {packed_output(out, input, batch_first), h};
}
std::tuple<PackedSequence, Tensor> GRU::operator()(PackedSequence input, Tensor h0) {
  auto [out, h] = (*this)(packed_input(input, batch_first), h0, input.lengths);
  return {packed_output(out, input, batch_first), h};
}

// ---------------- cells ----------------

RNNCell::RNNCell(int64_t input_size_, int64_t hidden_size_, bool bias_,
                 const std::string& nonlinearity_, Generator* gen)
    : CellWeights(*this, parse_nonlinearity("RNNCell", nonlinearity_), input_size_, hidden_size_,
                  bias_, gen),
      nonlinearity(nonlinearity_) {}

Tensor RNNCell::forward(const Tensor& input, std::optional<Tensor> hx) {
  return std::get<0>(step(input, hx, std::nullopt));
}

std::string RNNCell::extra_repr() const {
  return cell_repr() + (nonlinearity != "tanh" ? ", nonlinearity=" + nonlinearity : "");
}

LSTMCell::LSTMCell(int64_t input_size_, int64_t hidden_size_, bool bias_, Generator* gen)
    : CellWeights(*this, RNNMode::LSTM, input_size_, hidden_size_, bias_, gen) {}

LSTMCell::State LSTMCell::forward(const Tensor& input, std::optional<Tensor> hx,
                                  std::optional<Tensor> cx) {
  ACCEL_CHECK(hx.has_value() == cx.has_value(), ValueError, "LSTMCell",
              "hx and cx are given together or not at all (got only ", hx ? "hx" : "cx", ")");
  return step(input, hx, cx);
}

LSTMCell::State LSTMCell::operator()(Tensor input, State state) {
  return (*this)(input, std::get<0>(state), std::get<1>(state));
}

GRUCell::GRUCell(int64_t input_size_, int64_t hidden_size_, bool bias_, Generator* gen)
    : CellWeights(*this, RNNMode::GRU, input_size_, hidden_size_, bias_, gen) {}

Tensor GRUCell::forward(const Tensor& input, std::optional<Tensor> hx) {
  return std::get<0>(step(input, hx, std::nullopt));
}

// ---------------- utils::rnn ----------------

namespace utils::rnn {

Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first, double padding_value) {
  const char* who = "pad_sequence";
  ACCEL_CHECK(!sequences.empty(), ValueError, who, "received an empty list of sequences");
  const Tensor& first = sequences[0];
  ACCEL_CHECK(first.defined() && first.dim() >= 1, ShapeError, who,
              "sequences must be (L, *) tensors; sequence 0 is ",
              first.defined() ? shape_str(first.sizes()) : std::string("undefined"));
  int64_t max_len = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Tensor& s = sequences[i];
    ACCEL_CHECK(s.defined() && s.dim() == first.dim() &&
                    std::equal(s.sizes().begin() + 1, s.sizes().end(), first.sizes().begin() + 1),
                ShapeError, who, "sequence ", i, " is ",
                s.defined() ? shape_str(s.sizes()) : std::string("undefined"),
                "; every sequence must be (L, ", "*) with sequence 0's trailing dims ",
                first.sizes());
    ACCEL_CHECK(s.dtype() == first.dtype() && s.device() == first.device(), DTypeError, who,
                "sequence ", i, " is ", s.dtype(), " on ", s.device(), ", sequence 0 ",
                first.dtype(), " on ", first.device());
    max_len = std::max(max_len, s.size(0));
  }
  std::vector<Tensor> cols;
  for (const Tensor& s : sequences) {
    if (s.size(0) == max_len) {
      cols.push_back(s);
    } else {
      Shape pad_shape = s.sizes();
      pad_shape[0] = max_len - s.size(0);
      cols.push_back(cat({s, full(pad_shape, padding_value, {s.dtype(), s.device()})}, 0));
    }
  }
  return stack(cols, batch_first ? 0 : 1);
}

PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first,
                                    bool enforce_sorted) {
  const char* who = "pack_padded_sequence";
  ACCEL_CHECK(input.defined() && input.dim() >= 2, ShapeError, who, "expected input ",
              batch_first ? "(batch, seq_len, *)" : "(seq_len, batch, *)", ", got ",
              input.defined() ? shape_str(input.sizes()) : std::string("undefined"));
  Tensor x = batch_first ? input.transpose(0, 1) : input;  // (T, N, *)
  std::vector<int64_t> len = host_lengths(who, lengths, x.size(1), x.size(0));
  int64_t max_len = 0;
  for (size_t b = 0; b < len.size(); ++b) {
    ACCEL_CHECK(!enforce_sorted || b == 0 || len[b] <= len[b - 1], ValueError, who,
                "lengths must be sorted in decreasing order with enforce_sorted=true (lengths[",
                b - 1, "] = ", len[b - 1], " < lengths[", b, "] = ", len[b],
                "); pass enforce_sorted=false for unsorted lengths");
    max_len = std::max(max_len, len[b]);
  }
  return {x.narrow(0, 0, max_len), tensor(len, {int64_t(len.size())})};
}

PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                    bool batch_first, bool enforce_sorted) {
  return pack_padded_sequence(input, tensor(lengths, {int64_t(lengths.size())}), batch_first,
                              enforce_sorted);
}

PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted) {
  std::vector<int64_t> len;
  for (const Tensor& s : sequences) len.push_back(s.defined() && s.dim() >= 1 ? s.size(0) : 0);
  return pack_padded_sequence(pad_sequence(sequences), len, false, enforce_sorted);
}

std::tuple<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence, bool batch_first,
                                               double padding_value,
                                               std::optional<int64_t> total_length) {
  const char* who = "pad_packed_sequence";
  const Tensor& p = sequence.padded;
  ACCEL_CHECK(p.defined() && p.dim() >= 2, ShapeError, who,
              "expected packed data (seq_len, batch, *), got ",
              p.defined() ? shape_str(p.sizes()) : std::string("undefined"));
  std::vector<int64_t> len = host_lengths(who, sequence.lengths, p.size(1), p.size(0));
  const int64_t T = p.size(0);
  Tensor out = p;
  bool short_seq = false;
  for (int64_t l : len) short_seq = short_seq || l < T;
  if (short_seq) {
    Tensor m = length_mask(len, T, p.device());  // (T, N, 1)
    Shape ms = m.sizes();
    ms.resize(size_t(p.dim()), 1);
    out = where(m.reshape(ms), p, padding_value);
  }
  if (total_length) {
    ACCEL_CHECK(*total_length >= T, ValueError, who, "total_length = ", *total_length,
                " is shorter than the longest sequence (", T, ")");
    if (*total_length > T) {
      Shape pad_shape = p.sizes();
      pad_shape[0] = *total_length - T;
      out = cat({out, full(pad_shape, padding_value, {p.dtype(), p.device()})}, 0);
    }
  }
  if (batch_first) out = out.transpose(0, 1);
  return {out, sequence.lengths};
}

}  // namespace utils::rnn

}  // namespace accel::nn
