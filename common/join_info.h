// What a rank learns when it joins a job: the coordinator's Join produces it, WorkerService.Join
// carries it (proto/wire.h converts), the worker's session hands it to the runner.
#ifndef LATCHKEY_COMMON_JOIN_INFO_H_
#define LATCHKEY_COMMON_JOIN_INFO_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "common/states.h"

namespace latchkey {

struct JoinInfo {
  int rank = 0;
  int world_size = 1;
  int tp = 1;
  int dp = 1;
  int tp_rank = 0;        // RankGrid{world_size, tp}.tp_rank(rank)
  int dp_rank = 0;        // RankGrid{world_size, tp}.dp_rank(rank)
  std::string spec_json;  // ParseJobSpec(spec_json, base_dir) gives the job's JobSpec
  std::string base_dir;
  std::string rendezvous_host;  // empty while rank 0 has not joined (and the submitter named none)
  int rendezvous_port = 0;
  JobState state = JobState::kPending;  // the job's state when the rank joined
  int64_t steps = 0;
  absl::Duration heartbeat_interval;
  absl::Duration liveness_timeout;
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_JOIN_INFO_H_
