// Deferred parameters materialised by region (parallel/materialize.h, Note [deferred regions];
// the value sinks of nn/init.h, Note [value sinks]): one process. What a rank keeps equals the
// same region of eager construction's values bit for bit, for every built-in initialiser; the
// peak is the kept region and a chunk when the initialisers stream, one module whole when they
// cannot (orthogonal_, Embedding's padding row, an initialiser on part of a tensor).
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <memory>

#include "accel.h"
#include "parallel/materialize.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::error_of;
using dist::Region;

namespace {

constexpr uint64_t kSeed = 77;

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

Allocator& cpu() { return *get_allocator(kCPU); }

// Own parameter `name` of m becomes a deferred piece holding `region` of its full value (what
// parallelize records for a tp shard).
void cut(nn::Module& m, const std::string& name, const Region& region) {
  for (auto& [n, p] : m.named_parameters(false)) {
    if (n != name) continue;
    const Shape full = p.sizes();
    nn::assign_tensor_data(p, nn::deferred_tensor(region.local_shape(), p.dtype(), p.device()));
    m.set_deferred_part(name, full, dist::RegionCut{region});
    return;
  }
  FAIL("no parameter ", name);
}

// Builds with `make` eagerly and under DeferredInit from one seed.
template <typename M>
std::pair<std::shared_ptr<M>, std::shared_ptr<M>> eager_and_deferred(
    const std::function<std::shared_ptr<M>()>& make) {
  manual_seed(kSeed);
  auto eager = make();
  manual_seed(kSeed);
  std::shared_ptr<M> lazy;
  {
    nn::DeferredInit d;
    lazy = make();
  }
  return {eager, lazy};
}

// The bytes the allocator held at most while f ran, above what it held before.
size_t peak_of(const std::function<void()>& f) {
  cpu().reset_peak_stats();
  const size_t before = cpu().stats().bytes_in_use;
  f();
  return cpu().stats().peak_bytes_in_use - before;
}

// Orthogonal weight: cannot stream.
struct Orthogonal : nn::Module {
  Tensor w = register_parameter("w", empty({64, 32}));
  Orthogonal() { reset_parameters(); }
  void reset_parameters(Generator* gen = nullptr) override { nn::init::orthogonal_(w, 1.0, gen); }
};

// Initialises the two halves of its weight separately: an initialiser on part of a tensor.
struct Halves : nn::Module {
  Tensor w = register_parameter("w", empty({8, 6}));
  Halves() { reset_parameters(); }
  void reset_parameters(Generator* gen = nullptr) override {
    nn::init::normal_(w.narrow(0, 0, 4), 0.0, 1.0, gen);
    nn::init::uniform_(w.narrow(0, 4, 4), -1.0, 1.0, gen);
  }
};

// Every elementwise initialiser, with fans from the full shape.
struct AllInits : nn::Module {
  Tensor a = register_parameter("a", empty({40, 30}));
  Tensor b = register_parameter("b", empty({40, 30}));
  Tensor c = register_parameter("c", empty({30, 40}));
  Tensor d = register_parameter("d", empty({30, 40}));
  Tensor e = register_parameter("e", empty({17}));
  Tensor f = register_parameter("f", empty({5, 7}));
  Tensor g = register_parameter("g", empty({5, 7}, kFloat64));
  AllInits() { reset_parameters(); }
  void reset_parameters(Generator* gen = nullptr) override {
    nn::init::kaiming_uniform_(a, 0.3, nn::init::FanMode::FanOut, "relu", gen);
    nn::init::kaiming_normal_(b, 0.0, nn::init::FanMode::FanIn, "leaky_relu", gen);
    nn::init::xavier_uniform_(c, 1.5, gen);
    nn::init::xavier_normal_(d, 0.5, gen);
    nn::init::constant_(e, 0.25);
    nn::init::trunc_normal_(f, 0.1, 0.7, -0.5, 1.0, gen);
    nn::init::normal_(g, 2.0, 3.0, gen);
  }
};

}  // namespace

