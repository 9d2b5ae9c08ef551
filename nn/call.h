// The type-erased form of a module call (Note [module calls] in nn/module.h): the
// arguments as a list of nn::Value (a tensor, possibly undefined for None, a bool, an integer or
// a double), the results as a flat list of tensors, and the traits that convert typed
// arguments and results to and from them.
//
//   arguments  Tensor, std::optional<Tensor> (nullopt <-> undefined tensor), std::nullopt,
//              bool, integers (int64), floating point numbers (double)
//   results    Tensor, std::optional<Tensor>, std::tuple / std::pair of results, a struct of
//              results (an aggregate, flattened field by field, at most kMaxOutputFields
//              fields; or any class with `auto fields() { return std::tie(a, b, c); }`), and,
//              as the whole result only, std::vector<Tensor>
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace accel::nn {

// One argument of a type-erased module call.
class Value {
 public:
  enum class Kind : uint8_t { Tensor, Bool, Int, Double };
  Value() = default;  // an undefined tensor (None)
  static Value from_tensor(Tensor t) {
    Value v;
    v.t_ = std::move(t);
    return v;
  }
  static Value from_bool(bool b) {
    Value v;
    v.kind_ = Kind::Bool;
    v.i_ = b;
    return v;
  }
  static Value from_int(int64_t i) {
    Value v;
    v.kind_ = Kind::Int;
    v.i_ = i;
    return v;
  }
  static Value from_double(double d) {
    Value v;
    v.kind_ = Kind::Double;
    v.d_ = d;
    return v;
  }
  Kind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }
  // The tensor (undefined for None); only for Kind::Tensor.
  const Tensor& tensor() const { return t_; }
  Tensor& tensor() { return t_; }
  bool to_bool() const { return i_ != 0; }
  int64_t to_int() const { return i_; }
  double to_double() const { return kind_ == Kind::Int ? double(i_) : d_; }
  // "Tensor", "None", "bool", "int64", "double": for error messages.
  const char* type_name() const;

 private:
  Kind kind_ = Kind::Tensor;
  Tensor t_;
  int64_t i_ = 0;
  double d_ = 0;
};
using Values = std::vector<Value>;

// "(Tensor, None, bool)": the kinds of `values`, for error messages.
std::string describe_values(const Values& values);

namespace call_detail {

template <typename T>
inline constexpr bool always_false = false;

template <typename T>
struct is_optional_tensor : std::false_type {};
template <>
struct is_optional_tensor<std::optional<Tensor>> : std::true_type {};

// ---- arguments ----

// Arg<T>: T (decayed) <-> Value. `name` spells T in signatures.
template <typename T, typename = void>
struct Arg {
  static_assert(always_false<T>,
                "nn module call: an argument must be Tensor, std::optional<Tensor>, bool, an "
                "integer or a floating point number (Note [module calls])");
};
template <>
struct Arg<Tensor> {
  static constexpr const char* name = "Tensor";
  static Value to(const Tensor& t) { return Value::from_tensor(t); }
  static bool accepts(const Value& v) { return v.is_tensor(); }
  static Tensor from(const Value& v) { return v.tensor(); }
};
// A tensor member (nn::Parameter, nn::Buffer) travels as the tensor it is.
template <typename T>
struct Arg<T, std::enable_if_t<std::is_base_of_v<Tensor, T> && !std::is_same_v<T, Tensor>>>
    : Arg<Tensor> {};
template <>
struct Arg<std::optional<Tensor>> {
  static constexpr const char* name = "optional<Tensor>";
  static Value to(const std::optional<Tensor>& t) { return Value::from_tensor(t ? *t : Tensor()); }
  static bool accepts(const Value& v) { return v.is_tensor(); }
  static std::optional<Tensor> from(const Value& v) {
    if (!v.tensor().defined()) return std::nullopt;
    return v.tensor();
  }
};
template <>
struct Arg<bool> {
  static constexpr const char* name = "bool";
  static Value to(bool b) { return Value::from_bool(b); }
  static bool accepts(const Value& v) { return v.kind() == Value::Kind::Bool; }
  static bool from(const Value& v) { return v.to_bool(); }
};
template <typename T>
struct Arg<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static constexpr const char* name = "int64";
  static Value to(T i) { return Value::from_int(int64_t(i)); }
  static bool accepts(const Value& v) { return v.kind() == Value::Kind::Int; }
  static T from(const Value& v) { return T(v.to_int()); }
};
template <typename T>
struct Arg<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static constexpr const char* name = "double";
  static Value to(T d) { return Value::from_double(double(d)); }
  // An integer where a double is expected converts, as Python's int does.
  static bool accepts(const Value& v) {
    return v.kind() == Value::Kind::Double || v.kind() == Value::Kind::Int;
  }
  static T from(const Value& v) { return T(v.to_double()); }
};

