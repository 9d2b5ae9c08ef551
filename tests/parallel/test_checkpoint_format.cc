// The format-2 checkpoint library (parallel/checkpoint/, Note [format-2 checkpoints]) in one
// process: pieces of synthetic layouts (Shard with chunks, uneven and empty shards, Flat, tp x
// Flat) written by several fake ranks (write_rank_pieces per rank, then write_index as rank 0
// does), read back under every other layout and compared with a brute-force element map (each
// value is its global offset); dtype conversion on read; the lies and faults of section 7 of the
// placement design (F3: a shape-preserving region lie, a flipped byte, an edited scalar; F4: a
// link or a folder in the checkpoint); coverage gaps and double coverage; the writer's checks.
#include <doctest/doctest.h>
#include <zlib.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "accel.h"
#include "io/safetensors.h"
#include "parallel/checkpoint/reader.h"
#include "parallel/checkpoint/writer.h"
#include "tests/parallel/region_steps.h"
#include "tests/common/check.h"
#include "tests/common/util.h"
#include "tests/common/worker_check.h"

using namespace accel;
using dist::Region;
using dist::ckpt::StateEntry;
using test::Steps;
using json = nlohmann::json;
using test::check_error;
using test::TempDir;

namespace {

// A layout over a world: every rank's steps.
struct TestLayout {
  std::string name;
  std::vector<Steps> ranks;
};

TestLayout whole(const Shape& g) { return {"whole", {Steps{g, {}}}}; }
// Shard(dim, chunks) over n ranks.
TestLayout shard(const Shape& g, int64_t dim, int64_t chunks, int64_t n) {
  TestLayout l{"Shard(" + std::to_string(dim) + ", chunks=" + std::to_string(chunks) + ") x" +
                   std::to_string(n),
               {}};
  for (int64_t i = 0; i < n; ++i) l.ranks.push_back(Steps{g, {{dim, chunks, n, i}}});
  return l;
}
// Then each rank's piece cut into `n` Flat ranges (torch.chunk of its numel): world x n ranks.
TestLayout then_flat(const TestLayout& in, int64_t n) {
  TestLayout l{in.name + " then Flat x" + std::to_string(n), {}};
  for (const Steps& s : in.ranks) {
    const int64_t numel = s.region().numel();
    for (int64_t i = 0; i < n; ++i) {
      Steps t = s;
      const dist::Chunk c = dist::shard_chunk(numel, n, i);
      t.flat_lo = c.begin;
      t.flat_hi = c.begin + c.length;
      l.ranks.push_back(t);
    }
  }
  return l;
}
// Then each rank's piece cut again by Shard(dim) over n: world x n ranks.
TestLayout then_shard(const TestLayout& in, int64_t dim, int64_t n) {
  TestLayout l{in.name + " then Shard(" + std::to_string(dim) + ") x" + std::to_string(n), {}};
  for (const Steps& s : in.ranks)
    for (int64_t i = 0; i < n; ++i) {
      Steps t = s;
      t.cuts.push_back({dim, 1, n, i});
      l.ranks.push_back(t);
    }
  return l;
}

// The local tensor of a rank: its elements' global offsets as `dtype`.
Tensor local_values(const Steps& s, DType dtype) {
  const Region r = s.region();
  std::vector<double> v;
  for (int64_t o : s.offsets()) v.push_back(double(o));
  return tensor(v, r.local_shape(), TensorOptions(kFloat64)).to(dtype);
}

// Writes `tensors` (name -> layout) as every fake rank would, then rank 0's index.
dist::ckpt::Index save(const std::string& dir,
                       const std::vector<std::pair<std::string, TestLayout>>& tensors,
                       uint64_t block = 24, DType dtype = kFloat64, json meta = {{"step", 12}}) {
  size_t world = 0;
  for (const auto& [n, l] : tensors) world = std::max(world, l.ranks.size());
  std::vector<std::string> records;
  for (size_t r = 0; r < world; ++r) {
    std::vector<StateEntry> entries;
    for (const auto& [name, l] : tensors)
      if (r < l.ranks.size())
        entries.push_back(
            {name, l.ranks[r].region(), local_values(l.ranks[r], dtype), true, l.name});
    records.push_back(dist::ckpt::write_rank_pieces(dir, int(r), entries, block));
  }
  return dist::ckpt::write_index(dir, records, meta);
}

// Every rank of `l` reads its region; each element must be its global offset.
void check_read(dist::ckpt::CheckpointSource& src, const std::string& name, const TestLayout& l,
                const std::string& what) {
  for (size_t r = 0; r < l.ranks.size(); ++r) {
    const Region want = l.ranks[r].region();
    Tensor dst = full(want.local_shape(), -1.0, TensorOptions(kFloat64));
    src.read(name, want, dst);
    std::vector<double> expect;
    for (int64_t o : l.ranks[r].offsets()) expect.push_back(double(o));
    const std::vector<double> got = dst.reshape({-1}).to_vector<double>();
    CHECK_MESSAGE(got == expect, what << " -> " << l.name << " rank " << r);
  }
}

// index.json edited by `fn`, index_crc32 recomputed (a liar who knows the format).
void edit_index(const std::string& dir, const std::function<void(json&)>& fn, bool fix_crc = true) {
  const std::string path = dir + "/index.json";
  json j = json::parse(test::read_file(path));
  fn(j);
  if (fix_crc) {
    j.erase("index_crc32");
    const std::string text = j.dump();
    j["index_crc32"] =
        uint32_t(crc32(0, reinterpret_cast<const Bytef*>(text.data()), uInt(text.size())));
  }
  test::write_file(path, j.dump());
}

std::vector<TestLayout> layouts_2d() {  // [6, 10]
  const Shape g{6, 10};
  return {whole(g),
          shard(g, 0, 1, 4),  // rows 2, 2, 2, 0: an empty shard
          shard(g, 1, 1, 3),  // columns 4, 4, 2
          then_flat(whole(g), 7),
          then_flat(shard(g, 0, 1, 2), 3),
          then_shard(shard(g, 1, 1, 2), 0, 3),
          then_flat(shard(g, 0, 1, 4), 2)};
}
std::vector<TestLayout> layouts_qkv() {  // [12, 4]: q, k, v blocks of 4 rows
  const Shape g{12, 4};
  return {whole(g),
          shard(g, 0, 3, 2),
          shard(g, 0, 3, 4),
          then_flat(shard(g, 0, 3, 2), 3),
          then_flat(whole(g), 5),
          shard(g, 1, 1, 2),
          shard(g, 0, 3, 3)};
}
std::vector<TestLayout> layouts_3d() {  // [3, 4, 5]
  const Shape g{3, 4, 5};
  return {whole(g), shard(g, 1, 1, 3), then_flat(shard(g, 2, 1, 2), 2),
          then_shard(shard(g, 0, 1, 2), 2, 3), then_flat(whole(g), 4)};
}

}  // namespace

