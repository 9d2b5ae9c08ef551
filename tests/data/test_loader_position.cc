// The loader's global position (Note [global loader position] in data/sampler.cc): the epoch
// order does not depend on ranks or workers; a position saved at one world size, batch size and
// split_batches setting resumes at any other, exactly when the new global batch divides it; the
// refusals name the field; states of the earlier per-rank format still load.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/warning.h"
#include "helpers.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::testing;

namespace {

constexpr int64_t kN = 45;  // not a multiple of any global batch below: a padded partial step
constexpr uint64_t kSeed = 7;

std::shared_ptr<TensorDataset> rows(int64_t n) {
  std::vector<int64_t> l;
  for (int64_t i = 0; i < n; ++i) l.push_back(i);
  return std::make_shared<TensorDataset>(std::vector<Tensor>{tensor(l, {n})});
}

// One data-parallel layout: W ranks, batch_size as DataLoaderOptions takes it.
struct Layout {
  int64_t world, batch;
  bool split;
  int workers = 0;
  int64_t global() const { return split ? batch : batch * world; }
};

std::string name(const Layout& l) {
  return "W " + std::to_string(l.world) + " batch " + std::to_string(l.batch) +
         (l.split ? " split" : "") + (l.workers ? " workers" : "");
}

using Ranks = std::vector<std::unique_ptr<DataLoader>>;

Ranks make(const Layout& l, int64_t n = kN) {
  Ranks r;
  for (int64_t rank = 0; rank < l.world; ++rank) {
    DataLoaderOptions o;
    o.batch_size = l.batch;
    o.shuffle = true;
    o.seed = kSeed;
    o.rank = rank;
    o.world_size = l.world;
    o.split_batches = l.split;
    o.num_workers = l.workers;
    r.push_back(std::make_unique<DataLoader>(rows(n), o));
  }
  return r;
}

// Runs every rank in step from its position to the end of epoch `last` (or until `stop` global
// steps are done: the loaders then stand inside that step, as a checkpoint in the loop body
// sees them). Returns the samples without padding, step by step and rank by rank.
std::vector<int64_t> run(Ranks& ranks, int64_t last, int64_t stop = -1) {
  std::vector<int64_t> out;
  int64_t steps = 0;
  for (int64_t e = ranks[0]->epoch(); e <= last; ++e) {
    std::vector<DataLoader::Iterator> its;
    for (auto& l : ranks) {
      l->set_epoch(e);
      its.push_back(l->begin());
    }
    while (its[0] != DataLoader::Sentinel{}) {
      for (auto& it : its) {
        REQUIRE(it != DataLoader::Sentinel{});
        out.insert(out.end(), it->indices.begin(), it->indices.end() - it->num_padding);
      }
      if (++steps == stop) return out;
      for (auto& it : its) ++it;
    }
    for (auto& it : its) CHECK(it == DataLoader::Sentinel{});
  }
  return out;
}

std::vector<int64_t> order(int64_t epoch, int64_t n = kN) {
  return RandomSampler(n, kSeed).epoch_indices(epoch);
}

}  // namespace

TEST_CASE("an epoch's order is the sampler's, whatever the world size, batching and workers") {
  // What Note [global loader position] rests on: on every layout the ranks' non-padding samples,
  // step by step and rank by rank, are the sampler's order of that epoch, nothing else.
  const std::vector<int64_t> want = [] {
    std::vector<int64_t> v = order(0);
    const std::vector<int64_t> e1 = order(1);
    v.insert(v.end(), e1.begin(), e1.end());
    return v;
  }();
  for (const Layout& l : {Layout{1, 8, false}, Layout{2, 4, false, 2}, Layout{4, 2, false},
                          Layout{4, 8, true, 2}, Layout{3, 5, false}, Layout{2, 6, true}}) {
    CAPTURE(name(l));
    Ranks r = make(l);
    CHECK(run(r, 1) == want);
  }
}

