// The bridge between at::Tensor and the safetensors format's StTensor (safetensors.h): the
// bytes of a tensor as they are, a widened fp32 copy, and host tensors read back from a file.
// Only the checkpoint module's torch code includes it.
// Thread-safety: reentrant. Errors: as documented per function.
#ifndef LATCHKEY_WORKER_CHECKPOINT_TENSOR_BYTES_H_
#define LATCHKEY_WORKER_CHECKPOINT_TENSOR_BYTES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/checkpoint/safetensors.h"

namespace latchkey {

// The bytes of `t` as they are (its dtype is `dtype`), shape kept; copied to the host.
StTensor RawStTensor(const std::string& name, const at::Tensor& t, StDtype dtype);

// `t` converted to fp32, as an F32 StTensor.
StTensor ToStTensor(const std::string& name, const at::Tensor& t);

// A host fp32 copy of a floating tensor (F32, F64, BF16, F16). INVALID_ARGUMENT naming the
// tensor for any other dtype.
absl::StatusOr<at::Tensor> ToFloatTensor(const StTensor& t);

// A flat host copy of `file`'s tensor `name` (read from `source`), which must have `dtype` and,
// when `numel` >= 0, `numel` elements: DATA_LOSS when it is missing, FAILED_PRECONDITION naming
// what this rank needs otherwise.
absl::StatusOr<at::Tensor> RawTensor(const StFile& file, const std::string& source,
                                     const std::string& name, StDtype dtype, at::ScalarType type,
                                     int64_t numel);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_TENSOR_BYTES_H_
