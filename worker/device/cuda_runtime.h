// The CUDA runtime as the worker uses it outside a collective backend: which devices this
// process can use, making one current, and the bounded device-to-device copy of a group of one.
// Asked of the CUDA runtime directly (cudart, no torch), so the answers and their errors are the
// same against a CPU-only and a CUDA libtorch. Without LATCHKEY_CUDA every query fails
// (UNIMPLEMENTED naming the build option, or FAILED_PRECONDITION where a device is asked for).
// Used by the runner (worker/runner/device.h), the collectives (worker/comm/) and the tests;
// depends on nothing of the worker.
// Thread-safety: every function is thread-safe (the CUDA runtime's own guarantees).
#ifndef LATCHKEY_WORKER_DEVICE_CUDA_RUNTIME_H_
#define LATCHKEY_WORKER_DEVICE_CUDA_RUNTIME_H_

#include <chrono>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latchkey {

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

// This thread's current CUDA device once at least one is visible (cudaGetDevice);
// FAILED_PRECONDITION as CudaDeviceCount otherwise.
absl::StatusOr<int> CurrentCudaDevice();

// Copies `bytes` from `src` to `dst`, both memory of cuda:`device`, on the legacy default
// stream, and waits for the copy at most `timeout` (DEADLINE_EXCEEDED past it; INTERNAL with
// the runtime's error string when a CUDA call fails). UNIMPLEMENTED without LATCHKEY_CUDA.
absl::Status CopyOnCudaDevice(int device, void* dst, const void* src, size_t bytes,
                              std::chrono::milliseconds timeout);

// "CUDA runtime 13.0, driver 12.4" (the driver part only when one is loaded).
std::string CudaVersionString();

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DEVICE_CUDA_RUNTIME_H_
