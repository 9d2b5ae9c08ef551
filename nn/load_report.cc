#include "nn/load_report.h"

#include <sstream>

namespace accel::nn {

std::string load_report(const LoadResult& r, const std::vector<std::string>& mismatched,
                        bool strict) {
  std::ostringstream os;
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    os << "; " << what << " (" << keys.size() << "): ";
    for (size_t i = 0; i < keys.size() && i < 20; ++i) os << (i ? ", " : "") << keys[i];
    if (keys.size() > 20) os << ", ...";
  };
  if (strict) {
    list("missing keys", r.missing_keys);
    list("unexpected keys", r.unexpected_keys);
  }
  list("shape mismatch", mismatched);
  return os.str();
}

}  // namespace accel::nn
