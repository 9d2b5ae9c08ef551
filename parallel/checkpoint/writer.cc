#include "parallel/checkpoint/writer.h"

#include <exception>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "io/safetensors.h"
#include "parallel/checkpoint/crc.h"

namespace accel::dist::ckpt {

namespace {

using json = nlohmann::json;
constexpr const char* kOp = "checkpoint save";
// The tag of the record messages to rank 0 (any constant: nothing else is in flight then).
constexpr int kRecordTag = 0x43b2;

}  // namespace

std::string write_rank_pieces(const std::string& dir, int rank,
                              const std::vector<StateEntry>& entries, uint64_t crc_block_bytes) {
  ACCEL_CHECK(rank >= 0, ValueError, kOp, "rank ", rank);
  ACCEL_CHECK(crc_block_bytes >= 1 && crc_block_bytes <= kMaxCrcBlockBytes, ValueError, kOp,
              "crc_block_bytes ", crc_block_bytes, " outside [1, ", kMaxCrcBlockBytes, "]");
  std::set<std::string> seen;
  std::vector<const StateEntry*> pieces;  // primary, holding elements: written
  json tensors = json::object();
  for (const StateEntry& e : entries) {
    ACCEL_CHECK(!e.name.empty(), ValueError, kOp, "an entry with an empty name");
    ACCEL_CHECK(seen.insert(e.name).second, ValueError, kOp, "rank ", rank, " has two pieces of '",
                e.name, "' (a region holds all of a rank's chunks)");
    ACCEL_CHECK(e.local.defined() && e.local.sizes() == e.region.local_shape(), ValueError, kOp,
                "'", e.name, "': the local tensor is ",
                e.local.defined() ? e.local.shape_str() : std::string("undefined"),
                ", its region (", e.region.str(), ") is ", shape_str(e.region.local_shape()));
    if (!e.primary) continue;
    TensorRecord t;
    t.dtype = e.local.dtype();
    t.shape = e.region.global_shape();
    t.layout = e.layout;
    tensors[e.name] = tensor_to_json(t);  // pieces filled below
    if (e.region.numel() > 0) pieces.push_back(&e);
  }
  json file = nullptr;
  if (!pieces.empty()) {
    const std::string path = (std::filesystem::path(dir) / data_file_name(rank)).string();
    std::vector<io::SafetensorsWriter::Entry> announced;
    for (const StateEntry* e : pieces)
      announced.push_back(
          {piece_entry_name(e->name, rank), e->local.dtype(), e->region.local_shape()});
    // Atomic and durable: a unique temporary created O_EXCL|O_NOFOLLOW, fsync, rename, fsync of
    // the folder (Note [safe file access] in core/file_io.h).
    io::SafetensorsWriter w(
        path, announced,
        {{"accel_format", std::to_string(kFormat)}, {"rank", std::to_string(rank)}});
    NoGradGuard ng;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const StateEntry& e = *pieces[k];
      Tensor h = e.local.detach();
      if (!h.device().is_cpu()) h = h.to(kCPU);
      h = h.contiguous();
      // The CRCs of exactly the bytes handed to the writer (it writes `h` as it is).
      PieceRecord p;
      p.file = 0;
      p.entry = announced[k].name;
      p.region = e.region;
      p.crc = block_crcs(piece_seed(e.name, h.dtype(), e.region), h.data_ptr(), h.nbytes(),
                         crc_block_bytes);
      tensors[e.name]["pieces"].push_back(
          {{"file", 0}, {"entry", p.entry}, {"region", p.region.to_json()}, {"crc", p.crc}});
      w.write(h);
    }
    w.commit();
    file = {{"name", data_file_name(rank)}, {"bytes", std::filesystem::file_size(path)}};
  }
  json out = {{"rank", rank},
              {"crc_block_bytes", crc_block_bytes},
              {"file", std::move(file)},
              {"tensors", std::move(tensors)}};
  try {
    return out.dump();
  } catch (const json::exception& e) {
    ACCEL_THROW(ValueError, kOp, "a tensor name is not valid UTF-8: ", e.what());
  }
}