TEST_CASE("format 2: pieces of every layout read back under every other layout") {
  int pairs = 0;
  for (const auto& set : {layouts_2d(), layouts_qkv(), layouts_3d(),
                          std::vector<TestLayout>{whole({}), whole({0, 3}), shard({0, 3}, 0, 1, 2),
                                                  shard({5}, 0, 1, 4)}}) {
    for (const TestLayout& saved : set) {
      TempDir dir("ckfmt");
      save(dir.str(), {{"t", saved}});
      auto src = dist::ckpt::open_checkpoint(dir.str());
      CHECK(src->names() == std::vector<std::string>{"t"});
      CHECK(src->meta()["step"] == 12);
      for (const TestLayout& loaded : set) {
        if (loaded.ranks[0].global != saved.ranks[0].global) continue;
        check_read(*src, "t", loaded, saved.name);
        ++pairs;
      }
    }
  }
  CHECK(pairs == 49 + 49 + 25 + 1 + 4 + 1);
}

TEST_CASE("format 2: several tensors, ranks holding nothing, the files written") {
  TempDir dir("ckfmt");
  const auto l2 = layouts_2d();
  const auto lq = layouts_qkv();
  // rank 3 holds an empty shard of "a" and nothing of "b": no data file of its own.
  const dist::ckpt::Index idx = save(dir.str(), {{"a", l2[1]}, {"b", lq[1]}});
  CHECK(idx.files.size() == 3);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"data_rank0.safetensors", "data_rank1.safetensors",
                                          "data_rank2.safetensors", "index.json"});
  // HF tools read a data file as a plain safetensors file.
  io::Metadata meta;
  const io::TensorDict d = io::load_safetensors(dir / "data_rank1.safetensors", &meta);
  CHECK(meta.at("accel_format") == "2");
  CHECK(meta.at("rank") == "1");
  CHECK(d.count("a@r1") == 1);
  CHECK(d.count("b@r1") == 1);
  auto src = dist::ckpt::open_checkpoint(dir.str());
  check_read(*src, "a", l2[0], "a");
  check_read(*src, "b", lq[2], "b");
  CHECK(src->tensor("b").layout == lq[1].name);
  check_error<IoError>([&] { src->tensor("c"); }, {"holds no tensor 'c'"});
}

