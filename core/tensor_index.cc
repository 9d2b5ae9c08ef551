// The index list types of core/tensor_index.h.
#include "core/tensor_index.h"

#include <cstring>
#include <sstream>

namespace accel::indexing {

TensorIndex::TensorIndex(const char* s) : type_(TensorIndexType::Ellipsis) {
  ACCEL_CHECK(s != nullptr && std::strcmp(s, "...") == 0, ValueError, "index",
              "the only string allowed in an index list is \"...\" (Ellipsis), got \"",
              s ? s : "(null)", "\"");
}

std::string index_str(const std::vector<TensorIndex>& indices) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < indices.size(); ++i) {
    if (i) os << ", ";
    const TensorIndex& t = indices[i];
    switch (t.type()) {
      case TensorIndexType::None: os << "None"; break;
      case TensorIndexType::Ellipsis: os << "..."; break;
      case TensorIndexType::Integer: os << t.integer(); break;
      case TensorIndexType::Boolean: os << (t.boolean() ? "True" : "False"); break;
      case TensorIndexType::Slice: {
        const Slice& s = t.slice();
        if (s.start()) os << *s.start();
        os << ':';
        if (s.stop()) os << *s.stop();
        if (s.step()) os << ':' << *s.step();
        break;
      }
      case TensorIndexType::Tensor:
        if (!t.tensor().defined()) {
          os << "(undefined tensor)";
        } else {
          os << t.tensor().dtype() << ' ' << t.tensor().sizes();
        }
        break;
    }
  }
  os << ']';
  return os.str();
}

}  // namespace accel::indexing
