#include "worker/runner/device.h"

#include <string>

#include "worker/device/cuda_runtime.h"

namespace latchkey {

CommBackend BackendFor(const JobSpec& spec) {
  if (spec.backend != CommBackend::kAuto) return spec.backend;
  return spec.device == DeviceKind::kCuda ? CommBackend::kNccl : CommBackend::kAuto;
}

absl::StatusOr<RankPlacement> PlaceRank(const JobSpec& spec, const WorkerEnv& env, int rank,
                                        int local_world_size) {
  RankPlacement p;
  p.backend = BackendFor(spec);
  if (spec.device == DeviceKind::kCpu) return p;
  const int local = local_world_size > 0 ? local_world_size : 1;
  p.local_rank = env.local_rank.value_or(rank % local);
  p.device = comm::Device::Cuda(p.local_rank);
  if (env.test_skip_device_check) return p;
  if (absl::Status st = UseCudaDevice(p.local_rank); !st.ok()) {
    return absl::FailedPreconditionError("latchkey.device: \"cuda\": " + std::string(st.message()));
  }
  return p;
}

}  // namespace latchkey