// The type an argument of type A travels as: its decayed type, with std::nullopt carried as an
// empty std::optional<Tensor>.
template <typename A>
using Carrier = std::conditional_t<
    std::is_same_v<std::decay_t<A>, std::nullopt_t>, std::optional<Tensor>,
    std::conditional_t<std::is_base_of_v<Tensor, std::decay_t<A>>, Tensor, std::decay_t<A>>>;

template <typename A>
Value to_value(const A& a) {
  if constexpr (std::is_same_v<std::decay_t<A>, std::nullopt_t>) {
    return Value();
  } else {
    return Arg<std::decay_t<A>>::to(a);
  }
}

template <typename... A>
Values pack(const A&... a) {
  Values v;
  v.reserve(sizeof...(A));
  (v.push_back(to_value(a)), ...);
  return v;
}

// ---- results ----

inline constexpr size_t kDynamic = size_t(-1);

template <typename T>
struct is_tuple_like : std::false_type {};
template <typename... T>
struct is_tuple_like<std::tuple<T...>> : std::true_type {};
template <typename A, typename B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};

template <typename T>
concept HasFields = requires(T& t) {
  t.fields();
};

template <typename T>
struct is_std_optional : std::false_type {};
template <typename T>
struct is_std_optional<std::optional<T>> : std::true_type {};

// Converts to anything: counts the fields of an aggregate by brace-initialising it. Not to an
// optional directly: std::optional's converting constructor takes it through the conversion to
// the value type, and offering both would make an optional field ambiguous.
struct AnyField {
  template <typename T>
  requires(!is_std_optional<T>::value) operator T()
      const;  // declared only: used in unevaluated contexts
};

template <typename T, size_t... I>
constexpr bool brace_init_with(std::index_sequence<I...>) {
  return requires { T{(void(I), AnyField{})...}; };
}

inline constexpr size_t kMaxOutputFields = 16;

template <typename T, size_t N = kMaxOutputFields>
constexpr size_t field_count() {
  if constexpr (N == 0) {
    return 0;
  } else if constexpr (brace_init_with<T>(std::make_index_sequence<N>{})) {
    return N;
  } else {
    return field_count<T, N - 1>();
  }
}

template <typename T>
constexpr bool is_reflectable_aggregate() {
  return std::is_aggregate_v<T> && !std::is_array_v<T> && !is_tuple_like<T>::value &&
         field_count<T>() > 0;
}

