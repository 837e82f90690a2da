#include "worker/device/cuda_runtime.h"

#include <thread>

#if LATCHKEY_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace latchkey {

#if LATCHKEY_WITH_CUDA

bool BuiltWithCuda() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return absl::FailedPreconditionError(std::string("cudaGetDeviceCount: ") +
                                         cudaGetErrorString(e));
  }
  if (n == 0) return absl::FailedPreconditionError("cudaGetDeviceCount: no CUDA device");
  return n;
}

absl::Status UseCudaDevice(int ordinal) {
  const std::string name = "cuda:" + std::to_string(ordinal);
  absl::StatusOr<int> n = CudaDeviceCount();
  if (!n.ok()) {
    return absl::FailedPreconditionError("no CUDA device " + name +
                                         " for this rank: " + std::string(n.status().message()));
  }
  if (ordinal < 0 || ordinal >= *n) {
    return absl::FailedPreconditionError(
        "no CUDA device " + name + " for this rank: " + std::to_string(*n) + " device(s) visible");
  }
  if (const cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    return absl::FailedPreconditionError("cudaSetDevice(" + std::to_string(ordinal) +
                                         "): " + cudaGetErrorString(e));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CurrentCudaDevice() {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return absl::FailedPreconditionError("cudaGetDevice failed");
  }
  return device;
}

// The copy is polled (an event after it) rather than synchronized, so a wedged device fails the
// call within its timeout instead of blocking the training thread for ever.
absl::Status CopyOnCudaDevice(int device, void* dst, const void* src, size_t bytes,
                              std::chrono::milliseconds timeout) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr);
  }
  cudaEvent_t done = nullptr;
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(done, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (e == cudaSuccess) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      e = q;
    } else if (std::chrono::steady_clock::now() >= deadline) {
      (void)cudaEventDestroy(done);
      return absl::DeadlineExceededError("device copy not done within the timeout");
    } else {
      std::this_thread::yield();
    }
  }
  if (done != nullptr) (void)cudaEventDestroy(done);
  if (e != cudaSuccess) {
    return absl::InternalError(std::string("device copy: ") + cudaGetErrorString(e));
  }
  return absl::OkStatus();
}

std::string CudaVersionString() {
  int runtime = 0;
  int driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  const auto ver = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  };
  std::string s = "CUDA runtime " + ver(runtime);
  if (driver > 0) s += ", driver " + ver(driver);
  return s;
}

#else  // !LATCHKEY_WITH_CUDA

namespace {
absl::Status NoCuda() {
  return absl::UnimplementedError(
      "this latchkey-worker was built without CUDA (cmake -DLATCHKEY_CUDA=ON builds it)");
}
}  // namespace

bool BuiltWithCuda() { return false; }
absl::StatusOr<int> CudaDeviceCount() { return NoCuda(); }
absl::Status UseCudaDevice(int ordinal) {
  return absl::FailedPreconditionError("no CUDA device cuda:" + std::to_string(ordinal) +
                                       " for this rank: " + std::string(NoCuda().message()));
}
absl::StatusOr<int> CurrentCudaDevice() {
  return absl::FailedPreconditionError(NoCuda().message());
}
absl::Status CopyOnCudaDevice(int, void*, const void*, size_t, std::chrono::milliseconds) {
  return NoCuda();
}
std::string CudaVersionString() { return "no CUDA in this build"; }

#endif

}  // namespace latchkey
