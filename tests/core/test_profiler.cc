// core/profiler.h: the kernel-level profiler behind `build/bench/workloads --profile` and the
// workload limits (Note [stub profiler]).
#include <doctest/doctest.h>

#include <string>

#include "accel.h"
#include "core/dispatch.h"

using namespace accel;

namespace {

const ProfileRow* find_row(const std::vector<ProfileRow>& rows, const std::string& op) {
  for (const ProfileRow& r : rows)
    if (r.op == op) return &r;
  return nullptr;
}

}  // namespace

TEST_CASE("profiler: rows per stub and op label, self time within total") {
  Generator gen(3);
  const Tensor a = randn({64, 32}, {}, &gen), b = randn({32, 48}, {}, &gen);
  Profiler p;
  const Tensor y = gelu(matmul(a, b));
  const Tensor z = exp(y);
  const Tensor w = gelu(z);
  const auto rows = p.rows();
  const ProfileRow* mm = find_row(rows, "matmul_stub");
  const ProfileRow* ge = find_row(rows, "unary_stub:gelu_erf");
  const ProfileRow* ex = find_row(rows, "unary_stub:exp");
  REQUIRE(mm != nullptr);
  REQUIRE(ge != nullptr);
  REQUIRE(ex != nullptr);
  CHECK(mm->calls == 1);
  CHECK(ge->calls == 2);
  CHECK(ex->calls == 1);
  for (const ProfileRow& r : rows) {
    CHECK(r.self_ms >= 0);
    CHECK(r.total_ms >= r.self_ms);
  }
  // Sorted by self time.
  for (size_t i = 1; i < rows.size(); ++i) CHECK(rows[i - 1].self_ms >= rows[i].self_ms);
  p.reset();
  CHECK(p.rows().empty());
}

TEST_CASE("profiler: replays are captured once per distinct call, counted, and run alone") {
  Generator gen(4);
  Tensor a = randn({16, 8}, {}, &gen), b = randn({8, 4}, {}, &gen), c = randn({4, 8}, {}, &gen);
  std::vector<ReplayCall> calls;
  {
    Profiler p({{"matmul_stub"}, false});
    (void)matmul(a, b);
    (void)matmul(a, b);
    (void)matmul(b, c);          // another shape
    (void)matmul(b.t(), a.t());  // transposed operands: other strides, another key
    (void)exp(a);                // not replayed
    calls = p.replays();
  }
  REQUIRE(calls.size() == 3);
  CHECK(calls[0].stub == "matmul_stub");
  CHECK(calls[0].count == 2);
  CHECK(calls[1].count == 1);
  CHECK(calls[2].count == 1);
  CHECK(calls[0].key != calls[1].key);
  CHECK(calls[1].key != calls[2].key);
  // The replay owns copies: the originals may change or die.
  const Tensor before = a.clone();
  a.fill_(7.0);
  a = Tensor();
  for (const ReplayCall& r : calls) r.run();
  CHECK(before.size(0) == 16);
}

TEST_CASE("profiler: the bytes floor counts a written storage twice and a read one once") {
  NoGradGuard ng;
  const Tensor x = ones({1000});  // f32: 4000 bytes
  Profiler p({{}, true});
  const Tensor y = exp(x);  // reads x, writes y
  CHECK(p.floor_bytes() == 4000 + 2 * 4000);
  const Tensor z = add(y, y);  // y again (already written): + z written
  CHECK(p.floor_bytes() == 4000 + 2 * 4000 + 2 * 4000);
}

TEST_CASE("profiler: one at a time; the coverage recorder works beside it; off afterwards") {
  {
    Profiler p;
    CHECK_THROWS_AS(Profiler(), Error);
    StubCallRecorder rec;
    (void)exp(ones({3}));
    bool seen = false;
    for (const auto& [stub, dev] : rec.calls()) seen = seen || stub == "unary_stub";
    CHECK(seen);
    CHECK(find_row(p.rows(), "unary_stub:exp") != nullptr);
  }
  CHECK_FALSE(detail::g_trace_stub_calls.load());
  Profiler again;  // a new one may start
  (void)exp(ones({3}));
  CHECK(again.rows().size() >= 1);
}
