// Fuzz target: the safetensors header checks on arbitrary file bytes, as load_safetensors()
// runs them. IoError is the documented failure.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "io/safetensors_header.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accel::io::detail;
  if (size < kSafetensorsLengthBytes) return 0;
  try {
    const uint64_t len = safetensors_header_length(data, size, "<fuzz>");
    const std::string_view header(reinterpret_cast<const char*>(data) + kSafetensorsLengthBytes,
                                  size_t(len));
    const uint64_t buffer_size = size - kSafetensorsLengthBytes - len;
    std::map<std::string, std::string> metadata;
    const auto entries = parse_safetensors_header(header, buffer_size, "<fuzz>", &metadata);
    // The loader relies on: sorted entries tiling [0, buffer_size) exactly, each exactly
    // numel x dtype size bytes.
    uint64_t pos = 0;
    const uint8_t* buffer = data + kSafetensorsLengthBytes + len;
    for (const auto& e : entries) {
      if (e.begin != pos || e.end < e.begin || e.end > buffer_size) std::abort();
      uint64_t numel = 1;
      for (int64_t d : e.shape) numel *= uint64_t(d);
      if (numel * accel::dtype_size(e.dtype) != e.end - e.begin) std::abort();
      volatile uint8_t sink = 0;
      for (uint64_t i = e.begin; i < e.end; ++i) sink = sink ^ buffer[i];
      pos = e.end;
    }
    if (pos != buffer_size) std::abort();
  } catch (const accel::IoError&) {
  }
  return 0;
}