TEST_CASE(
    "a position resumes at another world size and batch: exact iff the global batch divides") {
  // Every ordered pair of layouts (world 1 <-> 2 <-> 4, split_batches and not, global batches 8,
  // 6 and 12), saved after 1 and 3 global steps of epoch 0, at the end of epoch 0 and inside
  // epoch 1; the resumed ranks load any saved rank's state.
  const std::vector<Layout> layouts = {{1, 8, false}, {2, 4, false}, {4, 2, false},
                                       {4, 8, true},  {2, 8, true},  {2, 3, false, 2},
                                       {4, 3, false}, {1, 6, false}};
  int exact = 0, rounded = 0;
  for (const Layout& a : layouts) {
    const int64_t per_epoch = (kN + a.global() - 1) / a.global();
    for (int64_t stop : {int64_t(1), int64_t(3), per_epoch, per_epoch + 2}) {
      Ranks saved = make(a);
      run(saved, 1, stop);
      const int64_t epoch = stop < per_epoch ? 0 : 1;
      const int64_t samples = stop < per_epoch    ? stop * a.global()
                              : stop == per_epoch ? kN
                                                  : 2 * a.global();
      std::vector<StateDict> states;
      for (auto& l : saved) {
        const LoaderPosition p = l->position();
        CHECK(p.epoch == (stop <= per_epoch ? 0 : 1));
        CHECK(p.samples == samples);
        states.push_back(l->state_dict());
      }
      for (const StateDict& s : states) CHECK(s == states[0]);  // one position for all ranks
      for (const Layout& b : layouts) {
        CAPTURE(name(a));
        CAPTURE(stop);
        CAPTURE(name(b));
        Ranks resumed = make(b);
        const int64_t g = b.global();
        int64_t repeated = -1;
        for (size_t r = 0; r < resumed.size(); ++r) {
          const int64_t got = resumed[r]->resume(position_from_state(states[r % states.size()]));
          CHECK((repeated < 0 || got == repeated));
          repeated = got;
        }
        // Where it resumes: the saved sample rounded down to a whole global batch of b.
        const bool at_end = stop == per_epoch;
        const int64_t from = at_end ? kN : samples / g * g;
        CHECK(repeated == (at_end ? 0 : samples % g));
        std::vector<int64_t> want;
        const std::vector<int64_t> first = order(epoch);
        if (at_end) {
          CHECK(resumed[0]->epoch() == 0);
          CHECK(resumed[0]->batches_consumed() == resumed[0]->size());
        } else {
          want.assign(first.begin() + from, first.end());
        }
        const std::vector<int64_t> next = order(at_end ? 1 : epoch + 1);
        want.insert(want.end(), next.begin(), next.end());
        CHECK(run(resumed, at_end ? 1 : epoch + 1) == want);
        ++(repeated == 0 ? exact : rounded);
      }
    }
  }
  CHECK(exact > 0);
  CHECK(rounded > 0);
}

TEST_CASE("load_state_dict accepts another world size and says once when samples repeat") {
  std::vector<std::string> said;
  const WarningHandler previous =
      set_warning_handler([&](const std::string& line) { said.push_back(line); });
  reset_warnings_shown();
  Ranks two = make({2, 4, false});
  run(two, 0, 2);  // 16 samples
  const StateDict s = two[1]->state_dict();
  CHECK(s.at("samples") == "16");
  CHECK(s.at("version") == "2");
  // One process with batch 16 (exact) and with batch 12 (4 samples twice), each rank of three.
  Ranks one = make({1, 16, false});
  one[0]->load_state_dict(s);
  CHECK(one[0]->batches_consumed() == 1);
  CHECK(said.empty());
  Ranks three = make({3, 4, false});
  for (auto& l : three) l->load_state_dict(s);
  CHECK(three[2]->batches_consumed() == 1);
  REQUIRE(said.size() == 1);  // rank 0 only, once
  CHECK(said[0].find("resumes at 12, so 4 samples are read twice") != std::string::npos);
  set_warning_handler(previous);
}

