// JobClient: a user's connection to the coordinator's JobService (used by the `latchkey` CLI,
// scripts and tests). It speaks the plain values of common/job_info.h; the wire messages stay
// inside job_client.cc (converted by proto/wire.h).
//
// Every call carries a deadline (`ClientOptions::timeout`); errors come back as absl::Status
// with the coordinator's code and message (INVALID_ARGUMENT names the spec field, NOT_FOUND an
// unknown job, FAILED_PRECONDITION a job in the wrong state, ABORTED a stale generation,
// UNAVAILABLE / DEADLINE_EXCEEDED an unreachable or slow coordinator, UNAUTHENTICATED no or an
// unknown token, PERMISSION_DENIED a token whose role may not make the call).
//
// Thread-safety: all methods are thread-safe (one gRPC channel, shared). The channel connects
// lazily: constructing a JobClient never blocks.
#ifndef LATCHKEY_CLIENT_JOB_CLIENT_H_
#define LATCHKEY_CLIENT_JOB_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_info.h"
#include "common/states.h"
#include "common/timeouts.h"
#include "proto/channel.h"

namespace latchkey {

struct ClientOptions {
  std::string coordinator = kDefaultCoordinatorAddress;           // HOST:PORT
  absl::Duration timeout = absl::FromChrono(kDefaultRpcTimeout);  // per unary call
  // How long WatchJob keeps reopening a stream while the coordinator is unreachable (e.g.
  // restarting); zero: `timeout`.
  absl::Duration watch_reconnect = absl::ZeroDuration();
  // TLS and the bearer token (proto/channel.h). A file that cannot be read fails every call
  // with INVALID_ARGUMENT naming the flag.
  ChannelCredentials credentials{};
};

class JobClient {
 public:
  explicit JobClient(ClientOptions options);
  ~JobClient();
  JobClient(const JobClient&) = delete;
  JobClient& operator=(const JobClient&) = delete;

  // Validates the spec and creates a pending job.
  absl::StatusOr<SubmittedJob> SubmitJob(const JobSubmission& submission);
  // The job with its per-worker list.
  absl::StatusOr<JobInfo> GetJob(const std::string& job_id);
  // Newest first, without the per-worker lists. Empty `states`: every state. `limit` 0: 100.
  absl::StatusOr<std::vector<JobInfo>> ListJobs(const std::vector<JobState>& states = {},
                                                int limit = 0);
  // Pending/running -> cancelled; returns the job as it is then.
  absl::StatusOr<JobInfo> CancelJob(const std::string& job_id, const std::string& reason);
  // Failed/cancelled -> recovering: a new attempt from the newest committed checkpoint;
  // returns the job as it is then. FAILED_PRECONDITION for a job in another state.
  absl::StatusOr<JobInfo> ResumeJob(const std::string& job_id, const std::string& reason);
  // A running job saves its last completed step and stops, then waits suspended for ResumeJob.
  absl::StatusOr<JobInfo> SuspendJob(const std::string& job_id, const std::string& reason);
  // Changes the policy from the first window not yet published.
  absl::StatusOr<JobPolicyUpdateResult> UpdateJobPolicy(const JobPolicyUpdate& update);
  // One page of the latch audit from `start_window`; `page_size` 0: the coordinator's default.
  absl::StatusOr<LatchAuditPage> ListLatches(const std::string& job_id, int64_t start_window = 0,
                                             int page_size = 0);
  // The live ranks' spans of steps first..last (-1: no bound) of a running job, asked through
  // their heartbeats (docs/observability.md "Traces"): rank -> its JSON lines, and the ranks
  // that did not answer within `wait` or were left out (the answer's size cap).
  struct TraceLines {
    std::map<int, std::string> ranks;
    std::vector<int> missing, omitted;
  };
  absl::StatusOr<TraceLines> GetTrace(const std::string& job_id, int64_t first_step,
                                      int64_t last_step, absl::Duration wait);
  // Every page of the audit from `start_window`, concatenated.
  absl::StatusOr<LatchAuditPage> ListAllLatches(const std::string& job_id,
                                                int64_t start_window = 0);

  // Streams the job's changes to `on_update` until the job ends (returns the final job), or
  // `on_update` returns false (CANCELLED), or `deadline` passes (DEADLINE_EXCEEDED). A stream
  // broken by a coordinator restart is reopened (with backoff, up to `watch_reconnect`, else
  // `timeout`, unreachable), and so is each stream after 30 minutes (every call has a deadline,
  // even an endless watch); a reopened stream starts again with the job as it is, then the
  // completed steps the coordinator holds that were not delivered yet, so the steps completed
  // while the stream was down are not lost and none comes twice. `on_update` runs on the
  // caller's thread. `replay_recent_steps`: the first stream also delivers the completed steps
  // the coordinator still holds (oldest first) after the job as it is.
  absl::StatusOr<JobInfo> WatchJob(const std::string& job_id,
                                   const std::function<bool(const JobUpdate&)>& on_update,
                                   absl::Time deadline, bool replay_recent_steps = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ClientOptions options_;
};

}  // namespace latchkey

#endif  // LATCHKEY_CLIENT_JOB_CLIENT_H_