Index write_index(const std::string& dir, const std::vector<std::string>& rank_records,
                  const json& meta) {
  ACCEL_CHECK(meta.is_object() || meta.is_null(), ValueError, kOp,
              "the index meta must be a JSON object, got ", meta.type_name());
  const std::string path = (std::filesystem::path(dir) / kIndexFile).string();
  Index index;
  index.meta = meta.is_null() ? json::object() : meta;
  bool have_block = false;
  for (size_t r = 0; r < rank_records.size(); ++r) {
    const std::string where = "'" + path + "' (records of rank " + std::to_string(r) + ")";
    const json j = json::parse(rank_records[r], nullptr, /*allow_exceptions=*/false);
    ACCEL_CHECK(!j.is_discarded() && j.is_object(), IoError, kOp, where, " are not a JSON object");
    if (j.contains("error"))
      ACCEL_THROW(IoError, kOp, "rank ", r, " could not write its pieces: ",
                  j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump());
    ACCEL_CHECK(j.contains("rank") && j["rank"] == r && j.contains("crc_block_bytes") &&
                    j["crc_block_bytes"].is_number_unsigned() && j.contains("tensors") &&
                    j["tensors"].is_object() && j.contains("file"),
                IoError, kOp, where, " are not the records of rank ", r);
    const uint64_t block = j["crc_block_bytes"].get<uint64_t>();
    ACCEL_CHECK(!have_block || block == index.crc_block_bytes, IoError, kOp, where,
                " use blocks of ", block, " bytes, rank 0's of ", index.crc_block_bytes);
    index.crc_block_bytes = block;
    have_block = true;
    const int64_t file_index = int64_t(index.files.size());
    std::vector<FileRecord> own;  // the rank's file, index 0 in its records
    if (!j["file"].is_null()) {
      const json& f = j["file"];
      ACCEL_CHECK(f.is_object() && f.contains("name") && f["name"].is_string() &&
                      f.contains("bytes") && f["bytes"].is_number_unsigned(),
                  IoError, kOp, where, ": \"file\" is not {\"name\", \"bytes\"}");
      own.push_back({f["name"].get<std::string>(), f["bytes"].get<uint64_t>()});
      index.files.push_back(own.back());
    }
    for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
      TensorRecord t = tensor_from_json(it.value(), it.key(), own, block, where);
      for (PieceRecord& p : t.pieces) p.file = file_index;
      auto [at, fresh] = index.tensors.emplace(it.key(), TensorRecord{});
      if (fresh) {
        at->second = std::move(t);
        continue;
      }
      TensorRecord& have = at->second;
      ACCEL_CHECK(have.dtype == t.dtype && have.shape == t.shape, ValueError, kOp, "tensor '",
                  it.key(), "' is ", have.dtype, " ", shape_str(have.shape),
                  " on an earlier rank and ", t.dtype, " ", shape_str(t.shape), " on rank ", r);
      for (PieceRecord& p : t.pieces) have.pieces.push_back(std::move(p));
    }
  }
  validate_index(index, "'" + path + "' (being saved)");
  // Last: every rank's data file is durable before its records were sent.
  file_io::write_file_atomic(path, index_to_text(index), "checkpoint save", /*durable=*/true);
  return index;
}

Index save_pieces(const std::string& dir, ProcessGroup* world, int rank,
                  const std::vector<StateEntry>& entries, const json& meta,
                  uint64_t crc_block_bytes) {
  if (world == nullptr) {
    ACCEL_CHECK(rank == 0, ValueError, kOp, "rank ", rank, " without a process group");
    return write_index(dir, {write_rank_pieces(dir, 0, entries, crc_block_bytes)}, meta);
  }
  ACCEL_CHECK(rank == world->rank(), ValueError, kOp, "rank ", rank, " is rank ", world->rank(),
              " of the process group");
  // A rank that fails still reports, so rank 0 never waits for a message that will not come.
  std::string records;
  std::exception_ptr failed;
  try {
    records = write_rank_pieces(dir, rank, entries, crc_block_bytes);
  } catch (const std::exception& e) {
    failed = std::current_exception();
    records =
        json{{"error", std::string(e.what())}}.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (rank != 0) {
    Tensor len = tensor(std::vector<int64_t>{int64_t(records.size())}, {1}, TensorOptions(kInt64));
    world->send(len, 0, kRecordTag);
    Tensor bytes = empty({int64_t(records.size())}, TensorOptions(kUInt8));
    std::copy(records.begin(), records.end(), static_cast<char*>(bytes.data_ptr()));
    world->send(bytes, 0, kRecordTag);
    if (failed) std::rethrow_exception(failed);
    return Index{};
  }
  std::vector<std::string> all(size_t(world->size()));
  all[0] = std::move(records);
  for (int r = 1; r < world->size(); ++r) {
    Tensor len = empty({1}, TensorOptions(kInt64));
    world->recv(len, r, kRecordTag);
    const int64_t n = len.to_vector<int64_t>()[0];
    ACCEL_CHECK(n >= 0 && uint64_t(n) <= kMaxIndexBytes, IoError, kOp, "rank ", r,
                " announced records of ", n, " bytes");
    Tensor bytes = empty({n}, TensorOptions(kUInt8));
    world->recv(bytes, r, kRecordTag);
    all[size_t(r)].assign(static_cast<const char*>(bytes.data_ptr()), size_t(n));
  }
  if (failed) std::rethrow_exception(failed);
  return write_index(dir, all, meta);
}

}  // namespace accel::dist::ckpt