TEST_CASE("resume refuses by name what changes the order; nothing changes when it does") {
  Ranks base = make({1, 4, false});
  run(base, 0, 2);
  const LoaderPosition p = base[0]->position();
  auto refused = [&](DataLoader& l, const LoaderPosition& q, const std::string& field) {
    CAPTURE(field);
    const int64_t epoch = l.epoch(), consumed = l.batches_consumed();
    const StateDict before = l.state_dict();
    std::string msg;
    try {
      l.resume(q);
    } catch (const ValueError& e) {
      msg = e.what();
    }
    CHECK_MESSAGE(msg.find(field) != std::string::npos, msg);
    CHECK(msg.find("[DataLoader.resume]") != std::string::npos);
    CHECK(l.epoch() == epoch);
    CHECK(l.batches_consumed() == consumed);
    CHECK(l.state_dict() == before);
  };
  {
    Ranks other = make({1, 4, false}, kN + 1);
    refused(*other[0], p, "sampler_size = 45, this loader has 46");
  }
  for (bool drop : {true, false}) {
    DataLoaderOptions o = base[0]->options();
    (drop ? o.drop_last : o.even_batches) = drop;  // drop_last on, or even_batches off
    DataLoader l(rows(kN), o);
    refused(l, p,
            drop ? "drop_last = 0, this loader has 1" : "even_batches = 1, this loader has 0");
  }
  {
    DataLoaderOptions o = base[0]->options();
    o.shuffle = false;  // a SequentialSampler: no state, another order
    DataLoader l(rows(kN), o);
    refused(l, p, "sampler state has keys {seed}, this loader's sampler has {}");
  }
  Ranks fresh = make({1, 4, false});
  DataLoader& l = *fresh[0];
  LoaderPosition q = p;
  q.samples = kN + 1;
  refused(l, q, "samples 46 out of range");
  q = p;
  q.epoch = -1;
  refused(l, q, "negative epoch");
  // A malformed sampler state: the sampler's own error, and still nothing changed.
  q = p;
  q.sampler["seed"] = "x";
  CHECK_THROWS_WITH_AS(l.resume(q), doctest::Contains("RandomSampler.load_state_dict"), ValueError);
  CHECK(l.batches_consumed() == 0);
  CHECK(l.position().sampler.at("seed") == std::to_string(kSeed));
  // What is no longer compared: world size, rank, per-rank batch, split_batches.
  CHECK(l.resume(p) == 0);
  CHECK(l.batches_consumed() == 2);
}

TEST_CASE("malformed states are refused by key; states of the per-rank format still load") {
  Ranks l = make({1, 4, false});
  StateDict good = l[0]->state_dict();
  auto bad = [&](const std::string& key, const char* value, const std::string& expect) {
    CAPTURE(key);
    StateDict s = good;
    if (value) {
      s[key] = value;
    } else {
      s.erase(key);
    }
    CHECK_THROWS_WITH_AS(l[0]->load_state_dict(s), doctest::Contains(expect.c_str()), ValueError);
  };
  bad("epoch", nullptr, "state has no key 'epoch'");
  bad("samples", "1.5", "key 'samples' = '1.5' is not an integer");
  bad("seed", "-3", "key 'seed' = '-3' is not an unsigned integer");
  bad("drop_last", "2", "key 'drop_last' = 2 is not 0 or 1");
  bad("version", "3", "unsupported state version 3");

  // Version 1, what DataLoader::state_dict() wrote before the position was global: rank 1 of 2,
  // 4 rows a rank, split_batches off, 3 batches consumed in epoch 1: global sample 24.
  StateDict v1 = {{"version", "1"},      {"epoch", "1"},         {"batches_consumed", "3"},
                  {"seed", "7"},         {"batch_size", "4"},    {"world_size", "2"},
                  {"rank", "1"},         {"sampler_size", "45"}, {"drop_last", "0"},
                  {"even_batches", "1"}, {"split_batches", "0"}, {"sampler.seed", "7"}};
  const LoaderPosition p = position_from_state(v1);
  CHECK(p.epoch == 1);
  CHECK(p.samples == 24);
  CHECK(p.global_batch == 8);
  Ranks four = make({4, 2, false});  // the same global batch on 4 ranks: exact
  for (auto& r : four) r->load_state_dict(v1);
  std::vector<int64_t> want = order(1);
  want.erase(want.begin(), want.begin() + 24);
  CHECK(run(four, 1) == want);
  // split_batches: batch_size was the global batch; the end of an epoch (6 of 6 batches) is N.
  v1["split_batches"] = "1";
  v1["batch_size"] = "8";
  v1["batches_consumed"] = "6";
  CHECK(position_from_state(v1).samples == kN);
  v1["drop_last"] = "1";
  v1["batches_consumed"] = "5";  // drop_last: 5 full batches are the whole epoch
  CHECK(position_from_state(v1).samples == kN);
  // Out of range (before: refused by seek; now also where the arithmetic would overflow).
  v1["batches_consumed"] = "7";
  CHECK_THROWS_WITH_AS(position_from_state(v1),
                       doctest::Contains("batches_consumed 7 out of range"), ValueError);
  v1["batches_consumed"] = "1";
  v1["batch_size"] = "9223372036854775807";
  CHECK_THROWS_WITH_AS(position_from_state(v1), doctest::Contains("out of range"), ValueError);
}