TEST_CASE("materialize_local: every built-in initialiser, whole or cut, equals eager") {
  auto make = [] {
    auto s = std::make_shared<nn::Sequential>();
    s->push_back(std::make_shared<nn::Linear>(20, 33));
    s->push_back(std::make_shared<nn::LayerNorm>(33));
    s->push_back(std::make_shared<nn::Embedding>(11, 9));
    s->push_back(std::make_shared<nn::Conv2d>(3, 6, 3));
    s->push_back(std::make_shared<nn::Linear>(12, 36));  // a packed [q | k | v] of 3 heads
    s->push_back(std::make_shared<nn::LSTM>(5, 7));
    s->push_back(std::make_shared<AllInits>());
    return s;
  };
  auto [eager, lazy] = eager_and_deferred<nn::Sequential>(make);
  // Cut some parameters as tensor parallelism would: rows of the Linear (piece 1 of 2), columns
  // of AllInits.a (piece 2 of 3, uneven: 30 = 10 + 10 + 10; c: 40 over 3 = 14 + 14 + 12), the
  // packed qkv weight by heads (3 blocks, unit 4).
  auto& mods = *lazy;
  cut(*mods[0], "weight", Region::whole({33, 20}).shard(0, 1, 2, 1));
  cut(*mods[0], "bias", Region::whole({33}).shard(0, 1, 2, 1));
  cut(*mods[6], "a", Region::whole({40, 30}).shard(1, 1, 3, 2));
  cut(*mods[6], "c", Region::whole({30, 40}).shard(1, 1, 3, 2));
  cut(*mods[4], "weight", Region::whole({36, 12}).shard(0, 3, 2, 0, 4));
  dist::materialize_local(*lazy);
  CHECK_FALSE(nn::is_deferred(*lazy));
  const auto pe = eager->named_parameters(), pl = lazy->named_parameters();
  REQUIRE(pe.size() == pl.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    CAPTURE(pe[i].first);
    const Tensor& want = pe[i].second;
    const Tensor& got = pl[i].second;
    if (pe[i].first == "0.weight" || pe[i].first == "0.bias") {
      CHECK(same_bits(got, want.narrow(0, 17, 16)));  // rows 17..32 (chunk 17)
    } else if (pe[i].first == "6.a") {
      CHECK(same_bits(got, want.narrow(1, 20, 10)));
    } else if (pe[i].first == "6.c") {
      CHECK(same_bits(got, want.narrow(1, 28, 12)));
    } else if (pe[i].first == "4.weight") {  // heads 0..1 of q, k and v (8 of 12 rows)
      CHECK(same_bits(
          got, cat({want.narrow(0, 0, 8), want.narrow(0, 12, 8), want.narrow(0, 24, 8)}, 0)));
    } else {
      CHECK(same_bits(got, want));
    }
  }
}

TEST_CASE("streamed materialisation holds the region and a chunk; the fallback one module") {
  // A (1024, 1024) float64 weight (8 MiB) cut in 4 row pieces: the piece (2 MiB) and a chunk.
  {
    auto [eager, lazy] = eager_and_deferred<nn::Linear>([] {
      auto l = std::make_shared<nn::Linear>(1024, 1024, false);
      l->to(kFloat64);
      return l;
    });
    // Deferred to(kFloat64) draws in float64; the eager model drew in float32: compare with a
    // deferred one materialised whole instead (nn::materialize, Note [deferred parts]).
    manual_seed(kSeed);
    std::shared_ptr<nn::Linear> whole;
    {
      nn::DeferredInit d;
      whole = std::make_shared<nn::Linear>(1024, 1024, false);
    }
    whole->to(kFloat64);
    nn::materialize(*whole);
    cut(*lazy, "weight", Region::whole({1024, 1024}).shard(0, 1, 4, 2));
    const size_t peak = peak_of([&] { dist::materialize_local(*lazy); });
    MESSAGE("streamed: peak ", peak, " bytes for a piece of ", 2 << 20);
    CHECK(peak <= size_t(2 << 20) + 256 * 1024);
    CHECK(same_bits(lazy->weight, whole->weight.narrow(0, 512, 256)));
    (void)eager;
  }
  // An Embedding with a padding row asks is_deferred before writing it: the module is
  // materialised whole once (4 MiB) and cut, still eager's values.
  {
    auto [eager, lazy] = eager_and_deferred<nn::Embedding>([] {
      return std::make_shared<nn::Embedding>(
          nn::EmbeddingFields{.num_embeddings = 2048, .embedding_dim = 512, .padding_idx = 1});
    });
    cut(*lazy, "weight", Region::whole({2048, 512}).shard(0, 1, 4, 0));
    const size_t peak = peak_of([&] { dist::materialize_local(*lazy); });
    MESSAGE("fallback (padding row): peak ", peak, " bytes for a module of ", 4 << 20);
    CHECK(peak >= size_t(4 << 20));
    CHECK(same_bits(lazy->weight, eager->weight.narrow(0, 0, 512)));
    CHECK(lazy->weight.select(0, 1).abs().sum().item() == 0.0);
  }
  // orthogonal_ and an initialiser on part of a tensor: whole, exact.
  {
    auto [eager, lazy] =
        eager_and_deferred<Orthogonal>([] { return std::make_shared<Orthogonal>(); });
    cut(*lazy, "w", Region::whole({64, 32}).shard(1, 1, 2, 1));
    dist::materialize_local(*lazy);
    CHECK(same_bits(lazy->w, eager->w.narrow(1, 16, 16)));
  }
  {
    auto [eager, lazy] = eager_and_deferred<Halves>([] { return std::make_shared<Halves>(); });
    dist::materialize_local(*lazy);
    CHECK(same_bits(lazy->w, eager->w));
  }
}

