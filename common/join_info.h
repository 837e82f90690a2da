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
  // Fault tolerance (docs/fault-tolerance.md). The attempt this join belongs to (from 1); a
  // recovery bumps it and every rank joins again (a new worker id; the old one stays fenced).
  int64_t attempt = 1;
  // Key prefix in the rendezvous store for this attempt, e.g. "job-000001/a2": a fresh
  // rendezvous per attempt. For attempt >= 2 rendezvous_host stays empty until rank 0 of the
  // attempt has joined (so nobody meets a store of the old attempt).
  std::string rendezvous_prefix;
  // The committed checkpoint the attempt resumes from: its step (-1: start from scratch) and
  // the SHA-256 (hex) of its manifest.json as the ranks reported it; the first window run is
  // resume_step + 1.
  int64_t resume_step = -1;
  std::string resume_manifest_sha256;
  absl::Duration hang_timeout = absl::Seconds(20);  // the job's latchkey.hang_timeout_seconds
  // The attempt's accumulation steps (its layout's: an elastic layout keeps the global batch
  // with GAS * dp / dp'); the engine is built with them and world_size instead of the spec's.
  // 0 from an older coordinator: the spec's.
  int gradient_accumulation_steps = 0;
  // latchkey.elastic: a worker the layout has no rank for is a spare instead of refused.
  bool elastic = false;
  // This worker is a spare (rank -1): it joins again until it gets a rank, or the job ends
  // (state terminal, failure_reason) and it is not needed.
  bool spare = false;
  std::string failure_reason;  // with spare: the job's, once it ended
  // The job's uid (common/job_uid.h), the same in every attempt: the checkpoints carry it, and
  // the job resumes and prunes only those that do. "" from a coordinator before job uids.
  std::string job_uid;
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_JOIN_INFO_H_
