// word_language_model: pytorch/examples word_language_model/main.py on the fortunes corpus, word
// level: a 2-layer LSTM language model (--tied: embedding and decoder shared) or, with --model
// Transformer, a causal TransformerEncoder with positional encoding; truncated BPTT (bptt 35),
// gradient clipping 0.25, plain SGD from lr 20 divided by 4 whenever the validation loss does
// not improve; perplexity on validation after every epoch and on test at the end.
// The model and the step: examples/word_language_model.h.
//
//   build/examples/word_language_model [--model LSTM|Transformer] [--nhead 2] [--epochs 40]
//       [--emsize 200 --nhid 200 --nlayers 2]
//       [--lr 20] [--clip 0.25] [--batch_size 20] [--bptt 35] [--dropout 0.2] [--tied]
//       [--max-batches N] [--save model.safetensors]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>

#include "examples/common.h"
#include "examples/word_language_model.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  std::string data_dir = data::kFortunesDir, save, model_type = "LSTM";
  int64_t nhead = 2;
  int64_t emsize = 200, nhid = 200, nlayers = 2, batch_size = 20, bptt = 35, log_interval = 200;
  int64_t max_batches = 0;
  int epochs = 40, threads = 0;
  double lr = 20, clip = 0.25, dropout = 0.2;
  bool tied = false, dry_run = false;
  uint64_t seed = 1111;
  CLI::App app(
      "PyTorch's word-level language model example (LSTM or Transformer) on the fortunes corpus",
      "word_language_model");
  const auto positive = CLI::PositiveNumber;
  app.add_option("--model", model_type, "type of network (LSTM, Transformer)")
      ->capture_default_str()
      ->check(CLI::IsMember({"LSTM", "Transformer"}));
  app.add_option("--nhead", nhead, "the number of heads in the encoder of the transformer model")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--data", data_dir, "location of the fortunes files")->capture_default_str();
  app.add_option("--emsize", emsize, "size of word embeddings")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--nhid", nhid, "number of hidden units per layer")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--nlayers", nlayers, "number of layers")->capture_default_str()->check(positive);
  app.add_option("--lr", lr, "initial learning rate")->capture_default_str()->check(positive);
  app.add_option("--clip", clip, "gradient clipping")->capture_default_str()->check(positive);
  app.add_option("--epochs", epochs, "upper epoch limit")->capture_default_str()->check(positive);
  app.add_option("--batch_size", batch_size, "batch size")->capture_default_str()->check(positive);
  app.add_option("--bptt", bptt, "sequence length")->capture_default_str()->check(positive);
  app.add_option("--dropout", dropout, "dropout applied to layers (0 = no dropout)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--tied", tied, "tie the word embedding and softmax weights");
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--log-interval", log_interval, "report interval")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--save", save, "path to save the final model (safetensors)");
  app.add_flag("--dry-run", dry_run, "verify the code and the model");
  app.add_option("--max-batches", max_batches, "training batches per epoch (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "OpenMP threads (0: default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  return run_example(app, argc, argv, [&] {
    if (threads > 0) omp_set_num_threads(threads);
    // Set the random seed manually for reproducibility.
    manual_seed(seed);

    // Load data
    word_lm::Corpus corpus = word_lm::fortunes_corpus(data_dir);
    const int64_t eval_batch_size = 10;
    const Tensor train_data = word_lm::batchify(corpus.train, batch_size);
    const Tensor val_data = word_lm::batchify(corpus.valid, eval_batch_size);
    const Tensor test_data = word_lm::batchify(corpus.test, eval_batch_size);
    const int64_t ntokens = corpus.dictionary.size();
    std::printf("| corpus: %lld words of vocabulary, %lld / %lld / %lld tokens\n",
                static_cast<long long>(ntokens), static_cast<long long>(corpus.train.numel()),
                static_cast<long long>(corpus.valid.numel()),
                static_cast<long long>(corpus.test.numel()));

    // Build the model and run main.py's loop on it (the Transformer keeps no hidden state).
    auto train_and_test = [&](auto& model) {
      constexpr bool is_rnn = std::is_same_v<std::decay_t<decltype(model)>, word_lm::RNNModel>;
      word_lm::Annealer schedule{lr};
      const std::string rule(89, '-');
      double step_secs = 0;
      int64_t steps = 0;
      for (int epoch = 1; epoch <= epochs; ++epoch) {
        const auto epoch_start_time = std::chrono::steady_clock::now();
        // train()
        model.train();
        double total_loss = 0;
        auto start_time = std::chrono::steady_clock::now();
        std::optional<word_lm::Hidden> hidden;
        if constexpr (is_rnn) hidden = model.init_hidden(batch_size);
        int64_t batch = 0;
        for (int64_t i = 0; i < train_data.size(0) - 1; i += bptt, ++batch) {
          if (max_batches > 0 && batch >= max_batches) break;
          auto [data, targets] = word_lm::get_batch(train_data, i, bptt);
          const auto t0 = std::chrono::steady_clock::now();
          if constexpr (is_rnn)
            total_loss += word_lm::train_step(model, data, targets, *hidden, lr, clip);
          else
            total_loss += word_lm::train_step(model, data, targets, lr, clip);
          step_secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          ++steps;
          if (batch % log_interval == 0 && batch > 0) {
            const double cur_loss = total_loss / double(log_interval);
            const double elapsed =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time)
                    .count();
            std::printf(
                "| epoch %3d | %5lld/%5lld batches | lr %02.2f | ms/batch %5.2f | loss %5.2f | ppl "
                "%8.2f\n",
                epoch, static_cast<long long>(batch),
                static_cast<long long>(train_data.size(0) / bptt), lr,
                elapsed * 1000 / double(log_interval), cur_loss, std::exp(cur_loss));
            std::fflush(stdout);
            total_loss = 0;
            start_time = std::chrono::steady_clock::now();
          }
          if (dry_run) break;
        }
        const double val_loss = word_lm::evaluate(model, val_data, bptt);
        std::printf(
            "%s\n| end of epoch %3d | time: %5.2fs | valid loss %5.2f | valid ppl %8.2f\n%s\n",
            rule.c_str(), epoch,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_time)
                .count(),
            val_loss, std::exp(val_loss), rule.c_str());
        std::fflush(stdout);
        // Save the model if the validation loss is the best we've seen so far; anneal the
        // learning rate if not.
        if (schedule.step(val_loss) && !save.empty()) model.save(save);
        lr = schedule.lr;
        if (dry_run) break;
      }

      // Load the best saved model and run on test data.
      if (!save.empty()) model.load(save);
      const double test_loss = word_lm::evaluate(model, test_data, bptt);
      const std::string rule2(89, '=');
      std::printf("%s\n| End of training | test loss %5.2f | test ppl %8.2f | %.1f ms/step\n%s\n",
                  rule2.c_str(), test_loss, std::exp(test_loss),
                  1000 * step_secs / double(std::max<int64_t>(steps, 1)), rule2.c_str());
    };
    if (model_type == "Transformer") {
      word_lm::TransformerModel model(ntokens, emsize, nhead, nhid, nlayers, dropout);
      train_and_test(model);
    } else {
      word_lm::RNNModel model(ntokens, emsize, nhid, nlayers, dropout, tied);
      train_and_test(model);
    }
    return 0;
  });
}
