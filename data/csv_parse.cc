#include "data/csv_parse.h"

#include <charconv>

#include "core/error.h"

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

CsvParsed parse_csv_text(std::string_view text, char delimiter, std::optional<bool> header,
                         const std::string& what) {
  ACCEL_CHECK(delimiter != '\n' && delimiter != '"', ValueError, "csv", "bad delimiter");
  ACCEL_CHECK(text.find('\0') == std::string_view::npos, IoError, "csv", "'", what,
              "' contains NUL bytes: not a text file");
  CsvParsed out;
  std::vector<std::string_view> fields;
  bool seen_first = false;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (trim(line).empty()) continue;
    split(line, delimiter, fields);
    if (!seen_first) {
      seen_first = true;
      bool is_header;
      if (header.has_value()) {
        is_header = *header;
      } else {
        is_header = false;
        double v;
        for (auto f : fields) is_header |= !parse_number(f, v);
      }
      out.cols = fields.size();
      if (is_header) {
        for (auto f : fields) out.columns.emplace_back(f);
        continue;
      }
    }
    ACCEL_CHECK(fields.size() == out.cols, IoError, "csv", "'", what, "' line ", line_no, " has ",
                fields.size(), " fields, expected ", out.cols, " (as in the first line)");
    for (size_t c = 0; c < fields.size(); ++c) {
      double v;
      ACCEL_CHECK(!fields[c].empty(), IoError, "csv", "'", what, "' line ", line_no, ", column ",
                  c + 1, ": empty field");
      ACCEL_CHECK(parse_number(fields[c], v), IoError, "csv", "'", what, "' line ", line_no,
                  ", column ", c + 1, ": '", shorten(fields[c]), "' is not a number");
      out.values.push_back(v);
    }
    ++out.rows;
  }
  ACCEL_CHECK(out.rows > 0, IoError, "csv", "'", what, "' has no data rows",
              out.columns.empty() ? "" : " after the header");
  return out;
}

}  // namespace accel::data
