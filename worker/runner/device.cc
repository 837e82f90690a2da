#include "worker/runner/device.h"

#include <cstdlib>
#include <string>

#include "worker/comm/nccl/cuda_device.h"

namespace latchkey {

comm::Backend BackendFor(const JobSpec& spec) {
  switch (spec.backend) {
    case CommBackend::kGloo:
      return comm::Backend::kGloo;
    case CommBackend::kShm:
      return comm::Backend::kShm;
    case CommBackend::kNccl:
      return comm::Backend::kNccl;
    case CommBackend::kAuto:
      break;
  }
  return spec.device == DeviceKind::kCuda ? comm::Backend::kNccl : comm::Backend::kAuto;
}

absl::StatusOr<RankPlacement> PlaceRank(const JobSpec& spec, const WorkerEnv& env, int rank,
                                        int local_world_size) {
  RankPlacement p;
  p.backend = BackendFor(spec);
  if (spec.device == DeviceKind::kCpu) return p;
  const int local = local_world_size > 0 ? local_world_size : 1;
  p.local_rank = env.local_rank.value_or(rank % local);
  p.device = comm::Device::Cuda(p.local_rank);
  const char* skip = std::getenv("LATCHKEY_TEST_SKIP_DEVICE_CHECK");
  if (skip != nullptr && std::string(skip) == "1") return p;
  if (absl::Status st = comm::UseCudaDevice(p.local_rank); !st.ok()) {
    return absl::FailedPreconditionError("latchkey.device: \"cuda\": " + std::string(st.message()));
  }
  return p;
}

}  // namespace latchkey
