// Module calls: the type-erased call, hooks and call wrappers (Note [module calls] in
// module.h).
#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <typeinfo>

#include "nn/module.h"
#include "nn/wrapper_label.h"

namespace accel::nn {

Tensor Module::forward(const Tensor&) {
  ACCEL_THROW(ValueError, "Module.forward", type_name(),
              " does not define a single-input forward(const Tensor&)");
}

// ---------------- calls (Note [module calls]) ----------------

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Tensor: return t_.defined() ? "Tensor" : "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int64";
    case Kind::Double: return "double";
  }
  return "?";
}

std::string describe_values(const Values& values) {
  std::string s = "(";
  for (size_t i = 0; i < values.size(); ++i)
    s += (i ? ", " : "") + std::string(values[i].type_name());
  return s + ")";
}

namespace call_detail {

std::string type_name_of(const std::type_info& t) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string name = (status == 0 && demangled) ? demangled : t.name();
  std::free(demangled);
  for (const std::string anon = "(anonymous namespace)::";;) {
    const size_t at = name.find(anon);
    if (at == std::string::npos) break;
    name.erase(at, anon.size());
  }
  // Drop every namespace qualifier ("accel::Tensor" -> "Tensor", "std::tuple<...>" ->
  // "tuple<...>"): a qualifier is an identifier followed by "::".
  std::string out;
  size_t word = 0;  // start of the current identifier in `out`
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == ':' && i + 1 < name.size() && name[i + 1] == ':') {
      out.erase(word);
      ++i;
      continue;
    }
    const char c = name[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) word = out.size() + 1;
    out += c;
  }
  // The allocator and other defaulted arguments stay; they rarely appear in results.
  return out;
}

void throw_result_count(const std::string& who, size_t got, size_t want,
                        const std::type_info& result) {
  ACCEL_THROW(ValueError, "Module.call", who, " returned ", got, " tensor(s); the result type ",
              type_name_of(result), " holds ", want);
}

}  // namespace call_detail

std::vector<Tensor> Module::forward_values(Values& in) {
  ACCEL_CHECK(in.size() == 1 && in[0].is_tensor(), ValueError, "Module.call", call_name(),
              ": called with ", describe_values(in));
  return {forward(in[0].tensor())};
}

Tensor Module::call_one(const Tensor& x) {
  Values in{Value::from_tensor(x)};
  std::vector<Tensor> out = run_call(in, [this](Values& v) { return forward_values(v); });
  if (out.size() != 1) call_detail::throw_result_count(call_name(), out.size(), 1, typeid(Tensor));
  return out[0];
}

std::vector<Tensor> Module::call_values(Values inputs) {
  if (!intercepted()) return forward_values(inputs);
  return run_call(inputs, [this](Values& v) { return forward_values(v); });
}

namespace {
// The tensor arguments of `in`, by position among the values.
std::vector<Tensor> tensor_args(const Values& in, std::vector<size_t>& where) {
  std::vector<Tensor> ts;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].is_tensor()) {
      where.push_back(i);
      ts.push_back(in[i].tensor());
    }
  return ts;
}
}  // namespace

