// JobClient: a user's connection to the coordinator's JobService (used by the `latchkey` CLI,
// scripts and tests). Every call carries a deadline (`ClientOptions::timeout`); errors come back
// as absl::Status with the coordinator's code and message.
//
// Thread-safety: all methods are thread-safe (one gRPC channel, shared).
#ifndef LATCHKEY_CLIENT_JOB_CLIENT_H_
#define LATCHKEY_CLIENT_JOB_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "latchkey/v1/job_service.pb.h"

namespace latchkey {

inline constexpr char kDefaultCoordinator[] = "localhost:50051";
inline constexpr absl::Duration kDefaultRpcTimeout = absl::Seconds(10);

struct ClientOptions {
  std::string coordinator = kDefaultCoordinator;  // HOST:PORT
  absl::Duration timeout = kDefaultRpcTimeout;    // per unary call
};

class JobClient {
 public:
  explicit JobClient(ClientOptions options);
  ~JobClient();

  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& req);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& req);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  absl::StatusOr<v1::UpdateJobPolicyResponse> UpdateJobPolicy(
      const v1::UpdateJobPolicyRequest& req);
  absl::StatusOr<v1::ListLatchesResponse> ListLatches(const v1::ListLatchesRequest& req);

  // Streams the job's changes to `on_update` until the job ends (returns the final job), or
  // `on_update` returns false (CANCELLED), or `deadline` passes (DEADLINE_EXCEEDED). A stream
  // broken by a coordinator restart is reopened (with backoff, up to `timeout` unreachable), and
  // so is each stream after 30 minutes (every call has a deadline, even an endless watch); a
  // reopened stream starts again with the job as it is.
  absl::StatusOr<v1::Job> WatchJob(
      const std::string& job_id, const std::function<bool(const v1::WatchJobResponse&)>& on_update,
      absl::Time deadline);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ClientOptions options_;
};

}  // namespace latchkey

#endif  // LATCHKEY_CLIENT_JOB_CLIENT_H_