TEST_CASE("format 2: dtype conversion on read") {
  TempDir dir("ckfmt");
  const auto l = layouts_2d();
  save(dir.str(), {{"t", l[2]}}, 24, kFloat64);
  auto src = dist::ckpt::open_checkpoint(dir.str());
  const Region all = Region::whole({6, 10});
  for (DType dt : {kFloat32, kInt64, kBFloat16}) {
    Tensor dst = zeros({6, 10}, TensorOptions(dt));
    src->read("t", all, dst);
    CHECK(dst.dtype() == dt);
    CHECK(equal(dst.to(kFloat64),
                arange(60, TensorOptions(kFloat64)).reshape({6, 10}).to(dt).to(kFloat64)));
  }
  // Saved as float32, read as float64, under a Flat layout.
  TempDir dir32("ckfmt");
  save(dir32.str(), {{"t", l[4]}}, 16, kFloat32);
  auto src32 = dist::ckpt::open_checkpoint(dir32.str());
  CHECK(src32->tensor("t").dtype == kFloat32);
  check_read(*src32, "t", l[5], "float32 -> float64");
  // A destination of the wrong shape or a region of another tensor.
  check_error<ValueError>([&] { src->read("t", all, zeros({60}, TensorOptions(kFloat64))); },
                          {"[checkpoint]", "(6, 10)", "(60,)"});
  check_error<ShapeError>(
      [&] {
        src->read("t", Region::whole({6, 11}), zeros({6, 11}, TensorOptions(kFloat64)));
      },
      {"[checkpoint]", "'t'", "(6, 10)", "(6, 11)"});
}

TEST_CASE("format 2: a reader reads only the blocks it needs, and checks each") {
  TempDir dir("ckfmt");
  const Shape g{8, 1000};  // float32: one row = 4000 bytes = one CRC block
  save(dir.str(), {{"w", whole(g)}}, 4000, kFloat32);
  // Flip one byte of row 5 (the only entry: its bytes end the file).
  const std::string path = dir / "data_rank0.safetensors";
  std::string bytes = test::read_file(path);
  bytes[bytes.size() - 32000 + 5 * 4000 + 17] ^= 0x01;
  test::write_file(path, bytes);
  auto src = dist::ckpt::open_checkpoint(dir.str());
  const TestLayout rows = shard(g, 0, 1, 8);
  Tensor dst = empty({1, 1000}, TensorOptions(kFloat32));
  src->read("w", rows.ranks[2].region(), dst);  // row 2: its block is intact
  CHECK(dst.to(kFloat64).reshape({-1}).to_vector<double>()[999] == 2999.0);
  check_error<IoError>([&] { src->read("w", rows.ranks[5].region(), dst); },
                       {"data_rank0.safetensors", "tensor 'w'", "piece 'w@r0'", "block 5",
                        "bytes [20000, 24000)", "CRC-32"});
  check_error<IoError>([&] { src->read("w", Region::whole(g), empty(g, TensorOptions(kFloat32))); },
                       {"block 5"});
}

