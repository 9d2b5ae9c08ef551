// Fuzz target: the CSV text parser. The first byte picks the delimiter and header mode, the
// rest is the text. IoError and ValueError are the documented failures.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "data/csv_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accel::data;
  if (size < 1) return 0;
  static constexpr char kDelims[] = {',', ';', '\t', ' ', '|', '"', '\n', 'x'};
  const char delim = kDelims[data[0] & 7];
  const int mode = (data[0] >> 3) % 3;
  const std::optional<bool> header = mode == 0 ? std::nullopt : std::optional<bool>(mode == 1);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const CsvParsed p = parse_csv_text(text, delim, header, "<fuzz>");
    if (p.rows <= 0 || p.values.size() != size_t(p.rows) * p.cols) std::abort();
    if (!p.columns.empty() && p.columns.size() != p.cols) std::abort();
  } catch (const accel::IoError&) {
  } catch (const accel::ValueError&) {
  }
  return 0;
}