// A tuple of references to the fields of an aggregate (up to kMaxOutputFields), or fields().
template <typename T>
auto tie_fields(T& s) {
  using U = std::remove_const_t<T>;
  if constexpr (HasFields<T>) {
    return s.fields();
  } else {
    constexpr size_t n = field_count<U>();
    // clang-format off: one structured binding per field count
    if constexpr (n == 1) {
      auto& [a] = s;
      return std::tie(a);
    } else if constexpr (n == 2) {
      auto& [a, b] = s;
      return std::tie(a, b);
    } else if constexpr (n == 3) {
      auto& [a, b, c] = s;
      return std::tie(a, b, c);
    } else if constexpr (n == 4) {
      auto& [a, b, c, d] = s;
      return std::tie(a, b, c, d);
    } else if constexpr (n == 5) {
      auto& [a, b, c, d, e] = s;
      return std::tie(a, b, c, d, e);
    } else if constexpr (n == 6) {
      auto& [a, b, c, d, e, f] = s;
      return std::tie(a, b, c, d, e, f);
    } else if constexpr (n == 7) {
      auto& [a, b, c, d, e, f, g] = s;
      return std::tie(a, b, c, d, e, f, g);
    } else if constexpr (n == 8) {
      auto& [a, b, c, d, e, f, g, h] = s;
      return std::tie(a, b, c, d, e, f, g, h);
    } else if constexpr (n == 9) {
      auto& [a, b, c, d, e, f, g, h, i] = s;
      return std::tie(a, b, c, d, e, f, g, h, i);
    } else if constexpr (n == 10) {
      auto& [a, b, c, d, e, f, g, h, i, j] = s;
      return std::tie(a, b, c, d, e, f, g, h, i, j);
    } else if constexpr (n == 11) {
      auto& [a, b, c, d, e, f, g, h, i, j, k] = s;
      return std::tie(a, b, c, d, e, f, g, h, i, j, k);
    } else if constexpr (n == 12) {
      auto& [a, b, c, d, e, f, g, h, i, j, k, l] = s;
      return std::tie(a, b, c, d, e, f, g, h, i, j, k, l);
    } else if constexpr (n == 13) {
      auto& [a, b, c, d, e, f, g, h, i, j, k, l, m] = s;
      return std::tie(a, b, c, d, e, f, g, h, i, j, k, l, m);
    } else if constexpr (n == 14) {
      auto& [a, b, c, d, e, f, g, h, i, j, k, l, m, o] = s;
      return std::tie(a, b, c, d, e, f, g, h, i, j, k, l, m, o);
    } else if constexpr (n == 15) {
      auto& [a, b, c, d, e, f, g, h, i, j, k, l, m, o, p] = s;
      return std::tie(a, b, c, d, e, f, g, h, i, j, k, l, m, o, p);
    } else {
      static_assert(n == 16);
      auto& [a, b, c, d, e, f, g, h, i, j, k, l, m, o, p, q] = s;
      return std::tie(a, b, c, d, e, f, g, h, i, j, k, l, m, o, p, q);
    }
    // clang-format on
  }
}

template <typename R, typename = void>
struct Out {
  static_assert(always_false<R>,
                "nn module call: a result must be Tensor, std::optional<Tensor>, a tuple or pair "
                "of results, an aggregate struct of results (at most 16 fields), a class with "
                "fields() returning std::tie of its results, or std::vector<Tensor> "
                "(Note [module calls])");
};

template <>
struct Out<Tensor> {
  static constexpr size_t count = 1;
  static void flatten(const Tensor& t, std::vector<Tensor>& out) { out.push_back(t); }
  static Tensor unflatten(const Tensor*& it) { return *it++; }
};
template <>
struct Out<std::optional<Tensor>> {
  static constexpr size_t count = 1;
  static void flatten(const std::optional<Tensor>& t, std::vector<Tensor>& out) {
    out.push_back(t ? *t : Tensor());
  }
  static std::optional<Tensor> unflatten(const Tensor*& it) {
    const Tensor& t = *it++;
    if (!t.defined()) return std::nullopt;
    return t;
  }
};
template <>
struct Out<std::vector<Tensor>> {
  static constexpr size_t count = kDynamic;
  static void flatten(const std::vector<Tensor>& v, std::vector<Tensor>& out) {
    out.insert(out.end(), v.begin(), v.end());
  }
};

template <typename... T>
constexpr size_t sum_counts() {
  size_t n = 0;
  for (size_t c : {size_t(0), Out<std::decay_t<T>>::count...}) {
    if (c == kDynamic) return kDynamic;
    n += c;
  }
  return n;
}

