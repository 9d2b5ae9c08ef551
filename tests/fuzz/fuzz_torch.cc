// Fuzz target: torch.save files (zip or legacy layout) on arbitrary bytes, as read_pt parses them
// (io/torch_file.h): the zip directory, the restricted unpickler, the layout checks, each
// storage read with its CRC-32, and the bounded walk of the result. IoError is the documented
// failure; a file that passes must satisfy what read_pt's tensor builder relies on.
//
// Byte 0 picks the input: even, the rest is a whole file; odd, the rest is a data.pkl unpickled
// alone (a mutation inside a zip record fails its CRC-32 before the unpickler sees it, so the
// unpickler gets inputs of its own). The seeds (tests/fuzz/corpus/fuzz_torch/, written by
// tests/io/make_torch_fixtures.py) are both kinds.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "io/torch_file.h"
#include "core/error.h"

namespace {

using namespace accel::io::detail;

// Every tensor views a storage the file holds, inside it.
class Checker final : public PickleVisitor {
 public:
  explicit Checker(const std::map<std::string, StorageInfo>& storages) : storages_(storages) {}
  void none() override {}
  void boolean(bool) override {}
  void integer(int64_t) override {}
  void real(double) override {}
  void string(const std::string&) override {}
  void tensor(const TensorRecord& t, const void*) override {
    auto it = storages_.find(t.storage_key);
    if (it == storages_.end() || it->second.dtype != t.dtype) std::abort();
    const int64_t numel = it->second.numel;
    if (t.sizes.size() != t.strides.size() || t.offset < 0) std::abort();
    __int128 count = 1, last = t.offset;
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      if (t.sizes[d] < 0 || t.strides[d] < 0) std::abort();
      count *= t.sizes[d];
      if (t.sizes[d] > 0) last += __int128(t.sizes[d] - 1) * t.strides[d];
    }
    if (count == 0 ? t.offset > numel : last >= numel) std::abort();
  }
  void begin_list(size_t) override {}
  void begin_tuple(size_t) override {}
  void begin_dict(bool, size_t, size_t) override {}
  void end() override {}

 private:
  const std::map<std::string, StorageInfo>& storages_;
};

void whole_file(const ByteSource& src) {
  const TorchFile f = parse_torch_file(src, "<fuzz>");
  std::map<std::string, StorageInfo> infos;
  for (const auto& [key, s] : f.storages) {
    // Inside the file, exactly numel x element size bytes.
    if (s.offset > src.size || s.nbytes > src.size - s.offset) std::abort();
    if (s.nbytes != uint64_t(s.info.numel) * accel::dtype_size(s.info.dtype)) std::abort();
    std::vector<unsigned char> bytes(size_t(s.nbytes));
    read_storage(src, s, bytes.data(), key, "<fuzz>");
    infos.emplace(key, s.info);
  }
  Checker c(infos);
  walk_pickle(*f.pickle, f.root, c);
}

void pickle_alone(const ByteSource& src) {
  Unpickler u("<fuzz>", false, PickleLimits::for_size(src.size));
  const PickleValue root = u.load(src, 0, src.size, "data.pkl");
  Checker c(u.storages());
  walk_pickle(u, root, c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const ByteSource src = memory_source(data + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      whole_file(src);
    } else {
      pickle_alone(src);
    }
  } catch (const accel::IoError&) {
  }
  return 0;
}