TEST_CASE("materialize_regions: flat ranges of a piece, the rest left deferred") {
  auto [eager, lazy] =
      eager_and_deferred<nn::Linear>([] { return std::make_shared<nn::Linear>(50, 30); });
  cut(*lazy, "weight", Region::whole({30, 50}).shard(1, 1, 2, 0));  // columns 0..24
  // ZeRO-3's shard of the piece: elements [100, 400) of its row-major order, into a larger
  // buffer; the bias is not wanted and stays deferred.
  Tensor shard = zeros({310});
  const auto names = dist::materialize_regions(
      *lazy,
      [&](const std::string& name, const Tensor&,
          const Region& local) -> std::optional<dist::RegionTarget> {
        if (name != "weight") return std::nullopt;
        return dist::RegionTarget{local.flat(100, 400), shard.narrow(0, 10, 300)};
      });
  CHECK(names == std::vector<std::string>{"weight"});
  const Tensor piece = eager->weight.narrow(1, 0, 25).contiguous().reshape({-1});
  CHECK(same_bits(shard.narrow(0, 10, 300), piece.narrow(0, 100, 300)));
  CHECK(shard.narrow(0, 0, 10).abs().sum().item() == 0.0);
  CHECK(nn::is_deferred(lazy->bias));
  CHECK(lazy->weight.sizes() == Shape{30, 25});  // still deferred, in its piece's shape
  CHECK(nn::is_deferred(lazy->weight));
  // The bias later, alone: eager's values (the replay starts from the construction state).
  Tensor bias = zeros({30});
  dist::materialize_regions(*lazy,
                            [&](const std::string& name, const Tensor&,
                                const Region& local) -> std::optional<dist::RegionTarget> {
                              if (name != "bias") return std::nullopt;
                              return dist::RegionTarget{local, bias};
                            });
  CHECK(same_bits(bias, eager->bias));
}

TEST_CASE("materialize_regions and value sinks refuse what does not fit") {
  manual_seed(kSeed);
  std::shared_ptr<nn::Linear> lazy;
  {
    nn::DeferredInit d;
    lazy = std::make_shared<nn::Linear>(4, 3);
  }
  auto target = [&](Region region, Tensor dst) {
    return
        [=](const std::string&, const Tensor&, const Region&) -> std::optional<dist::RegionTarget> {
          return dist::RegionTarget{region, dst};
        };
  };
  std::string e = error_of<ShapeError>([&] {
    dist::materialize_regions(*lazy, target(Region::whole({3, 4}), zeros({11})));
  });
  CHECK(e.find("[materialize] Linear: parameter 'weight': the destination of a region of 12 "
               "elements must be contiguous and as large, got (11,)") != std::string::npos);
  e = error_of<ShapeError>([&] {
    dist::materialize_regions(*lazy, target(Region::whole({4, 3}), zeros({12})));
  });
  CHECK(
      e.find("a region of (4, 3) for parameter 'weight', whose initial value is of shape (3, 4)") !=
      std::string::npos);
  CHECK(nn::is_deferred(lazy->weight));  // nothing changed
  e = error_of<ValueError>([&] {
    nn::init::SinkScope scope({{zeros({3}), [](int64_t, const Tensor&) {}}});
  });
  CHECK(e.find("[init.SinkScope] a value sink needs a whole unallocated tensor") !=
        std::string::npos);
}