TEST_CASE("format 2 F3: a shape-preserving lie about a qkv piece's region is refused") {
  // qkv [12, 4] at tp 2: rank 0 holds rows 0-1, 4-5, 8-9 (its q, k and v rows). The issue's lie:
  // the index says chunks 1 (rows 0-5 and 6-11): each region is valid, the shapes and the coverage
  // are exact, the weights would load permuted. The CRCs seeded with the region catch it.
  const Shape g{12, 4};
  TempDir dir("ckfmt");
  save(dir.str(), {{"qkv", shard(g, 0, 3, 2)}}, dist::ckpt::kCrcBlockBytes);
  edit_index(dir.str(), [&](json& j) {
    auto& pieces = j["tensors"]["qkv"]["pieces"];
    pieces[0]["region"] = shard(g, 0, 1, 2).ranks[0].region().to_json();
    pieces[1]["region"] = shard(g, 0, 1, 2).ranks[1].region().to_json();
  });
  auto src = dist::ckpt::open_checkpoint(dir.str());
  check_error<IoError>(
      [&] { src->read("qkv", Region::whole(g), empty(g, TensorOptions(kFloat64))); },
      {"[checkpoint]", "tensor 'qkv'", "data_rank0.safetensors", "piece 'qkv@r0'", "block 0",
       "CRC-32"});

  // The q and k segments of rank 1's piece swapped in place: refused when the index is read.
  TempDir dir2("ckfmt");
  save(dir2.str(), {{"qkv", shard(g, 0, 3, 2)}});
  edit_index(dir2.str(), [&](json& j) {
    auto& segs = j["tensors"]["qkv"]["pieces"][1]["region"]["dims"][0];
    std::swap(segs[0][1], segs[1][1]);
  });
  check_error<IoError>(
      [&] { dist::ckpt::open_checkpoint(dir2.str()); },
      {"index.json", "tensor 'qkv'", "piece 1", "'qkv@r1'", "data_rank1.safetensors", "ascending"});

  // Two ranks' regions exchanged (an even Shard(1): same shapes, exact coverage).
  TempDir dir3("ckfmt");
  save(dir3.str(), {{"qkv", shard(g, 1, 1, 2)}});
  edit_index(dir3.str(), [&](json& j) {
    auto& pieces = j["tensors"]["qkv"]["pieces"];
    std::swap(pieces[0]["region"], pieces[1]["region"]);
  });
  auto src3 = dist::ckpt::open_checkpoint(dir3.str());
  check_error<IoError>(
      [&] { src3->read("qkv", Region::whole(g), empty(g, TensorOptions(kFloat64))); },
      {"tensor 'qkv'", "piece 'qkv@r", "CRC-32"});
}

TEST_CASE("format 2 F3: an edited scalar or a truncated index fails its CRC") {
  TempDir dir("ckfmt");
  save(dir.str(), {{"t", layouts_2d()[1]}});
  const std::string text = test::read_file(dir / "index.json");
  edit_index(
      dir.str(), [](json& j) { j["step"] = 13; }, /*fix_crc=*/false);
  check_error<IoError>([&] { dist::ckpt::open_checkpoint(dir.str()); },
                       {"[checkpoint]", "index.json", "index_crc32", "edited"});
  test::write_file(dir / "index.json", text.substr(0, text.size() - 10));
  check_error<IoError>([&] { dist::ckpt::open_checkpoint(dir.str()); },
                       {"index.json", "not a JSON object"});
  test::write_file(dir / "index.json", text);
  CHECK(dist::ckpt::open_checkpoint(dir.str())->meta()["step"] == 12);
}

TEST_CASE("format 2 F4: a link or a folder in the checkpoint is refused") {
  TempDir dir("ckfmt"), elsewhere("ckfmt");
  save(dir.str(), {{"t", layouts_2d()[1]}});
  // data_rank1 replaced by a link to an identical, valid file elsewhere.
  std::filesystem::copy_file(dir / "data_rank1.safetensors", elsewhere / "d1.safetensors");
  std::filesystem::remove(dir / "data_rank1.safetensors");
  std::filesystem::create_symlink(elsewhere / "d1.safetensors", dir / "data_rank1.safetensors");
  check_error<IoError>([&] { dist::ckpt::open_checkpoint(dir.str()); },
                       {"[checkpoint]", "data_rank1.safetensors", "symbolic link"});
  std::filesystem::remove(dir / "data_rank1.safetensors");
  std::filesystem::copy_file(elsewhere / "d1.safetensors", dir / "data_rank1.safetensors");
  CHECK_NOTHROW(dist::ckpt::open_checkpoint(dir.str()));
  std::filesystem::create_directory(dir / "tp0");
  check_error<IoError>([&] { dist::ckpt::open_checkpoint(dir.str()); }, {"tp0", "folder"});
  std::filesystem::remove(dir / "tp0");
  std::filesystem::create_symlink(dir / "index.json", dir / "extra.json");
  check_error<IoError>([&] { dist::ckpt::open_checkpoint(dir.str()); },
                       {"extra.json", "symbolic link"});
  std::filesystem::remove(dir / "extra.json");
  // A folder without index.json is not a format-2 checkpoint.
  TempDir empty_dir("ckfmt");
  check_error<IoError>([&] { dist::ckpt::open_checkpoint(empty_dir.str()); },
                       {"no index.json", "format-2"});
}

