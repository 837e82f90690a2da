// The coordinator's views as JobService's plain values (common/job_info.h).
#include <utility>

#include "server/coordinator.h"

namespace latchkey {

CompletedStep ToCompletedStep(const StepSummary& s) {
  CompletedStep out;
  StepReport& r = out.report;
  r.step = s.step;
  r.micro_batches = s.micro_batches;
  r.loss = s.loss;
  r.grad_norm = s.grad_norm;
  r.kv_mode = s.kv_mode;
  r.kv_allreduce_calls = s.kv_allreduce_calls;
  r.step_seconds = s.step_seconds;
  r.tokens = s.tokens;
  out.ranks_reported = s.ranks_reported;
  return out;
}

JobInfo ToJobInfo(const JobView& v) {
  const JobRecord& r = v.record;
  JobInfo out;
  out.job_id = r.job_id;
  out.state = r.state;
  out.spec_json = r.spec_json;
  out.base_dir = r.base_dir;
  out.world_size = v.world_size;
  out.tp = v.tp;
  out.dp = v.dp;
  out.steps = v.steps;
  out.policy = r.policy;
  out.rendezvous_host = r.rendezvous_host;
  out.rendezvous_port = r.rendezvous_port;
  out.workers_joined = v.workers_joined;
  for (const WorkerView& w : v.workers) {
    JobWorkerInfo o;
    o.rank = w.rank;
    o.worker_id = w.worker_id;
    o.state = w.state;
    o.tp_rank = w.tp_rank;
    o.dp_rank = w.dp_rank;
    o.host = w.host;
    o.last_seen = w.last_seen;
    o.steps_reported = w.steps_reported;
    out.workers.push_back(std::move(o));
  }
  out.windows_published = r.next_window;
  out.steps_completed = v.steps_completed;
  if (v.last_step) out.last_step = ToCompletedStep(*v.last_step);
  out.failure_reason = r.failure_reason;
  out.warnings = r.warnings;
  out.create_time = r.create_time;
  out.update_time = r.update_time;
  return out;
}

LatchAuditPage ToAuditPage(const LatchAudit& audit) {
  LatchAuditPage out;
  for (const PublishedLatch& p : audit.latches) out.latches.push_back({p.latch, p.publish_time});
  for (const PolicyChangeRecord& c : audit.policy_changes) {
    out.policy_changes.push_back({c.policy, c.first_window, c.change_time});
  }
  out.next_start_window = audit.next_start_window;
  return out;
}

}  // namespace latchkey