template <typename Tup>
struct TupleOut;
template <template <typename...> class Tp, typename... T>
struct TupleOut<Tp<T...>> {
  static constexpr size_t count = sum_counts<T...>();
  static_assert(count != kDynamic,
                "nn module call: std::vector<Tensor> can only be the whole result");
  template <typename Tuple>
  static void flatten(const Tuple& t, std::vector<Tensor>& out) {
    std::apply([&](const auto&... e) { (Out<std::decay_t<decltype(e)>>::flatten(e, out), ...); },
               t);
  }
  static Tp<T...> unflatten(const Tensor*& it) {
    // Braced initialisation evaluates left to right.
    return Tp<T...>{Out<std::decay_t<T>>::unflatten(it)...};
  }
};

template <typename R>
struct Out<R, std::enable_if_t<is_tuple_like<R>::value>> : TupleOut<R> {};

template <typename R>
constexpr bool is_struct_result() {
  if constexpr (is_tuple_like<R>::value || std::is_same_v<R, Tensor> ||
                is_optional_tensor<R>::value || std::is_same_v<R, std::vector<Tensor>>) {
    return false;
  } else if constexpr (HasFields<R>) {
    return true;
  } else if constexpr (std::is_class_v<R>) {
    return is_reflectable_aggregate<R>();
  } else {
    return false;
  }
}

template <typename R>
struct Out<R, std::enable_if_t<is_struct_result<R>()>> {
  using Tie = decltype(tie_fields(std::declval<R&>()));
  template <typename Tuple>
  struct Count;
  template <typename... F>
  struct Count<std::tuple<F...>> {
    static constexpr size_t value = sum_counts<F...>();
  };
  static constexpr size_t count = Count<Tie>::value;
  static_assert(count != kDynamic,
                "nn module call: std::vector<Tensor> can only be the whole result");
  static void flatten(const R& r, std::vector<Tensor>& out) {
    R& m = const_cast<R&>(r);  // tie_fields takes a mutable struct; nothing is written
    std::apply([&](auto&... f) { (Out<std::decay_t<decltype(f)>>::flatten(f, out), ...); },
               tie_fields(m));
  }
  static R unflatten(const Tensor*& it) {
    R r{};
    std::apply([&](auto&... f) { ((f = Out<std::decay_t<decltype(f)>>::unflatten(it)), ...); },
               tie_fields(r));
    return r;
  }
};

template <typename R>
std::vector<Tensor> flatten(const R& r) {
  std::vector<Tensor> out;
  if constexpr (Out<R>::count != kDynamic) out.reserve(Out<R>::count);
  Out<R>::flatten(r, out);
  return out;
}

// Demangled type name without namespaces ("VaeOut", "tuple<Tensor, Tensor>").
std::string type_name_of(const std::type_info& t);

// ValueError: `who` returned n tensors where the result type wants another count.
[[noreturn]] void throw_result_count(const std::string& who, size_t got, size_t want,
                                     const std::type_info& result);

// `who()` names the callee for the error; it is only called on failure (no string building on
// success).
template <typename R, typename Who>
R unflatten(std::vector<Tensor>&& ts, const Who& who) {
  if constexpr (std::is_same_v<R, std::vector<Tensor>>) {
    return std::move(ts);
  } else {
    if (ts.size() != Out<R>::count) throw_result_count(who(), ts.size(), Out<R>::count, typeid(R));
    const Tensor* it = ts.data();
    return Out<R>::unflatten(it);
  }
}

// ---- typed forward signatures ----

template <typename F>
struct ForwardTraits;
template <typename C, typename R, typename... P>
struct ForwardTraits<R (C::*)(P...)> {
  using Result = R;
  using Params = std::tuple<std::decay_t<P>...>;
  static constexpr size_t arity = sizeof...(P);
};
template <typename C, typename R, typename... P>
struct ForwardTraits<R (C::*)(P...) const> : ForwardTraits<R (C::*)(P...)> {};

// "forward(Tensor, optional<Tensor>) -> VaeOut".
template <typename R, typename... P>
std::string forward_signature(std::tuple<P...>*) {
  std::string s = "forward(";
  bool first = true;
  ((s += (first ? "" : ", "), s += Arg<P>::name, first = false), ...);
  return s + ") -> " + type_name_of(typeid(R));
}

}  // namespace call_detail
}  // namespace accel::nn
