// The CUDA devices this process can use, asked of the CUDA runtime directly (cudart, no torch),
// so the answer and its errors are the same against a CPU-only and a CUDA libtorch. Without
// LATCHKEY_CUDA every query fails UNIMPLEMENTED naming the build option.
// Thread-safety: every function is thread-safe (the CUDA runtime's own guarantees).
#ifndef LATCHKEY_WORKER_COMM_NCCL_CUDA_DEVICE_H_
#define LATCHKEY_WORKER_COMM_NCCL_CUDA_DEVICE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/process_groups.h"

namespace latchkey::comm {

// True when this build has the NCCL backend and the CUDA runtime (LATCHKEY_CUDA=ON).
bool BuiltWithCuda();

// The number of CUDA devices (cudaGetDeviceCount). FAILED_PRECONDITION with the runtime's error
// string when it fails (no driver, a driver older than the runtime, no device).
absl::StatusOr<int> CudaDeviceCount();

// OK when cuda:`ordinal` exists; then makes it this thread's current device (cudaSetDevice).
// FAILED_PRECONDITION naming the device and the runtime's error string otherwise, e.g.
// "no CUDA device cuda:1 for this rank: cudaGetDeviceCount: CUDA driver version is
// insufficient for CUDA runtime version".
absl::Status UseCudaDevice(int ordinal);

// Replaces every single-rank group of `groups` (a dimension of size 1, or all of them in a world
// of one) with one that takes cuda:`device` buffers: it issues nothing, as every single-rank
// group, and copies device memory where a one-rank all-gather or reduce-scatter copies (Group's
// CopyLocal, cudaMemcpyAsync then a bounded wait). Parallel groups are left as they are. Without
// LATCHKEY_CUDA it changes nothing (UseCudaDevice never succeeds there).
void PlaceSingleRankGroupsOnCuda(ProcessGroups* groups, int device);

// "CUDA runtime 13.0, driver 12.4" (the driver part only when one is loaded).
std::string CudaVersionString();

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_NCCL_CUDA_DEVICE_H_
