// Op cases: the losses of autograd/ops/losses.cc (binary_cross_entropy, l1/smooth_l1/huber,
// kl_div, cosine_similarity, cosine_embedding_loss). Composed from other ops: no kernel of their
// own, so every dtype and device the parts support. Values are kept away from each loss's kinks
// (|d| = beta or delta, d = 0, cos = margin) so that finite differences are smooth.
#include "op_table.h"

namespace accel::optable::detail {

void add_losses_cases(Table& t) {
  // ---- binary_cross_entropy: probabilities in (0, 1), target with grad ----
  t.add("binary_cross_entropy", "mean, target with grad",
        OP_INPUTS(m.rnd({3, 4}, 0.05, 0.95), m.rnd({3, 4}, 0.0, 1.0)),
        OP_FN(return binary_cross_entropy(x[0], x[1]);));
  t.add("binary_cross_entropy", "none, weight broadcast over rows (with grad)",
        OP_INPUTS(m.rnd({2, 3}, 0.1, 0.9), m.rnd_const({2, 3}, 0.0, 1.0), m.rnd_pos({3})),
        OP_FN(return binary_cross_entropy(x[0], x[1], x[2], Reduction::None);));
  t.add("binary_cross_entropy", "sum, (2, 2, 3) hard 0/1 targets",
        OP_INPUTS(m.rnd({2, 2, 3}, 0.1, 0.9),
                  m.values({1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0}, {2, 2, 3})),
        OP_FN(return binary_cross_entropy(x[0], x[1], Tensor(), Reduction::Sum);));

  // ---- l1_loss, smooth_l1_loss, huber_loss ----
  t.add("l1_loss", "mean, both with grad", OP_INPUTS(m.rnd({3, 4}), m.rnd({3, 4})),
        OP_FN(return l1_loss(x[0], x[1]);));
  t.add("l1_loss", "none, non-contiguous input", OP_INPUTS(m.rnd({4, 3}), m.rnd({3, 4})),
        OP_FN(return l1_loss(x[0].t(), x[1], Reduction::None);));
  // d = x0 - x1 in (-2, 2) with beta 0.5: both branches taken.
  t.add("smooth_l1_loss", "mean, beta 0.5", OP_INPUTS(m.rnd({4, 5}), m.rnd({4, 5})),
        OP_FN(return smooth_l1_loss(x[0], x[1], Reduction::Mean, 0.5);));
  t.add("smooth_l1_loss", "none, beta 1 (default)", OP_INPUTS(m.rnd({6}, -2, 2), m.rnd({6})),
        OP_FN(return smooth_l1_loss(x[0], x[1], Reduction::None);));
  t.add("smooth_l1_loss", "sum, beta 0 is l1", OP_INPUTS(m.rnd({5}), m.rnd({5})),
        OP_FN(return smooth_l1_loss(x[0], x[1], Reduction::Sum, 0.0);));
  t.add("huber_loss", "mean, delta 1 (default)", OP_INPUTS(m.rnd({4, 5}, -2, 2), m.rnd({4, 5})),
        OP_FN(return huber_loss(x[0], x[1]);));
  t.add("huber_loss", "none, delta 0.3", OP_INPUTS(m.rnd({3, 4}), m.rnd({3, 4})),
        OP_FN(return huber_loss(x[0], x[1], Reduction::None, 0.3);));

  // ---- kl_div: input log-probabilities ----
  t.add("kl_div", "batchmean, target with grad",
        OP_INPUTS(m.rnd({3, 4}, -3.0, -0.2), m.rnd({3, 4}, 0.05, 1.0)),
        OP_FN(return kl_div(x[0], x[1], Reduction::BatchMean);));
  t.add("kl_div", "none, log_target",
        OP_INPUTS(m.rnd({2, 5}, -3.0, -0.2), m.rnd({2, 5}, -3.0, 0.0)),
        OP_FN(return kl_div(x[0], x[1], Reduction::None, true);));
  t.add("kl_div", "mean, zeros in the target (0 log 0 = 0)",
        OP_INPUTS(m.rnd({2, 3}, -3.0, -0.2), m.values({0.5, 0, 0.25, 0, 0.75, 0.125}, {2, 3})),
        OP_FN(return kl_div(x[0], x[1]);));
  t.add("kl_div", "sum, log_target", OP_INPUTS(m.rnd({4}, -2.0, 0.0), m.rnd({4}, -2.0, 0.0)),
        OP_FN(return kl_div(x[0], x[1], Reduction::Sum, true);));

  // ---- cosine_similarity, cosine_embedding_loss ----
  t.add("cosine_similarity", "(4, 5) dim 1", OP_INPUTS(m.rnd({4, 5}), m.rnd({4, 5})),
        OP_FN(return cosine_similarity(x[0], x[1]);));
  t.add("cosine_similarity", "broadcast (3, 1, 4) with (2, 4), dim -1, eps 1e-6",
        OP_INPUTS(m.rnd({3, 1, 4}), m.rnd({2, 4})),
        OP_FN(return cosine_similarity(x[0], x[1], -1, 1e-6);));
  t.add("cosine_similarity", "size-1 dim broadcast along the reduced dim",
        OP_INPUTS(m.rnd({2, 1}), m.rnd({2, 3})), OP_FN(return cosine_similarity(x[0], x[1], 1);));
  t.add("cosine_embedding_loss", "mean, targets 1 and -1, margin 0.1",
        OP_INPUTS(m.rnd({4, 6}), m.rnd({4, 6}), m.values({1, -1, -1, 1}, {4})),
        OP_FN(return cosine_embedding_loss(x[0], x[1], x[2], 0.1);));
  t.add("cosine_embedding_loss", "none, int64 targets",
        OP_INPUTS(m.rnd({3, 5}), m.rnd({3, 5}), m.idx({-1, 1, -1}, {3})),
        OP_FN(return cosine_embedding_loss(x[0], x[1], x[2], -0.5, Reduction::None);));
  t.add("cosine_embedding_loss", "unbatched (D) with target (), sum",
        OP_INPUTS(m.rnd({5}), m.rnd({5}), m.values({-1}, {})),
        OP_FN(return cosine_embedding_loss(x[0], x[1], x[2], -0.9, Reduction::Sum);));
}

}  // namespace accel::optable::detail