TEST_CASE("io: SafetensorsFile refuses a link when asked; read_bytes is bounds checked") {
  TempDir dir("ckfmt");
  io::save_safetensors(dir / "a.safetensors", {{"x", arange(6, TensorOptions(kFloat32))},
                                               {"y", ones({2}, TensorOptions(kInt64))}});
  std::filesystem::create_symlink(dir / "a.safetensors", dir / "link.safetensors");
  CHECK_NOTHROW(io::SafetensorsFile(dir / "link.safetensors"));  // kFollow: HF caches
  check_error<IoError>(
      [&] { io::SafetensorsFile(dir / "link.safetensors", file_io::Links::kRefuse); },
      {"link.safetensors"});
  io::SafetensorsFile f(dir / "a.safetensors", file_io::Links::kRefuse);
  float v[2] = {0, 0};
  f.read_bytes("x", 8, 8, v);  // elements 2 and 3
  CHECK(v[0] == 2.0f);
  CHECK(v[1] == 3.0f);
  check_error<IoError>([&] { f.read_bytes("x", 20, 8, v); },
                       {"a.safetensors", "bytes [20, 28)", "tensor 'x'", "24 bytes"});
  check_error<IoError>([&] { f.read_bytes("z", 0, 1, v); }, {"no tensor 'z'"});
}

TEST_CASE("format 2: an element in no piece or in two pieces is refused naming the tensor") {
  // [6, 10] in three row pieces; the index (CRC recomputed) moves piece 1 onto rows 0-1: rows 0-1
  // are then in two pieces and rows 2-3 in none, and the element counts still add up.
  const Shape g{6, 10};
  TempDir dir("ckfmt");
  const TestLayout rows = shard(g, 0, 1, 3);
  save(dir.str(), {{"t", rows}});
  edit_index(dir.str(), [&](json& j) {
    j["tensors"]["t"]["pieces"][1]["region"] = rows.ranks[0].region().to_json();
  });
  auto src = dist::ckpt::open_checkpoint(dir.str());
  check_error<IoError>([&] { src->read("t", Region::whole(g), empty(g, TensorOptions(kFloat64))); },
                       {"tensor 't'", "elements [0, 20)", "in two pieces", "'t@r0'", "'t@r1'"});
  check_error<IoError>(
      [&] {
        src->read("t", rows.ranks[1].region(), empty({2, 10}, TensorOptions(kFloat64)));
      },
      {"tensor 't'", "elements [0, 20)", "in no piece"});
  // Rows 4-5 are still exactly once: readable.
  check_read(*src, "t", TestLayout{"rows 4-5", {rows.ranks[2]}}, "one piece");
}

TEST_CASE("format 2: the index's checks") {
  const Shape g{6, 10};
  const TestLayout rows = shard(g, 0, 1, 3);
  auto refused = [&](const std::function<void(json&)>& lie,
                     std::initializer_list<const char*> needles) {
    TempDir dir("ckfmt");
    save(dir.str(), {{"t", rows}}, dist::ckpt::kCrcBlockBytes);
    edit_index(dir.str(), lie);
    check_error<IoError>(
        [&] {
          auto src = dist::ckpt::open_checkpoint(dir.str());
          src->read("t", Region::whole(g), empty(g, TensorOptions(kFloat64)));
        },
        needles);
  };
  refused([](json& j) { j["tensors"]["t"]["pieces"].erase(1); },
          {"tensor 't'", "40", "a piece is missing"});
  refused([](json& j) { j["tensors"]["t"]["pieces"][0]["region"]["dims"][0][0][1] = 5; },
          {"tensor 't'", "piece 0", "inside size 6"});
  refused([](json& j) { j["tensors"]["t"]["pieces"][2]["file"] = 7; },
          {"piece 2", "names file 7 of 3"});
  refused([](json& j) { j["tensors"]["t"]["pieces"][0]["crc"].push_back(1); },
          {"piece 0", "2 CRCs", "1 expected"});
  refused([](json& j) { j["tensors"]["t"]["dtype"] = "F33"; }, {"tensor 't'", "dtype"});
  refused([](json& j) { j["tensors"]["t"]["shape"] = {6, 10, 1}; }, {"tensor 't'", "(6, 10, 1)"});
  refused([](json& j) { j["files"][1]["name"] = "../x.safetensors"; }, {"'../x.safetensors'"});
  refused([](json& j) { j["files"][1]["bytes"] = 5; },
          {"data_rank1.safetensors", "the index says 5"});
  refused([](json& j) { j["format"] = 1; }, {"not a format-2"});
  // The dtype edited (as many blocks either way): the data file's entry says otherwise.
  refused([](json& j) { j["tensors"]["t"]["dtype"] = "F32"; },
          {"data_rank0.safetensors", "'t@r0'", "float64", "the index says float32"});
}

