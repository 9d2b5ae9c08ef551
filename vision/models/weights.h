// Pretrained weights for the model zoo: torchvision's `weights=` argument is an enum of download
// URLs; here it is a file the user has (no network), a state dict keyed as torchvision's
// state_dict(), loaded strictly (every key present, none extra, shapes equal).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "nn/module.h"

namespace accel::vision::models {

// The tensors of a state-dict file, by name: a torch.save file (.pt / .pth, zip or legacy layout,
// what torchvision's downloads and torch.save(model.state_dict()) write; io::load_pt), recognised
// by its name or its first bytes, else safetensors (nn::load_safetensors). Malformed files are
// the readers' IoErrors naming the file.
nn::TensorDict load_state_dict_file(const std::string& path);

// model.load_state_dict(load_state_dict_file(path), strict): the ValueError of a strict load
// lists every missing or unexpected key and shape mismatch.
nn::LoadResult load_weights(nn::Module& model, const std::string& path, bool strict = true);

namespace detail {
// The builders' common path: without weights, make() as is (torchvision's initialisation);
// with weights, make() under nn::DeferredInit (no parameter memory, no initialiser runs: the
// values come from the file, as torchvision skips init_weights when loading), then a strict load.
std::shared_ptr<nn::Module> build(const std::string& weights,
                                  const std::function<std::shared_ptr<nn::Module>()>& make);

template <typename M, typename Make>
std::shared_ptr<M> build_as(const std::string& weights, Make&& make) {
  return std::static_pointer_cast<M>(
      build(weights, [&]() -> std::shared_ptr<nn::Module> { return make(); }));
}
}  // namespace detail

}  // namespace accel::vision::models
