#include "worker/comm/nccl/cuda_device.h"

#include <chrono>
#include <thread>

#if LATCHKEY_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace latchkey::comm {

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

namespace {

// A group of one on cuda:device: nothing to issue; local copies on the device.
class CudaSingleRankGroup final : public Group {
 public:
  CudaSingleRankGroup(std::string name, int device, std::shared_ptr<CollectiveStats> stats)
      : Group(std::move(name), 0, 1, std::move(stats)), device_(device) {}

 protected:
  absl::Status CheckDevice(const Device& d) const override {
    if (d.type == DeviceType::kCuda && d.index == device_) return absl::OkStatus();
    return absl::InvalidArgumentError("this group takes cuda:" + std::to_string(device_) +
                                      " buffers only, not " + d.ToString());
  }
  absl::Status CopyLocal(const Buffer& src, const Buffer& dst) override {
    if (absl::Status st = CheckDevice(src.device); !st.ok()) return st;
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, nullptr);
    }
    cudaEvent_t done = nullptr;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(done, nullptr);
    const auto deadline = std::chrono::steady_clock::now() + default_timeout();
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
  absl::Status DoAllReduceSum(const Buffer&, std::chrono::milliseconds) override {
    return absl::OkStatus();
  }
  absl::Status DoAllGather(const Buffer&, const Buffer&, std::chrono::milliseconds) override {
    return absl::OkStatus();
  }
  absl::Status DoReduceScatterSum(const Buffer&, const Buffer&,
                                  std::chrono::milliseconds) override {
    return absl::OkStatus();
  }
  absl::Status DoBroadcast(const Buffer&, int, std::chrono::milliseconds) override {
    return absl::OkStatus();
  }
  absl::Status DoBarrier(std::chrono::milliseconds) override { return absl::OkStatus(); }

 private:
  int device_;
};

}  // namespace

void PlaceSingleRankGroupsOnCuda(ProcessGroups* g, int device) {
  for (std::shared_ptr<Group>* grp : {&g->world, &g->tp_group, &g->dp_group}) {
    if (*grp != nullptr && (*grp)->size() > 1) continue;
    auto one = std::make_shared<CudaSingleRankGroup>(*grp ? (*grp)->name() : "", device, g->stats);
    if (*grp) one->set_default_timeout((*grp)->default_timeout());
    one->set_recorder(g->recorder);
    *grp = std::move(one);
  }
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
void PlaceSingleRankGroupsOnCuda(ProcessGroups*, int) {}
std::string CudaVersionString() { return "no CUDA in this build"; }

#endif

}  // namespace latchkey::comm
