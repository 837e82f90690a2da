// proto/wire.h: WorkerService's messages (identity, join, latch stream, step and checkpoint
// reports, heartbeats with the rank's position, failure reports).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "proto/wire.h"

namespace latchkey {

// Inside namespace latchkey, v1 names latchkey::v1 (the generated code).

v1::JoinResponse ToProto(const JoinInfo& info) {
  v1::JoinResponse out;
  out.set_rank(info.rank);
  out.set_world_size(info.world_size);
  out.set_tp(info.tp);
  out.set_dp(info.dp);
  out.set_tp_rank(info.tp_rank);
  out.set_dp_rank(info.dp_rank);
  out.set_spec_json(info.spec_json);
  out.set_base_dir(info.base_dir);
  out.mutable_rendezvous()->set_host(info.rendezvous_host);
  out.mutable_rendezvous()->set_port(info.rendezvous_port);
  out.set_state(ToProto(info.state));
  *out.mutable_heartbeat_interval() = ToProtoDuration(info.heartbeat_interval);
  *out.mutable_liveness_timeout() = ToProtoDuration(info.liveness_timeout);
  out.set_steps(info.steps);
  out.set_attempt(info.attempt);
  out.set_rendezvous_prefix(info.rendezvous_prefix);
  out.set_resume_step(info.resume_step);
  out.set_resume_manifest_sha256(info.resume_manifest_sha256);
  *out.mutable_hang_timeout() = ToProtoDuration(info.hang_timeout);
  out.set_gradient_accumulation_steps(info.gradient_accumulation_steps);
  out.set_elastic(info.elastic);
  out.set_spare(info.spare);
  out.set_failure_reason(info.failure_reason);
  out.set_job_uid(info.job_uid);
  return out;
}

JoinInfo FromProto(const v1::JoinResponse& info) {
  JoinInfo out;
  out.rank = info.rank();
  out.world_size = info.world_size();
  out.tp = info.tp();
  out.dp = info.dp();
  out.tp_rank = info.tp_rank();
  out.dp_rank = info.dp_rank();
  out.spec_json = info.spec_json();
  out.base_dir = info.base_dir();
  out.rendezvous_host = info.rendezvous().host();
  out.rendezvous_port = info.rendezvous().port();
  out.state = FromProto(info.state()).value_or(JobState::kPending);
  out.heartbeat_interval = FromProtoDuration(info.heartbeat_interval());
  out.liveness_timeout = FromProtoDuration(info.liveness_timeout());
  out.steps = info.steps();
  out.attempt = info.attempt();
  out.rendezvous_prefix = info.rendezvous_prefix();
  out.resume_step = info.resume_step();
  out.resume_manifest_sha256 = info.resume_manifest_sha256();
  out.hang_timeout = FromProtoDuration(info.hang_timeout());
  out.gradient_accumulation_steps = info.gradient_accumulation_steps();
  out.elastic = info.elastic();
  out.spare = info.spare();
  out.failure_reason = info.failure_reason();
  out.job_uid = info.job_uid();
  return out;
}

v1::ReportStepRequest ToProto(const StepReport& report) {
  v1::ReportStepRequest out;
  out.set_step(report.step);
  out.set_micro_batches(report.micro_batches);
  out.set_loss(report.loss);
  out.set_grad_norm(report.grad_norm);
  out.set_kv_mode(ToProto(report.kv_mode));
  out.set_kv_allreduce_calls(report.kv_allreduce_calls);
  out.set_replicated_allreduce_calls(report.replicated_allreduce_calls);
  for (const auto& [k, v] : report.collective_calls) (*out.mutable_collective_calls())[k] = v;
  out.set_step_seconds(report.step_seconds);
  out.set_collective_seconds(report.collective_seconds);
  out.set_replica_micro_batches(report.replica_micro_batches);
  out.set_compute_seconds(report.compute_seconds);
  out.set_micro_batch_seconds(report.micro_batch_seconds);
  out.set_tokens(report.tokens);
  out.set_latch_generation(report.latch_generation);
  out.set_lr(report.lr);
  if (report.eval_loss) out.mutable_eval_loss()->set_value(*report.eval_loss);
  out.set_boundary_wait_seconds(report.boundary_wait_seconds);
  out.set_peak_memory_bytes(report.peak_memory_bytes);
  out.set_activation_memory_bytes(report.activation_memory_bytes);
  out.set_reserved_memory_bytes(report.reserved_memory_bytes);
  return out;
}

absl::StatusOr<StepReport> FromProto(const v1::ReportStepRequest& report) {
  StepReport out;
  std::optional<KvMode> mode = FromProto(report.kv_mode());
  if (!mode) return absl::InvalidArgumentError("kv_mode: required (the mode the step ran)");
  out.step = report.step();
  out.micro_batches = report.micro_batches();
  out.loss = report.loss();
  out.grad_norm = report.grad_norm();
  out.kv_mode = *mode;
  out.kv_allreduce_calls = report.kv_allreduce_calls();
  out.replicated_allreduce_calls = report.replicated_allreduce_calls();
  for (const auto& [k, v] : report.collective_calls()) out.collective_calls[k] = v;
  out.step_seconds = report.step_seconds();
  out.collective_seconds = report.collective_seconds();
  out.replica_micro_batches = report.replica_micro_batches();
  out.compute_seconds = report.compute_seconds();
  out.micro_batch_seconds = report.micro_batch_seconds();
  out.tokens = report.tokens();
  out.latch_generation = report.latch_generation();
  out.lr = report.lr();
  if (report.has_eval_loss()) out.eval_loss = report.eval_loss().value();
  out.boundary_wait_seconds = report.boundary_wait_seconds();
  out.peak_memory_bytes = report.peak_memory_bytes();
  out.activation_memory_bytes = report.activation_memory_bytes();
  out.reserved_memory_bytes = report.reserved_memory_bytes();
  return out;
}

v1::RankPosition ToProto(const RankPosition& p) {
  v1::RankPosition out;
  out.set_attempt(p.attempt);
  out.set_window(p.window);
  out.set_micro_batch(p.micro_batch);
  out.set_phase(RankPhaseName(p.phase));
  out.set_op(p.op);
  out.set_group(p.group);
  out.set_seq(p.seq);
  *out.mutable_in_position() = ToProtoDuration(absl::Seconds(std::max(0.0, p.seconds)));
  if (p.quiet_seconds >= 0) *out.mutable_quiet() = ToProtoDuration(absl::Seconds(p.quiet_seconds));
  return out;
}

RankPosition FromProto(const v1::RankPosition& p) {
  RankPosition out;
  out.attempt = p.attempt();
  out.window = p.window();
  out.micro_batch = p.micro_batch();
  out.phase = RankPhaseFromName(p.phase()).value_or(RankPhase::kIdle);
  out.op = p.op();
  out.group = p.group();
  out.seq = p.seq();
  out.seconds = std::max(0.0, absl::ToDoubleSeconds(FromProtoDuration(p.in_position())));
  if (p.has_quiet())
    out.quiet_seconds = std::max(0.0, absl::ToDoubleSeconds(FromProtoDuration(p.quiet())));
  return out;
}

v1::ReportCheckpointRequest ToProto(const CheckpointReport& r) {
  v1::ReportCheckpointRequest out;
  out.set_step(r.step);
  out.set_manifest_sha256(r.manifest_sha256);
  out.set_bytes(r.bytes);
  out.set_blocked_seconds(r.blocked_seconds);
  return out;
}

absl::StatusOr<CheckpointReport> FromProto(const v1::ReportCheckpointRequest& r) {
  if (r.step() < 0) return absl::InvalidArgumentError("step: must be >= 0");
  if (r.manifest_sha256().empty()) {
    return absl::InvalidArgumentError("manifest_sha256: required (hex SHA-256 of manifest.json)");
  }
  if (r.bytes() < 0) return absl::InvalidArgumentError("bytes: must be >= 0");
  CheckpointReport out;
  out.step = r.step();
  out.manifest_sha256 = r.manifest_sha256();
  out.bytes = r.bytes();
  out.blocked_seconds = r.blocked_seconds();
  return out;
}

v1::WorkerIdentity ToProto(const WorkerIdentity& identity) {
  v1::WorkerIdentity out;
  out.set_job_id(identity.job_id);
  out.set_join_token(identity.join_token);
  out.set_worker_id(identity.worker_id);
  out.set_attempt(identity.attempt);
  return out;
}

WorkerIdentity FromProto(const v1::WorkerIdentity& identity) {
  WorkerIdentity out;
  out.job_id = identity.job_id();
  out.join_token = identity.join_token();
  out.worker_id = identity.worker_id();
  out.attempt = identity.attempt();
  return out;
}

v1::JoinRequest MakeJoinRequest(const WorkerIdentity& identity, std::optional<int> requested_rank,
                                const std::string& advertise_host, int probe_port,
                                const std::string& node) {
  v1::JoinRequest out;
  *out.mutable_identity() = ToProto(identity);
  if (requested_rank) out.mutable_requested_rank()->set_value(*requested_rank);
  out.set_advertise_host(advertise_host);
  out.set_probe_port(probe_port);
  out.set_node(node);
  return out;
}

v1::WatchLatchesRequest MakeWatchLatchesRequest(const WorkerIdentity& identity, int rank,
                                                int64_t start_window) {
  v1::WatchLatchesRequest out;
  *out.mutable_identity() = ToProto(identity);
  out.set_rank(rank);
  out.set_start_window(start_window);
  return out;
}

v1::ReportStepRequest MakeReportStepRequest(const WorkerIdentity& identity, int rank,
                                            const StepReport& report) {
  v1::ReportStepRequest out = ToProto(report);
  *out.mutable_identity() = ToProto(identity);
  out.set_rank(rank);
  return out;
}

v1::ReportCheckpointRequest MakeReportCheckpointRequest(const WorkerIdentity& identity, int rank,
                                                        const CheckpointReport& report) {
  v1::ReportCheckpointRequest out = ToProto(report);
  *out.mutable_identity() = ToProto(identity);
  out.set_rank(rank);
  return out;
}

v1::HeartbeatRequest MakeHeartbeatRequest(const WorkerIdentity& identity, int rank,
                                          const RankPosition* position,
                                          const Reachability* reachability, bool want_peers,
                                          int probe_port) {
  v1::HeartbeatRequest out;
  *out.mutable_identity() = ToProto(identity);
  out.set_rank(rank);
  if (position) *out.mutable_position() = ToProto(*position);
  if (reachability) *out.mutable_reachability() = ToProto(*reachability);
  out.set_want_peers(want_peers);
  out.set_probe_port(probe_port);
  return out;
}

v1::Reachability ToProto(const Reachability& r) {
  v1::Reachability out;
  out.set_peers_version(r.peers_version);
  out.set_probed(r.probed);
  for (int rank : r.unreachable) out.add_unreachable_ranks(rank);
  out.set_unreachable_seconds(r.unreachable_seconds);
  return out;
}

Reachability FromProto(const v1::Reachability& r) {
  Reachability out;
  out.peers_version = r.peers_version();
  out.probed = r.probed();
  out.unreachable.assign(r.unreachable_ranks().begin(), r.unreachable_ranks().end());
  out.unreachable_seconds = std::max(0.0, r.unreachable_seconds());
  return out;
}

v1::ReportFailureRequest MakeReportFailureRequest(const WorkerIdentity& identity, int rank,
                                                  const std::string& message, bool permanent,
                                                  const std::string& reason) {
  v1::ReportFailureRequest out;
  *out.mutable_identity() = ToProto(identity);
  out.set_rank(rank);
  out.set_message(message);
  out.set_permanent(permanent);
  out.set_reason(reason);
  return out;
}

v1::WatchLatchesResponse MakeLatchMessage(const Latch& latch, absl::Time publish_time) {
  v1::WatchLatchesResponse out;
  *out.mutable_latch() = ToProto(latch);
  *out.mutable_latch()->mutable_publish_time() = ToProtoTime(publish_time);
  return out;
}

v1::WatchLatchesResponse MakeStopMessage(int64_t before_window) {
  v1::WatchLatchesResponse out;
  out.mutable_stop()->set_before_window(before_window);
  return out;
}

v1::LeaveRequest MakeLeaveRequest(const WorkerIdentity& identity, int rank,
                                  const std::string& reason) {
  v1::LeaveRequest out;
  *out.mutable_identity() = ToProto(identity);
  out.set_rank(rank);
  out.set_reason(reason);
  return out;
}

v1::WatchLatchesResponse MakeJobEndedMessage(JobState state, const std::string& reason) {
  v1::WatchLatchesResponse out;
  out.mutable_job_ended()->set_state(ToProto(state));
  out.mutable_job_ended()->set_reason(reason);
  return out;
}

void ToProto(const WorkerReply& reply, v1::ReportStepResponse* out) {
  out->set_duplicate(reply.duplicate);
  out->set_state(ToProto(reply.state));
}

void ToProto(const WorkerReply& reply, v1::HeartbeatResponse* out) {
  out->set_state(ToProto(reply.state));
  out->set_reason(reply.reason);
  out->set_attempt(reply.attempt);
  out->set_peers_version(reply.peers.version);
  out->set_stop(reply.stop);
  out->set_trace_request_id(reply.trace.id);
  out->set_trace_first_step(reply.trace.first_step);
  out->set_trace_last_step(reply.trace.last_step);
  for (const PeerAddress& p : reply.peers.peers) {
    v1::PeerAddress* a = out->add_peers();
    a->set_rank(p.rank);
    a->set_host(p.host);
    a->set_port(p.port);
  }
}

void ToProto(const WorkerReply& reply, v1::ReportFailureResponse* out) {
  out->set_state(ToProto(reply.state));
  out->set_attempt(reply.attempt);
}

void ToProto(const WorkerReply& reply, v1::ReportCheckpointResponse* out) {
  out->set_state(ToProto(reply.state));
}

void ToProto(const WorkerReply& reply, v1::LeaveResponse* out) {
  out->set_state(ToProto(reply.state));
  out->set_attempt(reply.attempt);
}

namespace {

JobState StateOf(v1::JobState state) { return FromProto(state).value_or(JobState::kPending); }

}  // namespace

WorkerReply FromProto(const v1::ReportStepResponse& reply) {
  WorkerReply out;
  out.state = StateOf(reply.state());
  out.duplicate = reply.duplicate();
  return out;
}

WorkerReply FromProto(const v1::HeartbeatResponse& reply) {
  WorkerReply out;
  out.state = StateOf(reply.state());
  out.reason = reply.reason();
  out.attempt = reply.attempt();
  out.peers.version = reply.peers_version();
  out.stop = reply.stop();
  out.trace = {reply.trace_request_id(), reply.trace_first_step(), reply.trace_last_step()};
  for (const v1::PeerAddress& p : reply.peers()) {
    out.peers.peers.push_back({p.rank(), p.host(), p.port()});
  }
  return out;
}

WorkerReply FromProto(const v1::ReportFailureResponse& reply) {
  WorkerReply out;
  out.state = StateOf(reply.state());
  out.attempt = reply.attempt();
  return out;
}

WorkerReply FromProto(const v1::LeaveResponse& reply) {
  WorkerReply out;
  out.state = StateOf(reply.state());
  out.attempt = reply.attempt();
  out.stop = true;
  return out;
}

WorkerReply FromProto(const v1::ReportCheckpointResponse& reply) {
  WorkerReply out;
  out.state = StateOf(reply.state());
  return out;
}

}  // namespace latchkey
