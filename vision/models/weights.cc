#include "vision/models/weights.h"

#include <cstdio>
#include <cstring>

#include "autograd/nn/safetensors.h"
#include "core/error.h"

namespace accel::vision::models {

namespace {
// torch.save's two layouts: a zip archive ("PK\x03\x04", torch >= 1.6) or the legacy pickle
// stream that starts with the pickled magic number (protocol 2: 0x80 0x02, then the long
// 0x1950a86a20f9469cfc6c as 0x8a 0x0a ...).
bool looks_like_torch_save(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;  // load_safetensors names the open error
  unsigned char head[4] = {0, 0, 0, 0};
  const size_t n = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  if (n == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return true;
  return n >= 3 && head[0] == 0x80 && head[1] == 0x02 && head[2] == 0x8a;
}
}  // namespace

nn::TensorDict load_state_dict_file(const std::string& path) {
  ACCEL_CHECK(!looks_like_torch_save(path), IoError, "vision.models.load_weights", "'", path,
              "' is a torch.save file (.pt / .pth); this build reads safetensors state dicts: "
              "convert it in Python with safetensors.torch.save_file(torch.load(path), out)");
  return nn::load_safetensors(path);
}

nn::LoadResult load_weights(nn::Module& model, const std::string& path, bool strict) {
  return model.load_state_dict(load_state_dict_file(path), strict);
}

namespace detail {
std::shared_ptr<nn::Module> build(const std::string& weights,
                                  const std::function<std::shared_ptr<nn::Module>()>& make) {
  if (weights.empty()) return make();
  nn::TensorDict state = load_state_dict_file(weights);  // file errors before any construction
  std::shared_ptr<nn::Module> model;
  {
    nn::DeferredInit deferred;
    model = make();
  }
  model->load_state_dict(state, /*strict=*/true);
  return model;
}
}  // namespace detail

}  // namespace accel::vision::models
