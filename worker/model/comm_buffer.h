// The one bridge from tensors to comm::Buffer: the tensor's memory, element count, type and
// device, so collectives always see where a buffer lives (comm itself is torch-free).
#ifndef LATCHKEY_WORKER_MODEL_COMM_BUFFER_H_
#define LATCHKEY_WORKER_MODEL_COMM_BUFFER_H_

#include <ATen/core/Tensor.h>

#include "worker/comm/comm.h"

namespace latchkey {

// A Buffer over all of `t`'s elements. REQUIRES: `t` is contiguous, of dtype float32, float64,
// bfloat16 or uint8 (bytes), on the CPU or a CUDA device; a violation is a programming error and
// throws c10::Error. The buffer is valid while `t`'s storage is.
comm::Buffer CommBuffer(const at::Tensor& t);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_COMM_BUFFER_H_