std::vector<Tensor> Module::run_call(Values& inputs, CallFn body) {
  std::shared_ptr<CallHooks> h = calls_;  // alive even if a hook removes itself
  if (!h || !h->active()) return body(inputs);
  CallFn inner = [this, h, body = std::move(body)](Values& in) {
    // Copies: a hook may register or remove hooks.
    const auto pre = h->pre;
    const auto post = h->post;
    std::vector<size_t> where;
    std::vector<Tensor> args = tensor_args(in, where);
    for (const auto& [id, hook] : pre) {
      hook(*this, args);
      ACCEL_CHECK(args.size() == where.size(), ValueError, "Module.forward_pre_hook", call_name(),
                  ": a pre-hook changed the number of tensor arguments from ", where.size(), " to ",
                  args.size());
    }
    for (size_t j = 0; j < where.size(); ++j) in[where[j]].tensor() = args[j];
    // The forward runs inside this call (check_not_bypassed); also when a wrapper re-runs it
    // (activation checkpointing's recomputation in backward).
    struct Depth {
      int& d;
      explicit Depth(int& v) : d(++v) {}
      ~Depth() { --d; }
    } depth(h->depth);
    std::vector<Tensor> out = body(in);
    for (const auto& [id, hook] : post) {
      const size_t n = out.size();
      hook(*this, args, out);
      ACCEL_CHECK(out.size() == n, ValueError, "Module.forward_hook", call_name(),
                  ": a forward hook changed the number of result tensors from ", n, " to ",
                  out.size());
    }
    return out;
  };
  if (h->wrapper) {
    CallWrapper w = h->wrapper;
    return w(*this, inputs, inner);
  }
  return inner(inputs);
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  ACCEL_CHECK(bool(hook), ValueError, "Module.register_forward_pre_hook", type_name(),
              ": empty hook");
  if (!calls_) calls_ = std::make_shared<CallHooks>();
  const uint64_t id = calls_->next_id++;
  calls_->pre.emplace_back(id, std::move(hook));
  return HookHandle(calls_, id);
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  ACCEL_CHECK(bool(hook), ValueError, "Module.register_forward_hook", type_name(), ": empty hook");
  if (!calls_) calls_ = std::make_shared<CallHooks>();
  const uint64_t id = calls_->next_id++;
  calls_->post.emplace_back(id, std::move(hook));
  return HookHandle(calls_, id);
}

void HookHandle::remove() {
  std::shared_ptr<CallHooks> h = hooks_.lock();
  if (!h || id_ == 0) return;
  auto drop = [&](auto& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == id_; }),
            v.end());
  };
  drop(h->pre);
  drop(h->post);
  id_ = 0;
}

namespace {
// Wrapper labels by module (set_call_wrapper_label). A module destroyed while labelled leaves its
// entry until another module at its address gets a wrapper (set_call_wrapper erases it): only
// error messages read it, and only for a module whose wrapper is set.
std::mutex& label_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const Module*, std::string>& labels() {
  static std::unordered_map<const Module*, std::string> t;
  return t;
}
}  // namespace

void set_call_wrapper_label(const Module& module, std::string label) {
  std::lock_guard<std::mutex> lock(label_mutex());
  labels()[&module] = std::move(label);
}

std::string call_wrapper_label(const Module& module) {
  // The table is keyed by address: a module without a wrapper has no label, whatever a module
  // that lived at its address before left there.
  if (!module.has_call_wrapper()) return {};
  std::lock_guard<std::mutex> lock(label_mutex());
  const auto it = labels().find(&module);
  return it == labels().end() ? std::string() : it->second;
}

void Module::set_call_wrapper(CallWrapper wrapper) {
  if (!calls_) calls_ = std::make_shared<CallHooks>();
  ACCEL_CHECK(!wrapper || !calls_->wrapper, ValueError, "Module.set_call_wrapper", type_name(),
              " already has a call wrapper (is it a unit of another sharded model?)");
  calls_->wrapper = std::move(wrapper);
  std::lock_guard<std::mutex> lock(label_mutex());
  labels().erase(this);
}

void Module::wrap_call(CallWrapper outer) {
  ACCEL_CHECK(static_cast<bool>(outer), ValueError, "Module.wrap_call", type_name(),
              ": the wrapper is empty");
  if (!has_call_wrapper()) {
    set_call_wrapper(std::move(outer));
    return;
  }
  CallWrapper inner = calls_->wrapper;
  calls_->wrapper = [outer = std::move(outer), inner = std::move(inner)](Module& m, Values& inputs,
                                                                         const CallFn& call) {
    // By value: a wrapper may keep its CallFn past the call (activation checkpointing).
    const CallFn through_inner = [&m, inner, call](Values& in) { return inner(m, in, call); };
    return outer(m, inputs, through_inner);
  };
}

void Module::throw_bypassed() const {
  const std::string label = call_wrapper_label(*this);
  ACCEL_THROW(ValueError, "Module.forward", type_name(),
              "'s forward was called directly, but an engine wraps this module (",
              label.empty() ? std::string("a ZeRO-3 unit or a tensor-parallel layer") : label,
              "): forward() skips the wrapper's gathers and collectives, "
              "which would compute on this rank's shards without a word. Call the module "
              "instead: (*m)(x) or m->call<R>(args...)");
}

}  // namespace accel::nn
