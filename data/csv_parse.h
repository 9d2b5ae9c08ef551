// The CSV text parser without tensors, shared by read_csv() and the fuzz target
// (tests/fuzz/fuzz_csv.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accel::data {

struct CsvParsed {
  std::vector<double> values;  // row-major, rows x cols
  int64_t rows = 0;
  size_t cols = 0;
  std::vector<std::string> columns;  // from the header; empty without one
};

// Parses CSV text (rules in csv.h). `header`: true, false, or nullopt to detect it. IoError
// naming `what`, the line and the column for a NUL byte, a field that is not a number, a row
// with the wrong number of fields, or text without data rows; ValueError for a bad delimiter.
CsvParsed parse_csv_text(std::string_view text, char delimiter, std::optional<bool> header,
                         const std::string& what);

}  // namespace accel::data