TEST_CASE("format 2: the writer's checks") {
  TempDir dir("ckfmt");
  const Shape g{6, 10};
  const TestLayout rows = shard(g, 0, 1, 2);
  auto entry = [&](int r, DType dt = kFloat64) {
    return StateEntry{"t", rows.ranks[size_t(r)].region(), local_values(rows.ranks[size_t(r)], dt),
                      true, ""};
  };
  const std::string r0 = dist::ckpt::write_rank_pieces(dir.str(), 0, {entry(0)});
  const std::string r1 = dist::ckpt::write_rank_pieces(dir.str(), 1, {entry(1, kFloat32)});
  check_error<ValueError>(
      [&] {
        dist::ckpt::write_index(dir.str(), {r0, r1}, json::object());
      },
      {"[checkpoint save]", "tensor 't'", "float64", "float32", "rank 1"});
  // Rank 1's pieces missing: every element must be in a piece.
  check_error<IoError>([&] { dist::ckpt::write_index(dir.str(), {r0}, json::object()); },
                       {"tensor 't'", "a piece is missing"});
  check_error<IoError>(
      [&] {
        dist::ckpt::write_index(dir.str(), {r0, R"({"error": "disk full"})"}, {});
      },
      {"rank 1", "disk full"});
  check_error<IoError>(
      [&] {
        dist::ckpt::write_index(dir.str(), {r0, r0}, json::object());
      },
      {"not the records of rank 1"});
  const std::string r1ok = dist::ckpt::write_rank_pieces(dir.str(), 1, {entry(1)});
  check_error<ValueError>(
      [&] {
        dist::ckpt::write_index(dir.str(), {r0, r1ok}, {{"tensors", 1}});
      },
      {"\"tensors\"", "index's own"});
  CHECK(!std::filesystem::exists(dir / "index.json"));  // nothing written on a failed check
  dist::ckpt::write_index(dir.str(), {r0, r1ok}, json::object());
  check_read(*dist::ckpt::open_checkpoint(dir.str()), "t", whole(g), "writer");
  // Entries a rank cannot write.
  StateEntry bad = entry(0);
  bad.local = zeros({4, 10}, TensorOptions(kFloat64));
  check_error<ValueError>([&] { dist::ckpt::write_rank_pieces(dir.str(), 0, {bad}); },
                          {"'t'", "(4, 10)", "(3, 10)"});
  check_error<ValueError>(
      [&] {
        dist::ckpt::write_rank_pieces(dir.str(), 0, {entry(0), entry(0)});
      },
      {"two pieces of 't'"});
  // One process: save_pieces without a group; a non-primary holder writes nothing.
  TempDir one("ckfmt");
  StateEntry replica = entry(1);
  replica.name = "u";
  replica.primary = false;
  StateEntry all{"t", Region::whole(g), local_values(whole(g).ranks[0], kFloat64), true, ""};
  const dist::ckpt::Index idx =
      dist::ckpt::save_pieces(one.str(), nullptr, 0, {all, replica}, {{"k", "v"}});
  CHECK(idx.tensors.at("t").pieces.size() == 1);
  CHECK(idx.tensors.count("u") == 0);
  CHECK(dist::ckpt::open_checkpoint(one.str())->meta() == json{{"k", "v"}});
  check_read(*dist::ckpt::open_checkpoint(one.str()), "t", rows, "save_pieces");
}

TEST_CASE("format 2: save_pieces over a Gloo world of 3 ranks") {
  using namespace std::chrono_literals;
  const std::string worker = test::helper_path("ckpt_worker");
  TempDir dir("ckfmt");
  test::check_ok(test::run_world(worker, {"save", dir.str()}, 3, {}, 60s), "save");
  auto src = dist::ckpt::open_checkpoint(dir.str());
  CHECK(src->meta()["step"] == 3);
  CHECK(src->tensor("qkv").pieces.size() == 2);  // 4 rows a block over 3: 2, 2, 0
  CHECK(src->tensor("rep").pieces.size() == 1);  // replicated: rank 0 alone writes it
  CHECK(src->tensor("flat").layout == "dp_shard: Flat");
  const std::vector<std::pair<std::string, Shape>> all = {
      {"qkv", {12, 4}}, {"rep", {5}}, {"flat", {7, 3}}};
  for (const auto& [name, shape] : all) {
    check_read(*src, name, whole(shape), name);
    check_read(*src, name, shard(shape, 0, 1, 2), name);
  }
  TempDir failed("ckfmt");
  test::check_ok(test::run_world(worker, {"save_fail", failed.str()}, 3, {}, 60s), "save_fail");
}
