// proto/wire.h: the fault-tolerance messages (rank positions, stall verdicts, arrival lag, job
// events, checkpoint reports).
#include <algorithm>
#include <utility>

#include "proto/wire.h"

namespace latchkey {

// Inside namespace latchkey, v1 names latchkey::v1 (the generated code).

namespace {

constexpr RankPhase kAllPhases[] = {RankPhase::kIdle,       RankPhase::kLatch,
                                    RankPhase::kCompute,    RankPhase::kCollective,
                                    RankPhase::kCheckpoint, RankPhase::kEval};

}  // namespace

const char* RankPhaseName(RankPhase phase) {
  switch (phase) {
    case RankPhase::kIdle:
      return "idle";
    case RankPhase::kLatch:
      return "latch";
    case RankPhase::kCompute:
      return "compute";
    case RankPhase::kCollective:
      return "collective";
    case RankPhase::kCheckpoint:
      return "checkpoint";
    case RankPhase::kEval:
      return "eval";
  }
  return "idle";
}

std::optional<RankPhase> RankPhaseFromName(const std::string& name) {
  for (RankPhase p : kAllPhases) {
    if (name == RankPhaseName(p)) return p;
  }
  return std::nullopt;
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
  return out;
}

v1::StalledRank ToProto(const StalledRank& s) {
  v1::StalledRank out;
  out.set_rank(s.rank);
  out.set_window(s.window);
  out.set_micro_batch(s.micro_batch);
  out.set_where(s.where);
  out.set_seconds(s.seconds);
  out.set_attempt(s.attempt);
  return out;
}

StalledRank FromProto(const v1::StalledRank& s) {
  StalledRank out;
  out.rank = s.rank();
  out.window = s.window();
  out.micro_batch = s.micro_batch();
  out.where = s.where();
  out.seconds = s.seconds();
  out.attempt = s.attempt();
  return out;
}

v1::WindowArrival ToProto(const WindowArrival& a) {
  v1::WindowArrival out;
  out.set_window(a.window);
  out.set_slowest_rank(a.slowest_rank);
  out.set_lag_seconds(a.lag_seconds);
  return out;
}

WindowArrival FromProto(const v1::WindowArrival& a) {
  WindowArrival out;
  out.window = a.window();
  out.slowest_rank = a.slowest_rank();
  out.lag_seconds = a.lag_seconds();
  return out;
}

v1::JobEvent ToProto(const AuditedEvent& e) {
  v1::JobEvent out;
  if (e.time != absl::UnixEpoch()) *out.mutable_time() = ToProtoTime(e.time);
  out.set_attempt(e.attempt);
  out.set_kind(e.kind);
  out.set_message(e.message);
  return out;
}

AuditedEvent FromProto(const v1::JobEvent& e) {
  AuditedEvent out;
  if (e.has_time()) out.time = FromProtoTime(e.time());
  out.attempt = e.attempt();
  out.kind = e.kind();
  out.message = e.message();
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

}  // namespace latchkey
