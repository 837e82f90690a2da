// Where a rank trains and which collective backend it uses, decided once from the spec
// (latchkey.device, latchkey.backend) and the environment, for standalone and coordinated ranks
// alike. cuda means cuda:LOCAL_RANK, LOCAL_RANK defaulting to RANK modulo LOCAL_WORLD_SIZE;
// latchkey.backend "auto" means nccl on cuda (gloo/shm on cpu: CommBackend::kAuto). The
// placement's device goes into the rendezvous config: the groups are formed for it.
#ifndef LATCHKEY_WORKER_RUNNER_DEVICE_H_
#define LATCHKEY_WORKER_RUNNER_DEVICE_H_

#include "absl/status/statusor.h"
#include "common/backend.h"
#include "common/job_spec.h"
#include "worker/comm/comm.h"
#include "worker/runner/env.h"

namespace latchkey {

struct RankPlacement {
  comm::Device device;                       // cpu, or cuda:local_rank
  CommBackend backend = CommBackend::kAuto;  // what CreateProcessGroups is asked for
  int local_rank = 0;
};

// The backend the spec's latchkey.backend asks for on its latchkey.device.
CommBackend BackendFor(const JobSpec& spec);

// The rank's device and backend. On cuda the device is checked at once and made current
// (cudaSetDevice): FAILED_PRECONDITION naming latchkey.device, the missing device and the CUDA
// runtime's error (e.g. "latchkey.device: \"cuda\": no CUDA device cuda:0 for this rank:
// cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version"), so a job
// without a GPU fails before any rendezvous, on every rank. `rank` is the job rank (RANK or the
// coordinator's), `local_world_size` the ranks on this machine. Test hook: with
// env.test_skip_device_check (LATCHKEY_TEST_SKIP_DEVICE_CHECK=1) the check is left to the nccl
// backend, which makes it after the unique ids' rendezvous (tests observe the ids travel on
// machines without a GPU).
absl::StatusOr<RankPlacement> PlaceRank(const JobSpec& spec, const WorkerEnv& env, int rank,
                                        int local_world_size);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_DEVICE_H_
