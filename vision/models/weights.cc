#include "vision/models/weights.h"

#include <fstream>

#include "io/safetensors.h"
#include "io/torch_file.h"
#include "io/torch_format.h"
#include "core/error.h"

namespace accel::vision::models {

namespace {
// A torch.save file (zip or legacy pickle) by its first bytes; a .pt / .pth name counts too, as
// Module::load decides, so that a damaged one gets the torch reader's error.
bool is_torch_file(const std::string& path) {
  auto ends = [&](const std::string& ext) {
    return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  };
  if (ends(".pt") || ends(".pth")) return true;
  std::ifstream f(path, std::ios::binary);
  unsigned char head[16] = {};
  f.read(reinterpret_cast<char*>(head), sizeof head);
  return f.gcount() > 0 && io::detail::looks_like_torch_file(head, size_t(f.gcount()));
}
}  // namespace

nn::TensorDict load_state_dict_file(const std::string& path) {
  return is_torch_file(path) ? io::load_pt(path) : nn::load_safetensors(path);
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
