// FlatOps for a device other than the CPU (cuda): the same formulas as the CPU reference
// (flat_ops.h), written as ATen tensor operations, one elementwise operation per step of the
// formula (no fused or alpha-scaled forms), so they run wherever ATen has kernels. Norms are
// summed in fp64 per range on the device, the ranges then summed in order on the host. The
// rounding may differ from the CPU's only in the order of a range's sum. Used by MakeFlatOps for
// cuda when the libtorch in use has CUDA (UNIMPLEMENTED, naming that, when it has not).
// Thread-safety: stateless.
#ifndef LATCHKEY_WORKER_TRAIN_FLAT_OPS_DEVICE_H_
#define LATCHKEY_WORKER_TRAIN_FLAT_OPS_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/train/flat_ops.h"

namespace latchkey {

// The ATen implementation for `device`. REQUIRES for a cuda device: at::hasCUDA().
std::unique_ptr<FlatOps> MakeAtenFlatOps(const c10::Device& device);

// MakeFlatOps' branch for a non-CPU device.
absl::StatusOr<std::unique_ptr<FlatOps>> MakeDeviceFlatOps(const c10::Device& device);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_FLAT_OPS_DEVICE_H_
