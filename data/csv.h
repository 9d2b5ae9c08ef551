// CSV files of numbers (optionally gzip-compressed): one row per line, fields separated by a
// delimiter, an optional header line of column names.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"

namespace accel::data {

struct CsvOptions {
  char delimiter = ',';
  // true: the first line holds column names; false: it is data; nullopt: it is a header when
  // any of its fields is not a number.
  std::optional<bool> header;
  DType dtype = kFloat32;  // float32 or float64
  // Largest text accepted, after gzip inflation: a hostile .csv.gz of a few MB could inflate to
  // gigabytes (deflate reaches ~1000:1), so inflation stops here with an IoError.
  size_t max_bytes = size_t(1) << 30;
};

struct CsvTable {
  Tensor values;                     // (rows, columns)
  std::vector<std::string> columns;  // from the header; empty without one
};

// IoError naming the file, line and column for a field that is not a number, a row with the
// wrong number of fields, or a file without data rows. Blank lines are skipped; fields may be
// padded with spaces or wrapped in double quotes.
CsvTable read_csv(const std::string& path, CsvOptions options = {});

// Features (all other columns, dtype of options) and target (column `target_column`, negative
// counts from the end) as a TensorDataset ("features", "target"). With an integral
// target_dtype every target must be a whole number within that dtype's range.
std::shared_ptr<TensorDataset> csv_dataset(const std::string& path, int64_t target_column = -1,
                                           CsvOptions options = {}, DType target_dtype = kInt64);

}  // namespace accel::data
