// Small std-only helpers of the tests and their worker programs: scratch folders, whole-file reads
// and writes, substring tests. Header-only, std + POSIX.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::test {

// A fresh folder under $TMPDIR (or /tmp) named accel-<tag>-XXXXXX, removed with everything in it
// on destruction (permissions restored first, so a test may lock parts of it).
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / ("accel-" + tag + "-XXXXXX")).string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("TempDir: mkdtemp failed for " + tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return path.string(); }
  // The path of `name` inside the folder.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::string file(const std::string& name) const { return *this / name; }

  std::filesystem::path path;
};

// The folders fresh_dir made in this process (tests/doctest_main.cc removes them when the run
// passes).
inline std::vector<std::string>& fresh_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

// An empty folder /tmp/<prefix>-<pid>-<tag>, removed first if a crashed run left it behind. A
// doctest program removes it at the end of a run that passed, and keeps it after a failure (for
// a look at what the failed case wrote) or with ACCEL_TEST_KEEP_DIRS=1.
inline std::string fresh_dir(const std::string& prefix, const std::string& tag) {
  std::string d = "/tmp/" + prefix + "-" + std::to_string(getpid()) + "-" + tag;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  fresh_dirs().push_back(d);
  return d;
}

// The whole file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Replaces the file's contents with `bytes`; throws when it cannot be written.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("write_file: cannot write " + path);
}

// Every field of s between separators, empty ones included ("a,,b" -> a, "", b; "" -> one "").
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace accel::test
