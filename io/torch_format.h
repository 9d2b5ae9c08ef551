// Checkpoints in PyTorch's torch.save format (.pt / .pth), read and written without Python:
// state dicts, optimizer states and other trees of tensors, numbers and strings.
//
//   nn::TensorDict sd = io::load_pt("resnet18.pth");        // a state dict
//   model.load_state_dict(sd);                               // or model.load("resnet18.pth")
//   io::PtValue ckpt = io::read_pt("checkpoint.pt");        // {'model': ..., 'epoch': 3, ...}
//   model.load_state_dict(io::to_tensor_dict(ckpt.at("model")));
//   io::save_pt("out.pt", model.state_dict());             // torch.load("out.pt") reads it
//
// Reading accepts the zip layout torch.save writes since torch 1.6 and the legacy layout of
// _use_new_zipfile_serialization=False (Note [torch file layouts] in torch_file.cc), through an
// unpickler restricted to what torch.load(weights_only=True) accepts (Note [restricted
// unpickler] in torch_pickle.cc): no code in the file runs. Tensors come back on the CPU with
// their dtype, shape, strides and bytes; tensors that shared a storage in the file share one
// accel storage. Every malformed or hostile file is an IoError naming the file and what is wrong
// (Note [torch zip archives] in torch_zip.cc); sizes are checked against the file before anything
// is allocated. A link to a regular file is followed (a Hugging Face cache links into blobs/); a
// FIFO, device or directory is refused before it is read (Note [safe file access]).
//
// Writing produces what torch 1.13's torch.save writes for the same data, byte for byte (Note
// [pickling like torch.save] in torch_pickler.cc, Note [writing torch zip archives] in
// torch_zip.cc), atomically. torch.load(weights_only=True) of torch 1.13 refuses floats (its
// unpickler lacks BINFLOAT; later torch accepts them), so files with float values (an optimizer
// state's learning rates) load there with plain torch.load only; state dicts load either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/tensor_dict.h"
#include "core/tensor.h"

namespace accel::io {

struct PtEntry;

// A Python value of a torch.save file: None, bool, int, float (double), str, Tensor, list, tuple,
// dict or collections.OrderedDict (a dict with ordered() true; its instance attributes, such as a
// state dict's `_metadata`, in attributes()). Dicts keep their order; their keys are usually str
// (state dicts) or int (optimizer states).
class PtValue {
 public:
  enum class Kind : uint8_t { kNone, kBool, kInt, kDouble, kString, kTensor, kList, kTuple, kDict };

  PtValue();  // None
  PtValue(std::nullptr_t);
  PtValue(bool v);
  PtValue(int v);
  PtValue(int64_t v);
  PtValue(double v);
  PtValue(std::string v);
  PtValue(const char* v);
  PtValue(Tensor t);
  static PtValue list(std::vector<PtValue> items);
  static PtValue tuple(std::vector<PtValue> items);
  // ValueError for a key that is not None, a number, a str or a tuple of those, or a key twice.
  static PtValue dict(std::vector<PtEntry> entries);
  static PtValue ordered_dict(std::vector<PtEntry> entries);
  static PtValue list() { return list(std::vector<PtValue>{}); }
  static PtValue tuple() { return tuple(std::vector<PtValue>{}); }
  static PtValue dict();
  static PtValue ordered_dict();
  ~PtValue();
  PtValue(const PtValue&);
  PtValue(PtValue&&) noexcept;
  PtValue& operator=(const PtValue&);
  PtValue& operator=(PtValue&&) noexcept;

  Kind kind() const { return kind_; }
  // Python's type name: "None", "bool", "int", "float", "str", "Tensor", "list", "tuple", "dict"
  // ("OrderedDict" for an ordered dict).
  std::string type_name() const;
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_double() const { return kind_ == Kind::kDouble; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_tensor() const { return kind_ == Kind::kTensor; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }

  // The value; ValueError naming both types when it is of another kind. to_double() also takes an
  // int (as Python's float() does).
  bool to_bool() const;
  int64_t to_int() const;
  double to_double() const;
  const std::string& to_string() const;
  const Tensor& to_tensor() const;

  // A list's or tuple's items.
  const std::vector<PtValue>& items() const;
  std::vector<PtValue>& items();
  const PtValue& item(size_t i) const;  // IndexError when out of range
  // A dict's entries, in order; ordered() for an OrderedDict; its attributes.
  const std::vector<PtEntry>& entries() const;
  std::vector<PtEntry>& entries();
  bool ordered() const;
  const std::vector<PtEntry>& attributes() const;
  std::vector<PtEntry>& attributes();
  // Items of a list or tuple, entries of a dict.
  size_t size() const;
  // The value under `key` in a dict (keys compare as Python's do: 1 == 1.0 == True), or null.
  const PtValue* find(const PtValue& key) const;
  PtValue* find(const PtValue& key);
  bool contains(const PtValue& key) const { return find(key) != nullptr; }
  // The value under `key`; ValueError naming the key when absent.
  const PtValue& at(const PtValue& key) const;
  // Replaces the value under `key` or appends the entry; returns the stored value.
  PtValue& set(PtValue key, PtValue value);

  // Python-like text: {'a': tensor(float32, (2, 3)), 'b': [1, 2.5, None]}.
  std::string repr() const;

 private:
  void expect(Kind k, const char* what) const;
  static void check_key(const PtValue& key);
  Kind kind_ = Kind::kNone;
  bool ordered_ = false;
  int64_t int_ = 0;  // bool, int
  double double_ = 0;
  std::string string_;
  Tensor tensor_;
  std::vector<PtValue> items_;
  std::vector<PtEntry> entries_;
  std::vector<PtEntry> attributes_;
};

struct PtEntry {
  PtValue key;
  PtValue value;
};

// Reads any torch.save file holding what torch.load(weights_only=True) accepts.
PtValue read_pt(const std::string& path);

// Reads a state dict: a dict of str -> Tensor. IoError naming the file when it holds anything
// else (a training checkpoint {'model': ..., 'optimizer': ...}: read it with read_pt and convert
// one part with to_tensor_dict).
TensorDict load_pt(const std::string& path);

// A dict of str -> Tensor as a TensorDict; ValueError naming `what` and the offending key
// otherwise.
TensorDict to_tensor_dict(const PtValue& v, const std::string& what = "value");
// An OrderedDict of the tensors in name order (what save_pt writes for a TensorDict).
PtValue to_pt_value(const TensorDict& tensors);

// Writes atomically (Note [safe file access]) the file torch.save(obj, path) writes, where obj is
// an OrderedDict of the tensors (a state dict without _metadata) or the tree. Tensors may live on
// any device and have any strides; each distinct storage is written once, whole, and tensors keep
// their offset and strides into it, so views that share a storage share it in the file too (as in
// torch). They are written as CPU tensors. ValueError for an undefined or unallocated tensor,
// tensors of different dtypes over one storage, or a tree nested deeper than the reader accepts.
void save_pt(const std::string& path, const TensorDict& tensors);
void save_pt(const std::string& path, const PtValue& value);

namespace detail {
// save_pt with zip64 fields from `zip64_threshold` bytes on (tests exercise the zip64 layout on
// small files; the format's own threshold is 0xFFFFFFFF).
void save_pt_with(const std::string& path, const PtValue& value, uint64_t zip64_threshold);
}  // namespace detail

}  // namespace accel::io
