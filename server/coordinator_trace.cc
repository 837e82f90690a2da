// Coordinator: collecting a running job's trace (JobService.GetTrace, WorkerService.PutTrace;
// docs/observability.md "Traces"). The coordinator keeps no spans: it opens a request on the
// job, every live rank hears it with its next heartbeat (HeartbeatResponse.trace_request_id)
// and answers with its timeline's spans, and the call that opened it returns them once every
// asked rank has answered, or at its deadline with the others named missing.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace latchkey {

absl::StatusOr<TraceAnswers> Coordinator::CollectTrace(const std::string& job_id,
                                                       int64_t first_step, int64_t last_step,
                                                       absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * j, FindJob(job_id));
  if (j->rec.state != JobState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", JobStateName(j->rec.state),
        ": its ranks write their spans to trace-R.jsonl as they end; read them from the run "
        "folder (latchkey trace ",
        job_id, " --run-dir RUN)"));
  }
  if (j->trace.id != 0) {
    return absl::AbortedError(
        absl::StrCat("a trace of job ", job_id, " is being collected; try again"));
  }
  TraceRequest req;
  req.id = ++last_trace_id_;
  req.first_step = first_step;
  req.last_step = last_step;
  for (int r = 0; r < j->world_size(); ++r) {
    if (IsLive(j->ranks.at(r).state)) req.asked.insert(r);
  }
  if (req.asked.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " has no live rank to ask for its spans"));
  }
  const int64_t id = req.id;
  j->trace = std::move(req);
  // The job stays in jobs_ for the coordinator's life: `j` is valid after the wait.
  auto answered = [this, j, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || j->trace.id != id || j->trace.done();
  };
  mu_.AwaitWithTimeout(absl::Condition(&answered), timeout);
  TraceAnswers out;
  if (j->trace.id != id) return absl::AbortedError("the trace request was replaced");
  for (int r : j->trace.asked) {
    if (!j->trace.answers.count(r)) out.missing.push_back(r);
  }
  out.answers = std::move(j->trace.answers);
  j->trace = TraceRequest{};
  Log(absl::StrCat(
      job_id, ": trace of steps ", first_step, "..",
      last_step < 0 ? std::string() : std::to_string(last_step), ": ", out.answers.size(),
      " ranks answered",
      out.missing.empty() ? std::string() : absl::StrCat(", ", out.missing.size(), " did not")));
  return out;
}

absl::Status Coordinator::PutTrace(const WorkerCall& call, int64_t request_id, std::string jsonl) {
  absl::MutexLock lock(&mu_);
  LK_ASSIGN_OR_RETURN(Job * j, FindForWorker(call, /*check_rank=*/true));
  TraceRequest& t = j->trace;
  if (t.id == 0 || t.id != request_id || !t.asked.count(call.rank)) return absl::OkStatus();
  t.answers[call.rank] = std::move(jsonl);
  return absl::OkStatus();
}

}  // namespace latchkey
