#include "worker/checkpoint/tensor_bytes.h"

#include <ATen/ATen.h>

#include <map>

namespace latchkey {

StTensor RawStTensor(const std::string& name, const at::Tensor& t, StDtype dtype) {
  StTensor out{name, dtype, t.sizes().vec(), {}};
  at::Tensor c = t.cpu().contiguous();
  out.data.assign(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return out;
}

StTensor ToStTensor(const std::string& name, const at::Tensor& t) {
  return RawStTensor(name, t.to(at::kFloat), StDtype::kF32);
}

absl::StatusOr<at::Tensor> ToFloatTensor(const StTensor& t) {
  const std::map<StDtype, at::ScalarType> kTypes = {{StDtype::kF32, at::kFloat},
                                                    {StDtype::kF64, at::kDouble},
                                                    {StDtype::kBF16, at::kBFloat16},
                                                    {StDtype::kF16, at::kHalf}};
  auto type = kTypes.find(t.dtype);
  if (type == kTypes.end()) {
    return absl::InvalidArgumentError("tensor " + t.name + " has non-float dtype " +
                                      StDtypeName(t.dtype));
  }
  // from_blob only views the file's bytes; the copy owns its memory.
  at::Tensor view = at::from_blob(const_cast<char*>(t.data.data()), t.shape, type->second);
  return view.to(at::kFloat).clone();
}

absl::StatusOr<at::Tensor> RawTensor(const StFile& file, const std::string& source,
                                     const std::string& name, StDtype dtype, at::ScalarType type,
                                     int64_t numel) {
  const StTensor* t = file.Find(name);
  if (t == nullptr) return absl::DataLossError(source + ": no tensor " + name);
  if (t->dtype != dtype || (numel >= 0 && t->NumElements() != numel)) {
    return absl::FailedPreconditionError(
        source + ": " + name + " is " + StDtypeName(t->dtype) + " with " +
        std::to_string(t->NumElements()) + " elements, this rank needs " + StDtypeName(dtype) +
        (numel >= 0 ? " with " + std::to_string(numel) : std::string()));
  }
  return at::from_blob(const_cast<char*>(t->data.data()), {t->NumElements()}, type).clone();
}

}  // namespace latchkey
