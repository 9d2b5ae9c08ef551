// The two spellings of an options struct (Note [options structs]) and ACCEL_OPTION, which gives
// an options class libtorch's getter / setter pair for one field.
#pragma once

#include <concepts>
#include <utility>

// Note [options structs]
// libtorch spells keyword arguments with an options class: a constructor taking the required
// arguments and one chainable setter per field, each also a getter:
//
//     optim::SGD opt(params, optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
//     nn::Conv2d conv(nn::Conv2dOptions(1, 64, 5).stride(2).bias(false));
//     double lr = opt.options().lr();
//
// accel code (and C++20) also spells them as designated initializers:
//
//     optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//
// One type cannot carry both: `.momentum(0.9)` needs a member function named momentum,
// `{.momentum = 0.9}` a public data member of that name, and C++ does not let a class declare
// both; a class with a constructor (SGDOptions(0.1)) is not an aggregate, and only an aggregate
// takes a designated initializer. So every options struct is two types:
//
//   - `XFields`, an aggregate of the fields with their defaults (torch's), in torch's order;
//     `XOptions::Fields` names it too;
//   - `XOptions`, derived from it: libtorch's constructor (the required arguments, positional)
//     and one ACCEL_OPTION per field. Its member functions hide the inherited data members of the
//     same name, so `XOptions` reads as libtorch's class; it adds no data.
//
// What takes options (an optimizer, a module) takes `const XFields&`: a braced designated list
// initialises the aggregate there, and an `XOptions` binds to it as its base (no conversion, no
// copy), so both spellings reach one constructor with no overload to be ambiguous (`{}` included).
// What keeps options (`opt.options()`) keeps an `XOptions`, so reading them is libtorch's
// `options().lr()`. The fields' defaults are written once, in `XFields`; the constructor of
// `XOptions` assigns only the arguments it takes. `XOptions` is made from an `XFields` by a
// constructor that takes exactly that type (ACCEL_OPTIONS_FROM_FIELDS), never from a braced
// list: `MaxPool2dOptions({2, 2})` must mean the kernel size, not an aggregate of two fields.
// For the same reason the pooling modules, whose positional constructor starts with a size,
// take `const MaxPool2dOptions&` (libtorch's class) rather than the aggregate, and a
// std::initializer_list, so that `MaxPool2d({2, 2})` is the kernel size (without it, {2, 2} also
// reads as (kernel 2, stride 2) and the call is ambiguous). The designated spelling reaches them
// through the class, `MaxPool2d(MaxPool2dOptions(MaxPool2dFields{.kernel_size = 2}))`: beside
// an initializer_list constructor GCC 12 rejects every designated list as ambiguous.
//
// Not every struct named Options is one of these: the scheduler options (OneCycleOptions,
// ReduceLROnPlateauOptions) and those of data/, comm/, parallel/ and accelerate/
// (DataLoaderOptions, ...) stay aggregates: libtorch has no options class for them, or they are
// accel's own.

// Inside `struct XOptions : XFields { using Fields = XFields; ... }`: ACCEL_OPTIONS_FROM_FIELDS(
// XOptions) is the (implicit) constructor from an XFields; ACCEL_OPTION(name) gives `name(v)`,
// which sets the field and returns the options (chainable), and `name()`, which reads it (a
// reference: `o.name() = v` also sets).
#define ACCEL_OPTIONS_FROM_FIELDS(Self) \
  template <std::same_as<Fields> F>     \
  Self(const F& fields) : Fields(fields) {} /* NOLINT: implicit */

#define ACCEL_OPTION(name)                                            \
  auto& name(decltype(Fields::name) value) {                          \
    Fields::name = std::move(value);                                  \
    return *this;                                                     \
  }                                                                   \
  const decltype(Fields::name)& name() const { return Fields::name; } \
  decltype(Fields::name)& name() { return Fields::name; }
