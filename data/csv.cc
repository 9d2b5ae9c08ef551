#include "data/csv.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

#include "core/error.h"
#include "data/io.h"

namespace accel::data {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

bool parse_number(std::string_view s, double& v) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);  // from_chars rejects a leading '+'
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

void split(std::string_view line, char delim, std::vector<std::string_view>& out) {
  out.clear();
  size_t start = 0;
  for (;;) {
    const size_t p = line.find(delim, start);
    out.push_back(trim(line.substr(start, p == std::string_view::npos ? p : p - start)));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
}

std::string shorten(std::string_view s) {
  constexpr size_t kMax = 40;
  return s.size() <= kMax ? std::string(s) : std::string(s.substr(0, kMax)) + "...";
}

}  // namespace

CsvTable read_csv(const std::string& path, CsvOptions o) {
  ACCEL_CHECK(o.dtype == kFloat32 || o.dtype == kFloat64, DTypeError, "csv",
              "values load as float32 or float64, not ", o.dtype);
  ACCEL_CHECK(o.delimiter != '\n' && o.delimiter != '"', ValueError, "csv", "bad delimiter");
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  ACCEL_CHECK(text.find('\0') == std::string_view::npos, IoError, "csv", "'", path,
              "' contains NUL bytes: not a text file");
  CsvTable table;
  std::vector<double> values;
  std::vector<std::string_view> fields;
  size_t ncols = 0;
  int64_t rows = 0, line_no = 0;
  bool seen_first = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (trim(line).empty()) continue;
    split(line, o.delimiter, fields);
    if (!seen_first) {
      seen_first = true;
      bool is_header;
      if (o.header.has_value()) {
        is_header = *o.header;
      } else {
        is_header = false;
        double v;
        for (auto f : fields) is_header |= !parse_number(f, v);
      }
      ncols = fields.size();
      if (is_header) {
        for (auto f : fields) table.columns.emplace_back(f);
        continue;
      }
    }
    ACCEL_CHECK(fields.size() == ncols, IoError, "csv", "'", path, "' line ", line_no, " has ",
                fields.size(), " fields, expected ", ncols, " (as in the first line)");
    for (size_t c = 0; c < fields.size(); ++c) {
      double v;
      ACCEL_CHECK(!fields[c].empty(), IoError, "csv", "'", path, "' line ", line_no, ", column ",
                  c + 1, ": empty field");
      ACCEL_CHECK(parse_number(fields[c], v), IoError, "csv", "'", path, "' line ", line_no,
                  ", column ", c + 1, ": '", shorten(fields[c]), "' is not a number");
      values.push_back(v);
    }
    ++rows;
  }
  ACCEL_CHECK(rows > 0, IoError, "csv", "'", path, "' has no data rows",
              table.columns.empty() ? "" : " after the header");
  table.values = empty({rows, int64_t(ncols)}, o.dtype);
  if (o.dtype == kFloat64) {
    std::memcpy(table.values.data_ptr(), values.data(), values.size() * sizeof(double));
  } else {
    float* dst = table.values.data<float>();
    for (size_t i = 0; i < values.size(); ++i) dst[i] = float(values[i]);
  }
  return table;
}

std::shared_ptr<TensorDataset> csv_dataset(const std::string& path, int64_t target_column,
                                           CsvOptions o, DType target_dtype) {
  ACCEL_CHECK(target_dtype == kInt64 || target_dtype == kInt32 || target_dtype == kFloat32 ||
                  target_dtype == kFloat64,
              DTypeError, "csv", "unsupported target dtype ", target_dtype);
  // Parse in float64 so integer targets up to 2^53 survive exactly.
  const DType feature_dtype = o.dtype;
  o.dtype = kFloat64;
  CsvTable t = read_csv(path, o);
  const int64_t rows = t.values.size(0), cols = t.values.size(1);
  const int64_t tc = target_column < 0 ? target_column + cols : target_column;
  ACCEL_CHECK(tc >= 0 && tc < cols, IndexError, "csv", "target column ", target_column,
              " out of range for '", path, "' with ", cols, " columns");
  const double* v = t.values.data<double>();
  Tensor features = empty({rows, cols - 1}, kFloat64);
  Tensor target = empty({rows}, kFloat64);
  double* pf = features.data<double>();
  double* pt = target.data<double>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0, k = 0; c < cols; ++c) {
      const double x = v[r * cols + c];
      if (c == tc) {
        // Data line numbers are not tracked past parsing; the row number is exact.
        ACCEL_CHECK(is_floating(target_dtype) || (std::isfinite(x) && x == std::floor(x)), IoError,
                    "csv", "'", path, "' data row ", r + 1, ": target ", x,
                    " is not a whole number (target dtype ", target_dtype, ")");
        pt[r] = x;
      } else {
        pf[r * (cols - 1) + k++] = x;
      }
    }
  }
  std::vector<std::string> names{"features", "target"};
  return std::make_shared<TensorDataset>(
      std::vector<Tensor>{features.to(feature_dtype), target.to(target_dtype)}, names);
}

}  // namespace accel::data
