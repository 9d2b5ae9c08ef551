#include "parallel/materialize.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "nn/init.h"

namespace accel::dist {

// Note [deferred regions]
// Issue 37: a model twice the size one rank holds trains at tp 2 x shard 2, so no rank may hold
// the whole model, a whole unit or even a whole large module while preparing it. The last step
// that changes a parameter's region materialises it: parallelize (tp) only records each piece's
// Region (RegionCut, allocating nothing); then ZeRO-3 streams each unit's flat range of this
// rank straight into its shard (FullyShardedModel::init_values), or materialize_local gives each
// parameter its tp piece (DDP, ZeRO-1/2, no data parallelism). Both go through
// materialize_regions: the module's reset_parameters is replayed from its construction-time
// generator state with each parameter bound to a sink that keeps the region's elements of the
// streamed full value (Note [streamed materialization] in nn/module_deferred.cc). Every rank
// draws every value (CPU time, a few ns per element) but stores only its own; the values equal
// eager construction's bit for bit, which every "equals one process" test rests on. Because
// nothing is broadcast, check_deferred_agreement compares the ranks' generator states first.

namespace {

// Keeps the elements of `region` of a streamed full value in `dst` (Note [value sinks] in
// nn/init.cc): per chunk the runs it overlaps, which are consecutive in the piece's order (a
// Region's runs are dense in local offsets), so one copy per chunk.
nn::init::ValueSink region_sink(const Region& region, const Tensor& dst) {
  auto runs = std::make_shared<const std::vector<Run>>(region.runs());
  Tensor flat = dst.view({dst.numel()});
  return [runs, flat](int64_t off, const Tensor& values) {
    const int64_t end = off + values.numel();
    auto it = std::partition_point(runs->begin(), runs->end(),
                                   [&](const Run& r) { return r.global + r.n <= off; });
    if (it == runs->end() || it->global >= end) return;
    const Tensor v = values.dtype() == flat.dtype() ? values : values.to(flat.dtype());
    const size_t es = v.element_size();
    const char* src = static_cast<const char*>(v.data_ptr());
    const int64_t first = it->local + (std::max(off, it->global) - it->global);
    const bool direct = flat.device() == kCPU;
    Tensor staging;
    if (!direct) {
      int64_t n = 0;
      for (auto r = it; r != runs->end() && r->global < end; ++r)
        n += std::min(end, r->global + r->n) - std::max(off, r->global);
      staging = empty({n}, TensorOptions(flat.dtype()));
    }
    char* out = static_cast<char*>(direct ? flat.data_ptr() : staging.data_ptr());
    int64_t at = direct ? first : 0;
    for (; it != runs->end() && it->global < end; ++it) {
      const int64_t s = std::max(off, it->global), e = std::min(end, it->global + it->n);
      std::memcpy(out + at * int64_t(es), src + (s - off) * int64_t(es), size_t(e - s) * es);
      at += e - s;
    }
    if (!direct) flat.narrow(0, first, staging.numel()).copy_(staging);
  };
}

}  // namespace

Tensor RegionCut::operator()(const Tensor& full) const {
  ACCEL_CHECK(full.sizes() == region.global_shape(), ShapeError, "materialize",
              "a deferred part of the full shape ", region.global_shape(), " was drawn as ",
              full.sizes());
  NoGradGuard no_grad;
  Tensor out = empty(region.local_shape(), TensorOptions(full.dtype(), full.device()));
  const Tensor src = full.contiguous().view({full.numel()});
  Tensor o = out.view({out.numel()});
  region.for_each_run(
      [&](const Run& r) { o.narrow(0, r.local, r.n).copy_(src.narrow(0, r.global, r.n)); });
  return out;
}

std::vector<std::string> materialize_regions(nn::Module& m, const TargetFor& target_for,
                                             Generator* gen) {
  for (auto& [name, p] : m.named_parameters(false)) {
    const auto* part = m.deferred_part(name);
    if (part && part->second.target<RegionCut>() == nullptr) {  // cut some other way
      m.materialize_own_parameters(gen);
      return {};
    }
  }
  NoGradGuard no_grad;
  return m.stream_own_parameters(
      [&](const std::string& name, const Tensor& p, const Shape& full) -> nn::init::ValueSink {
        const auto* part = m.deferred_part(name);
        const Region local = part ? part->second.target<RegionCut>()->region : Region::whole(full);
        std::optional<RegionTarget> t = target_for(name, p, local);
        if (!t) return {};
        ACCEL_CHECK(t->region.global_shape() == full, ShapeError, "materialize", m.type_name(),
                    ": a region of ", t->region.global_shape(), " for parameter '", name,
                    "', whose initial value is of shape ", full);
        ACCEL_CHECK(
            t->dst.defined() && t->dst.is_contiguous() && t->dst.numel() == t->region.numel(),
            ShapeError, "materialize", m.type_name(), ": parameter '", name,
            "': the destination of a region of ", t->region.numel(),
            " elements must be contiguous and as large, got ",
            t->dst.defined() ? t->dst.sizes() : Shape{});
        return region_sink(t->region, t->dst);
      },
      gen);
}

void materialize_local(nn::Module& model, Generator* gen) {
  NoGradGuard no_grad;
  for (auto& [mname, m] : model.named_modules()) {
    std::vector<std::pair<std::string, Tensor>> kept;
    const std::vector<std::string> names = materialize_regions(
        *m,
        [&](const std::string& name, const Tensor& p,
            const Region& local) -> std::optional<RegionTarget> {
          // Zeros: never garbage, even if a reset_parameters leaves a parameter alone.
          Tensor dst = zeros(local.local_shape(), TensorOptions(p.dtype(), p.device()));
          kept.emplace_back(name, dst);
          return RegionTarget{local, dst};
        },
        gen);
    for (auto& [name, p] : m->named_parameters(false))
      for (auto& [kname, value] : kept)
        if (kname == name && std::find(names.begin(), names.end(), name) != names.end())
          nn::assign_tensor_data(p, value);
  }
}

void check_deferred_agreement(nn::Module& model, ProcessGroup& group, const char* op) {
  if (group.size() == 1) return;
  std::vector<std::string> names;
  std::vector<double> hashes;
  for (auto& [name, m] : model.named_modules()) {
    const std::string& state = m->deferred_rng_state();
    names.push_back(name);
    // 53 bits: exact in a double; 0 for a module built eagerly.
    hashes.push_back(state.empty() ? 0.0 : double(std::hash<std::string>{}(state) >> 11));
  }
  Device dev = kCPU;
  for (const Tensor& p : model.parameters()) dev = p.device();
  Tensor lo = tensor(hashes, {int64_t(hashes.size())}, TensorOptions(kFloat64)).to(dev);
  Tensor hi = lo.clone();
  group.all_reduce(lo, ReduceOp::Min);
  group.all_reduce(hi, ReduceOp::Max);
  lo = lo.to(kCPU);
  hi = hi.to(kCPU);
  for (size_t i = 0; i < names.size(); ++i) {
    ACCEL_CHECK(lo.data<double>()[i] == hi.data<double>()[i], ValueError, op, "module '",
                names[i].empty() ? model.type_name() : names[i],
                "' was built under nn::DeferredInit from differing default generator states on "
                "the ranks of a group of ",
                group.size(),
                ": its values are drawn on each rank without a broadcast, so every rank must build "
                "the model from one seed (manual_seed, or Accelerator::set_seed without "
                "device_specific, before building it)");
  }
}

}  // namespace accel::dist
