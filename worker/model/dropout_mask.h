// Dropout keep masks drawn from the Philox streams of worker/model/philox.h, on the device of the
// activations that use them (docs/model.md, "Dropout and the RNG rule").
//
// Two implementations of one function, equal bit for bit: the CPU loop (philox::FillKeepMask)
// for CPU tensors, and tensor ops (int64 arithmetic, each 32x32-bit product split so that every
// intermediate stays below 2^49) for every other device, so no mask is ever copied from the host.
// Errors: a draw outside the streams' ranges (layer, head, elements per row) throws c10::Error
// naming the model field; positions must be >= 0 (the caller checks them on the host, where they
// come from). Thread-safety: pure functions of their arguments.
#ifndef LATCHKEY_WORKER_MODEL_DROPOUT_MASK_H_
#define LATCHKEY_WORKER_MODEL_DROPOUT_MASK_H_

#include <ATen/ATen.h>

#include "worker/model/philox.h"

namespace latchkey {

// The keep mask of `draw` for the rows at `positions` (int64 [rows], on the device the mask is
// wanted on): bool [rows, draw.heads, draw.elements] on positions' device. CPU: the loop;
// elsewhere: DropoutKeepMaskTensorOps.
at::Tensor DropoutKeepMask(const philox::DropoutDraw& draw, const at::Tensor& positions);

// The tensor-op path on positions' device, any device (the tests run it on the CPU against the
// loop). Works in chunks of whole rows of at most `chunk_entries` counters (rows·heads·elements/4;
// at least one row per chunk), which bounds the int64 intermediates.
at::Tensor DropoutKeepMaskTensorOps(const philox::DropoutDraw& draw, const at::Tensor& positions,
                                    int64_t chunk_entries = int64_t{1} << 24);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_MODEL_DROPOUT_MASK_H_
