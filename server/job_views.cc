// The coordinator's views as JobService's plain values (common/job_info.h).
#include <utility>

#include "server/coordinator.h"

namespace latchkey {

JobInfo ToJobInfo(const JobView& v) {
  const JobRecord& r = v.record;
  JobInfo out;
  out.job_id = r.job_id;
  out.job_uid = r.job_uid;
  out.state = r.state;
  out.spec_json = r.spec_json;
  out.base_dir = r.base_dir;
  out.world_size = v.spec_world_size > 0 ? v.spec_world_size : v.world_size;
  out.world = v.world_size;
  out.tp = v.tp;
  out.dp = v.dp;
  out.steps = v.steps;
  out.policy = r.policy;
  out.rendezvous_host = r.rendezvous_host;
  out.rendezvous_port = r.rendezvous_port;
  out.workers_joined = v.workers_joined;
  out.workers = v.workers;
  out.windows_published = r.next_window;
  out.steps_completed = v.steps_completed;
  out.last_step = v.last_step;
  out.failure_reason = r.failure_reason;
  out.warnings = r.warnings;
  out.create_time = r.create_time;
  out.update_time = r.update_time;
  out.attempt = r.attempt;
  out.restarts = r.restarts;
  out.max_restarts = v.max_restarts;
  out.last_checkpoint_step = r.last_checkpoint_step;
  out.resume_step = r.resume_step;
  out.last_recovery_reason = r.last_recovery_reason;
  out.stalled = r.stalled;
  out.determinism_violations = r.determinism_violations;
  out.slowest = v.slowest;
  out.stragglers = v.stragglers;
  out.replica_micro_batches = v.replica_micro_batches;
  out.attempts = v.attempts;
  return out;
}

LatchAuditPage ToAuditPage(const LatchAudit& audit) {
  LatchAuditPage out;
  for (const PublishedLatch& p : audit.latches) out.latches.push_back({p.latch, p.publish_time});
  for (const PolicyChangeRecord& c : audit.policy_changes) {
    out.policy_changes.push_back({c.policy, c.first_window, c.change_time});
  }
  for (const JobEventRecord& e : audit.events) {
    out.events.push_back({e.time, e.attempt, e.kind, e.message});
  }
  out.next_start_window = audit.next_start_window;
  return out;
}

}  // namespace latchkey
