// What a user's client says to and hears from the coordinator's JobService, as plain C++ values:
// the vocabulary of JobClient (client/job_client.h). proto/wire.h converts each of them to and
// from its latchkey.v1 message, so nothing else needs the generated types.
//
// Value types only: copyable, no invariants beyond the field comments. Times are absl::Time;
// absl::UnixEpoch() means "not set" (the wire's unset Timestamp).
#ifndef LATCHKEY_COMMON_JOB_INFO_H_
#define LATCHKEY_COMMON_JOB_INFO_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "common/rank_position.h"
#include "common/states.h"
#include "common/step_report.h"

namespace latchkey {

// One rank's worker as the coordinator sees it (latchkey.v1.WorkerInfo).
struct JobWorkerInfo {
  int rank = 0;
  std::string worker_id;
  WorkerState state = WorkerState::kJoined;
  int tp_rank = 0;
  int dp_rank = 0;
  std::string host;  // the host the worker advertised, or its peer address
  absl::Time last_seen = absl::UnixEpoch();
  int64_t steps_reported = 0;  // highest reported step + 1
};

// A step every rank has reported (latchkey.v1.StepSummary). `report` is rank 0's report except
// step_seconds, which is the slowest rank's, and peak_memory_bytes, the largest over ranks. The
// coordinator passes on step, micro_batches, loss, grad_norm, kv_mode, kv_allreduce_calls,
// step_seconds, tokens, lr, eval_loss (set on the steps where evaluation ran) and
// peak_memory_bytes; the report's other fields keep their defaults.
struct CompletedStep {
  StepReport report;
  int ranks_reported = 0;
  // Each reporting rank's peak_memory_bytes (the coordinator's status page; not on the wire).
  std::map<int, int64_t> rank_peak_memory_bytes;
  // Each reporting rank's collective_seconds over its step_seconds (the status page); none for
  // the reports read back from the store after a restart (it keeps no collective_seconds).
  std::map<int, double> rank_collective_share;
  // Each reporting rank's compute seconds per micro-batch (StepReport::compute_seconds over
  // replica_micro_batches: the straggler score; the status page); in memory only.
  std::map<int, double> rank_compute_per_micro_batch;
};

// How late the slowest rank of one window arrived at its first boundary collective: the spread
// (max - min) over ranks of the time they waited there (StepReport::boundary_wait_seconds).
struct WindowArrival {
  int64_t window = 0;
  int slowest_rank = 0;  // the rank that waited least: it arrived last
  double lag_seconds = 0.0;
};

// A rank the coordinator names slow (docs/fault-tolerance.md "Stragglers").
struct StragglerInfo {
  int rank = 0;
  std::string host;       // the host its worker advertised
  double slowdown = 0.0;  // its compute time per micro-batch over the other ranks' median
  int64_t since_step = 0;
};

// A job (latchkey.v1.Job).
// One attempt of a job as status shows it (docs/fault-tolerance.md).
struct AttemptSummary {
  int64_t attempt = 1;
  int world = 1;
  int tp = 1;
  int dp = 1;
  int gradient_accumulation_steps = 1;
  int64_t resume_step = -1;
  std::string cause;
};

struct JobInfo {
  std::string job_id;
  JobState state = JobState::kPending;
  std::string spec_json;  // as the coordinator stores it
  std::string base_dir;   // folder relative spec paths resolve against (on the workers)
  int world_size = 0;     // the spec's
  int world = 0;          // the current attempt's (an elastic job may run fewer ranks)
  int tp = 0;             // the current attempt's
  int dp = 0;             // the current attempt's
  int64_t steps = 0;
  LatchPolicy policy;           // kv_reduce, gradient_accumulation_steps (0: spec), generation
  std::string rendezvous_host;  // empty until known
  int rendezvous_port = 0;
  int workers_joined = 0;
  std::vector<JobWorkerInfo> workers;  // GetJob only; rank order, joined ranks only
  int64_t windows_published = 0;       // latches 0 .. windows_published-1 exist
  int64_t steps_completed = 0;         // steps every rank has reported
  std::optional<CompletedStep> last_step;
  std::string failure_reason;  // failed / cancelled: why (names the rank or field)
  std::vector<std::string> warnings;
  absl::Time create_time = absl::UnixEpoch();
  absl::Time update_time = absl::UnixEpoch();
  // Fault tolerance (docs/fault-tolerance.md).
  int64_t attempt = 1;                 // from 1; each recovery adds one
  int restarts = 0;                    // recoveries (an elastic shrink or grow spends none)
  int max_restarts = 0;                // the spec's latchkey.max_restarts
  int64_t last_checkpoint_step = -1;   // newest committed checkpoint; -1: none
  int64_t resume_step = -1;            // the checkpoint the current attempt resumed from
  std::string last_recovery_reason;    // what caused the latest recovery
  std::vector<StalledRank> stalled;    // listed until the attempt they caused completed a step
  int64_t determinism_violations = 0;  // re-run steps whose loss differed from the first report
  // The slowest rank of the last completed windows (boundary arrival lag), newest last.
  std::vector<WindowArrival> slowest;
  std::vector<AttemptSummary> attempts;  // every attempt so far, the current one last
  // Drawn at submit and kept for every attempt and resume (common/job_uid.h): the identity its
  // checkpoints carry. "" from a coordinator before job uids.
  std::string job_uid;
  std::vector<StragglerInfo> stragglers;  // the ranks named slow now, rank order
  // The newest published latch's micro-batches per DP replica (rebalancing); empty: even.
  std::vector<int> replica_micro_batches;
};

// SubmitJob's request.
struct JobSubmission {
  std::string spec_json;
  // Folder that relative paths in the spec resolve against on the workers; empty: their cwd.
  std::string base_dir;
  std::string rendezvous_host;      // empty: the host rank 0 advertises
  int rendezvous_port = 0;          // 0: one from the coordinator's range
  std::string job_id{};             // empty: the coordinator assigns one (job-NNNNNN)
  std::string join_token_sha256{};  // empty: the coordinator draws the token and returns it
};

// SubmitJob's answer.
struct SubmittedJob {
  std::string job_id;
  std::string join_token;  // workers present it at Join; keep it secret ("" if not drawn here)
  JobInfo job;
  bool already_submitted = false;  // a repeated submit of the same job id and request
};

// UpdateJobPolicy's request: unset fields stay as they are.
struct JobPolicyUpdate {
  std::string job_id;
  std::optional<KvReducePolicy> kv_reduce;
  std::optional<int> gradient_accumulation_steps;  // >= 1
  std::optional<int64_t> expected_generation;      // apply only at this generation
};

// UpdateJobPolicy's answer.
struct JobPolicyUpdateResult {
  LatchPolicy policy;        // the new policy (generation bumped)
  int64_t first_window = 0;  // the first window decided under it
};

// One message of WatchJob: the job after a change, and the step it completed, if any.
struct JobUpdate {
  JobInfo job;  // without the per-worker list
  std::optional<CompletedStep> step;
};

// A published latch as the audit shows it.
struct AuditedLatch {
  Latch latch;
  absl::Time publish_time = absl::UnixEpoch();
};

struct AuditedPolicyChange {
  LatchPolicy policy;
  int64_t first_window = 0;
  absl::Time change_time = absl::UnixEpoch();
};

// One entry of a job's audit log besides latches and policy changes (latchkey.v1.JobEvent).
struct AuditedEvent {
  absl::Time time = absl::UnixEpoch();
  int64_t attempt = 1;
  std::string kind;  // "recovery", "stalled", "determinism_violation", "checkpoint"
  std::string message;
};

// One page of ListLatches.
struct LatchAuditPage {
  std::vector<AuditedLatch> latches;  // window order
  std::vector<AuditedPolicyChange> policy_changes;
  std::vector<AuditedEvent> events;  // time order
  int64_t next_start_window = 0;     // 0: no more pages
};

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_JOB_INFO_H_
