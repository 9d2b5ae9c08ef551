// Deferred init (Note [deferred init]): DeferredInit, materialising a module's own parameters by
// replaying its construction-time generator, and streaming them to value sinks so that only a
// region of each is ever held (Note [streamed materialization]).
#include <algorithm>
#include <mutex>

#include "nn/init.h"
#include "nn/module.h"

namespace accel::nn {

namespace {
thread_local int g_deferred_depth = 0;  // live DeferredInit guards on this thread
}  // namespace

// ---------------- deferred init ----------------

// Note [deferred init]
// A model that does not fit one process must exist (names, shapes, the module tree) before any
// rank holds its values, so that ZeRO-3 can materialize one unit at a time, keep this rank's
// shard and free the rest (dist/fsdp.h). Under nn::DeferredInit, register_parameter releases
// each parameter's storage right after registering it (core/storage.h Note [released storage]):
// a constructor allocates at most one parameter at a time and ends holding none. Buffers stay
// real: they are small and constructors compute them.
//
// Same values as eager construction, in any order. Built-in constructors register their
// parameters and then call reset_parameters(), whose nn::init calls leave unallocated tensors
// alone but still pull from the generator as many values as they would have drawn (in small
// chunks, so no parameter-sized buffer). Two consequences: the default generator ends deferred
// construction in the state eager construction leaves it in (dropout and shuffling afterwards
// match), and each module's first deferred registration can snapshot the default generator's
// state (deferred_rng_state_, ~6 KB of text), which is exactly the state its eager
// reset_parameters() started from. materialize_own_parameters() sets that state, runs
// reset_parameters() and puts the current state back, so a module's values do not depend on
// which modules were materialized before it: a ZeRO-3 engine can walk its units in any order,
// or materialize only some of them, and get the parameters eager construction would have. This
// is why the order is not simply "named_modules() order": a model that registers its blocks
// after its head (examples/models.h's Gpt fills its ModuleList last) draws in a different order
// from the one named_modules() lists. An explicit generator (gen != nullptr) is not replayed:
// values are drawn from it in call order.
//
// What a deferred tensor supports: metadata (sizes, dtype, device, requires_grad, names),
// Module::to() (changes the metadata, allocates nothing), load_state_dict() (allocates the
// loaded parameters and copies the values in, no initialiser runs). Reading it (forward,
// state_dict, save) throws ValueError.

// Note [deferred parts]
// Tensor parallelism cuts a parameter before it has values (parallel/tensor_parallel.cc): the
// parameter becomes a deferred tensor of its shard's shape, and its module records the full shape
// and the cut. materialize_own_parameters then gives the parameter a full-shape buffer for the
// replayed reset_parameters (which sees the full fans and draws the full stream, so the values
// are eager construction's), keeps the cut and frees the rest. The peak is one module's full
// parameters. stream_own_parameters (Note [streamed materialization]) keeps only the part
// without ever holding the module whole; the engines use it (parallel/materialize.h). An
// allocated parameter keeps its part record (its initialiser's full shape) but is not
// re-initialised.

DeferredInit::DeferredInit() { ++g_deferred_depth; }
DeferredInit::~DeferredInit() { --g_deferred_depth; }
bool DeferredInit::active() { return g_deferred_depth > 0; }

bool is_deferred(const Tensor& t) {
  if (!t.defined() || t.storage()->allocated()) return false;
  // A reset_parameters that asks acts on values (Embedding's padding row): Note [value sinks].
  init::SinkScope::note_value_needed(t);
  return true;
}

Tensor deferred_tensor(const Shape& shape, DType dtype, Device device) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  auto storage =
      make_intrusive<Storage>(size_t(n) * dtype_size(dtype), device, Storage::Unallocated{});
  return Tensor(
      make_intrusive<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

void Module::set_deferred_part(const std::string& name, Shape full_shape, PartCut cut) {
  auto it =
      std::find_if(params_.begin(), params_.end(), [&](const auto& e) { return e.first == name; });
  ACCEL_CHECK(it != params_.end() && (is_deferred(it->second) || it->second.numel() == 0) && cut,
              ValueError, "Module.set_deferred_part", type_name(), ": '", name,
              "' is not a deferred parameter of its own");
  deferred_parts_[name] = {std::move(full_shape), std::move(cut)};
}

const std::pair<Shape, Module::PartCut>* Module::deferred_part(const std::string& name) const {
  auto it = deferred_parts_.find(name);
  return it == deferred_parts_.end() ? nullptr : &it->second;
}

bool is_deferred(const Module& m, bool recurse) {
  for (const auto& [n, p] : m.named_parameters(recurse)) {
    if (is_deferred(p)) return true;
  }
  return false;
}

void Module::reset_parameters(Generator*) {
  auto own = std::find_if(params_.begin(), params_.end(),
                          [](const auto& e) { return e.second.defined(); });
  ACCEL_CHECK(own == params_.end(), ValueError, "Module.reset_parameters", type_name(),
              " registers parameter '", own->first,
              "' but does not override reset_parameters(Generator*), so it cannot be "
              "initialised after deferred construction (nn::DeferredInit / nn::materialize): "
              "override it with the constructor's initialisation");
}

// reset_parameters(gen); with gen == nullptr from the default generator's state at construction
// (deferred_rng_state_), the current state put back afterwards (Note [deferred init]).
void Module::replay_reset_parameters(Generator* gen) {
  if (gen != nullptr || deferred_rng_state_.empty()) {
    reset_parameters(gen);
    return;
  }
  Generator& g = default_generator();
  std::string now;
  {
    std::lock_guard<std::mutex> lk(g.mutex());
    now = g.state();
    g.set_state(deferred_rng_state_);
  }
  auto put_back = [&] {
    std::lock_guard<std::mutex> lk(g.mutex());
    g.set_state(now);
  };
  try {
    reset_parameters(nullptr);
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
}

bool Module::materialize_own_parameters(Generator* gen) {
  std::vector<Tensor> deferred, kept;
  std::vector<const std::pair<Shape, PartCut>*> parts;  // per deferred: Note [deferred parts]
  for (const auto& [n, p] : params_) {
    if (!p.defined()) continue;  // None
    // Note [tied parameters]: a borrowed parameter is its owner's to initialise; deferred, the
    // initialisers below leave it alone; allocated, it is kept.
    const bool borrowed = std::find(borrowed_.begin(), borrowed_.end(), n) != borrowed_.end();
    if (borrowed && is_deferred(p)) continue;
    // A part may be empty (a tensor-parallel rank without heads): still drawn for in full.
    // A part record outlives streaming (Note [streamed materialization]): an allocated
    // parameter is deferred no more, unless it is an empty part.
    auto part = deferred_parts_.find(n);
    if ((is_deferred(p) || (part != deferred_parts_.end() && p.numel() == 0)) && !borrowed) {
      deferred.push_back(p);
      parts.push_back(part == deferred_parts_.end() ? nullptr : &part->second);
    } else {
      kept.push_back(p);
    }
  }
  if (deferred.empty()) return false;
  NoGradGuard no_grad;
  // reset_parameters() re-initialises every own parameter; those that already had values keep
  // them.
  std::vector<Tensor> saved;
  for (const Tensor& p : kept) saved.push_back(p.clone());
  std::vector<Shape> part_shapes(deferred.size());
  for (size_t i = 0; i < deferred.size(); ++i) {
    Tensor& p = deferred[i];
    if (parts[i]) {  // the full tensor for the initialiser; the part is cut after
      part_shapes[i] = p.sizes();
      assign_tensor_data(p, zeros(parts[i]->first, TensorOptions(p.dtype(), p.device())));
      continue;
    }
    p.storage()->materialize();
    p.zero_();  // never garbage, even if an override forgets a parameter
  }
  try {
    replay_reset_parameters(gen);
  } catch (...) {
    for (size_t i = 0; i < deferred.size(); ++i) {
      if (parts[i]) {
        assign_tensor_data(deferred[i], deferred_tensor(part_shapes[i], deferred[i].dtype(),
                                                        deferred[i].device()));
      } else {
        deferred[i].storage()->release();
      }
    }
    throw;
  }
  for (size_t i = 0; i < deferred.size(); ++i) {
    if (!parts[i]) continue;
    Tensor part = parts[i]->second(deferred[i].detach()).contiguous().clone();
    ACCEL_CHECK(part.sizes() == part_shapes[i], ShapeError, "Module.materialize", type_name(),
                ": a deferred part of shape ", part_shapes[i], " was cut as ", part.sizes());
    assign_tensor_data(deferred[i], part);
  }
  deferred_parts_.clear();
  for (size_t i = 0; i < kept.size(); ++i) kept[i].copy_(saved[i]);
  return true;
}

// Note [streamed materialization]
// Note [deferred parts] holds one module's full parameters at a time; a model whose single layer
// is large (an embedding, a wide MLP) or a ZeRO-3 unit that is a whole block would still be held
// whole on every rank. stream_own_parameters replays reset_parameters with each wanted
// parameter a full-shape tensor without memory bound to the caller's sink (Note [value sinks]
// in nn/init.cc): the elementwise initialisers stream the full value in chunks and the caller
// keeps its region (parallel/materialize.h: the tp piece, or the flat range of a ZeRO-3 shard).
// Peak: what the caller keeps plus a chunk. When something cannot stream (orthogonal_, eye_, an
// initialiser on part of a tensor, a reset that asks is_deferred and would write values, or one
// that throws on a tensor without memory) the streamed values are dropped and the module is
// replayed into full-shape buffers once, each handed to its sink whole (peak: one module, as
// Note [deferred parts]). Both replays start from the same generator state, so the values are
// eager construction's bit for bit either way.
std::vector<std::string> Module::stream_own_parameters(const SinkFor& sink_for, Generator* gen) {
  struct Own {
    std::string name;
    Tensor p;
    Shape local, full;
    init::ValueSink sink;
    Tensor values;  // an allocated part's own data, put back afterwards
  };
  std::vector<Own> own;
  std::vector<Tensor> kept;
  for (const auto& [n, p] : params_) {
    if (!p.defined()) continue;
    const bool borrowed = std::find(borrowed_.begin(), borrowed_.end(), n) != borrowed_.end();
    if (borrowed && is_deferred(p)) continue;  // Note [tied parameters]: the owner's
    auto part = deferred_parts_.find(n);
    if ((is_deferred(p) || (part != deferred_parts_.end() && p.numel() == 0)) && !borrowed) {
      own.push_back({n,
                     p,
                     p.sizes(),
                     part == deferred_parts_.end() ? p.sizes() : part->second.first,
                     {},
                     {}});
    } else if (part != deferred_parts_.end() && !borrowed) {
      // A part given its values already (streamed before): its initialiser still sees the full
      // shape (a sibling's fan may read it), and it keeps its values.
      own.push_back({n, p, p.sizes(), part->second.first, {}, p.detach()});
    } else {
      kept.push_back(p);
    }
  }
  std::vector<std::string> streamed;
  for (Own& o : own) {
    if (o.values.defined()) continue;
    o.sink = sink_for(o.name, o.p, o.full);
    if (o.sink) streamed.push_back(o.name);
  }
  if (streamed.empty()) return streamed;
  NoGradGuard no_grad;
  std::vector<Tensor> saved;
  for (const Tensor& p : kept) saved.push_back(p.clone());
  auto restore = [&] {
    for (Own& o : own)
      assign_tensor_data(
          o.p, o.values.defined() ? o.values : deferred_tensor(o.local, o.p.dtype(), o.p.device()));
    for (size_t i = 0; i < kept.size(); ++i) kept[i].copy_(saved[i]);
  };
  // The streamed replay: every own deferred parameter in its full shape (the fans), without
  // memory; the wanted ones bound to their sinks.
  // The generator a second replay must start again from when the first does not restore it: an
  // explicit one, or the default one of a module without a construction snapshot.
  Generator* redraw = gen ? gen : deferred_rng_state_.empty() ? &default_generator() : nullptr;
  std::string redraw_state;
  if (redraw) {
    std::lock_guard<std::mutex> lk(redraw->mutex());
    redraw_state = redraw->state();
  }
  bool whole = false;
  {
    std::vector<std::pair<Tensor, init::ValueSink>> bound;
    for (Own& o : own) {
      assign_tensor_data(o.p, deferred_tensor(o.full, o.p.dtype(), o.p.device()));
      if (o.sink && o.p.numel() > 0) bound.emplace_back(o.p, o.sink);
    }
    try {
      init::SinkScope scope(std::move(bound));
      replay_reset_parameters(gen);
      whole = scope.needs_whole();
    } catch (...) {
      whole = true;  // touched a tensor without memory: the whole replay below says what is wrong
    }
  }
  if (whole) {
    if (redraw) {
      std::lock_guard<std::mutex> lk(redraw->mutex());
      redraw->set_state(redraw_state);
    }
    try {
      for (Own& o : own)
        assign_tensor_data(o.p, zeros(o.full, TensorOptions(o.p.dtype(), o.p.device())));
      replay_reset_parameters(gen);
      for (Own& o : own)
        if (o.sink && o.p.numel() > 0) o.sink(0, o.p.detach().reshape({o.p.numel()}).to(kCPU));
    } catch (...) {
      restore();
      throw;
    }
  }
  restore();
  return streamed;
}

bool reset_module_parameters(Module& m, Generator* gen) {
  return m.materialize_own_parameters(gen);
}

void materialize(Module& m, const ModuleFilter& filter, Generator* gen) {
  for (auto& [name, mod] : m.named_modules()) {
    if (filter && !filter(name, *mod)) continue;
    mod->materialize_own_parameters(gen);
  }
}

}  // namespace accel::nn
