#include "data/csv.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "data/csv_parse.h"
#include "data/io.h"

namespace accel::data {

CsvTable read_csv(const std::string& path, CsvOptions o) {
  ACCEL_CHECK(o.dtype == kFloat32 || o.dtype == kFloat64, DTypeError, "csv",
              "values load as float32 or float64, not ", o.dtype);
  // The limit bounds what a small .csv.gz can make us inflate (deflate reaches ~1000:1).
  const std::vector<uint8_t> bytes = read_file_bytes(path, true, o.max_bytes);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  CsvParsed p = parse_csv_text(text, o.delimiter, o.header, path);
  CsvTable table;
  table.columns = std::move(p.columns);
  table.values = empty({p.rows, int64_t(p.cols)}, o.dtype);
  if (o.dtype == kFloat64) {
    std::memcpy(table.values.data_ptr(), p.values.data(), p.values.size() * sizeof(double));
  } else {
    float* dst = table.values.data<float>();
    for (size_t i = 0; i < p.values.size(); ++i) dst[i] = float(p.values[i]);
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
  // [lo, hi) of the integral target dtypes, exact in double.
  const double lo = target_dtype == kInt32 ? -0x1p31 : -0x1p63;
  const double hi = target_dtype == kInt32 ? 0x1p31 : 0x1p63;
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
        // Converting a double outside the integer type's range is undefined behaviour.
        ACCEL_CHECK(is_floating(target_dtype) || (x >= lo && x < hi), IoError, "csv", "'", path,
                    "' data row ", r + 1, ": target ", x, " is out of range for ", target_dtype);
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
