// The conversions of proto/wire.h that the adapters rely on beyond a field copy: phase names
// (one table, common/rank_position.h), the requests the server reads back, the workers' replies.
#include "proto/wire.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace latchkey {
namespace {

TEST(WireTest, PhaseNamesRoundTripAndUnknownReadsAsIdle) {
  for (const RankPhaseNameEntry& e : kRankPhaseNames) {
    EXPECT_EQ(RankPhaseFromName(RankPhaseName(e.phase)), e.phase) << e.name;
    RankPosition p;
    p.phase = e.phase;
    EXPECT_EQ(ToProto(p).phase(), e.name);
    EXPECT_EQ(FromProto(ToProto(p)).phase, e.phase);
  }
  EXPECT_EQ(RankPhaseFromName("sideways"), std::nullopt);
  EXPECT_EQ(RankPhaseFromName(""), std::nullopt);
  v1::RankPosition odd;
  odd.set_phase("sideways");
  EXPECT_EQ(FromProto(odd).phase, RankPhase::kIdle);
  RankPosition c;
  c.phase = RankPhase::kCollective;
  c.op = "all_reduce";
  c.group = "tp";
  c.seq = 57;
  EXPECT_EQ(WhereName(c), "all_reduce/tp #57");
  c.phase = RankPhase::kCheckpoint;
  EXPECT_EQ(WhereName(c), "checkpoint");
}

TEST(WireTest, SubmissionAndPolicyUpdateRoundTrip) {
  JobSubmission s;
  s.spec_json = "{}";
  s.base_dir = "/data";
  s.rendezvous_host = "h";
  s.rendezvous_port = 29501;
  s.job_id = "job-7";
  s.join_token_sha256 = "ab";
  const JobSubmission back = FromProto(ToProto(s));
  EXPECT_EQ(back.spec_json, s.spec_json);
  EXPECT_EQ(back.base_dir, s.base_dir);
  EXPECT_EQ(back.rendezvous_host, s.rendezvous_host);
  EXPECT_EQ(back.rendezvous_port, s.rendezvous_port);
  EXPECT_EQ(back.job_id, s.job_id);
  EXPECT_EQ(back.join_token_sha256, s.join_token_sha256);

  JobPolicyUpdate u;
  u.job_id = "job-7";
  u.kv_reduce = KvReducePolicy::kDeferred;
  u.gradient_accumulation_steps = 3;
  u.expected_generation = 2;
  auto ub = FromProto(ToProto(u));
  ASSERT_TRUE(ub.ok()) << ub.status();
  EXPECT_EQ(ub->job_id, "job-7");
  EXPECT_EQ(ub->kv_reduce, KvReducePolicy::kDeferred);
  EXPECT_EQ(ub->gradient_accumulation_steps, 3);
  EXPECT_EQ(ub->expected_generation, 2);
  auto unset = FromProto(ToProto(JobPolicyUpdate{"j", {}, {}, {}}));
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->kv_reduce || unset->gradient_accumulation_steps ||
               unset->expected_generation);
  v1::UpdateJobPolicyRequest bad;
  bad.set_kv_reduce(static_cast<v1::KvReducePolicy>(77));
  EXPECT_EQ(FromProto(bad).status().message(), "kv_reduce: 77 is not a policy");
}

TEST(WireTest, ListJobsStates) {
  auto states = JobStatesOf(MakeListJobsRequest({JobState::kRunning, JobState::kFailed}, 5));
  ASSERT_TRUE(states.ok());
  EXPECT_EQ(*states, (std::vector<JobState>{JobState::kRunning, JobState::kFailed}));
  v1::ListJobsRequest bad;
  bad.add_states(v1::JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(JobStatesOf(bad).status().message(), "states: 0 is not a job state");
  bad.set_states(0, static_cast<v1::JobState>(99));
  EXPECT_EQ(JobStatesOf(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, WorkerRequestsCarryIdentityAndRank) {
  const WorkerIdentity who{"job-1", "tok", "host:1", 3};
  const WorkerIdentity back = FromProto(ToProto(who));
  EXPECT_EQ(back.job_id, "job-1");
  EXPECT_EQ(back.join_token, "tok");
  EXPECT_EQ(back.worker_id, "host:1");
  EXPECT_EQ(back.attempt, 3);
  StepReport r;
  r.step = 4;
  r.kv_mode = KvMode::kDeferred;
  r.kv_allreduce_calls = 4;
  r.replicated_allreduce_calls = 18;
  const v1::ReportStepRequest step = MakeReportStepRequest(who, 2, r);
  EXPECT_EQ(step.identity().worker_id(), "host:1");
  EXPECT_EQ(step.rank(), 2);
  EXPECT_EQ(step.step(), 4);
  EXPECT_EQ(step.replicated_allreduce_calls(), 18);  // field 18
  const absl::StatusOr<StepReport> step_back = FromProto(step);
  ASSERT_TRUE(step_back.ok()) << step_back.status();
  EXPECT_EQ(step_back->kv_allreduce_calls, 4);
  EXPECT_EQ(step_back->replicated_allreduce_calls, 18);
  const v1::HeartbeatRequest hb = MakeHeartbeatRequest(who, 1, nullptr);
  EXPECT_FALSE(hb.has_position());
  const v1::JoinRequest join = MakeJoinRequest(who, 0, "10.0.0.1");
  EXPECT_TRUE(join.has_requested_rank());
  EXPECT_EQ(join.requested_rank().value(), 0);
  EXPECT_FALSE(MakeJoinRequest(who, std::nullopt, "").has_requested_rank());

  WorkerReply reply;
  reply.state = JobState::kRecovering;
  reply.reason = "why";
  reply.attempt = 4;
  v1::HeartbeatResponse hbr;
  ToProto(reply, &hbr);
  const WorkerReply hb_back = FromProto(hbr);
  EXPECT_EQ(hb_back.state, JobState::kRecovering);
  EXPECT_EQ(hb_back.reason, "why");
  EXPECT_EQ(hb_back.attempt, 4);
  reply.duplicate = true;
  v1::ReportStepResponse sr;
  ToProto(reply, &sr);
  EXPECT_TRUE(FromProto(sr).duplicate);
}

// The memory fields travel in ReportStep (16, 17, 19) and the step summary (12), beyond 32 bits.
TEST(WireTest, MemoryFieldsRoundTrip) {
  StepReport r;
  r.kv_mode = KvMode::kCoalesced;
  r.peak_memory_bytes = int64_t{3} << 34;
  r.activation_memory_bytes = (int64_t{1} << 33) + 7;
  r.reserved_memory_bytes = int64_t{5} << 34;
  const v1::ReportStepRequest wire = ToProto(r);
  EXPECT_EQ(wire.peak_memory_bytes(), int64_t{3} << 34);
  absl::StatusOr<StepReport> back = FromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->peak_memory_bytes, int64_t{3} << 34);
  EXPECT_EQ(back->activation_memory_bytes, (int64_t{1} << 33) + 7);
  EXPECT_EQ(back->reserved_memory_bytes, int64_t{5} << 34);
  CompletedStep step;
  step.report.peak_memory_bytes = int64_t{9} << 33;
  EXPECT_EQ(FromProto(ToProto(step)).report.peak_memory_bytes, int64_t{9} << 33);
}

// The time inside collectives travels in ReportStep (20): the status page's collective share.
TEST(WireTest, CollectiveSecondsRoundTrip) {
  StepReport r;
  r.kv_mode = KvMode::kCoalesced;
  r.step_seconds = 0.25;
  r.collective_seconds = 0.0625;
  const v1::ReportStepRequest wire = ToProto(r);
  EXPECT_EQ(wire.collective_seconds(), 0.0625);
  absl::StatusOr<StepReport> back = FromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->collective_seconds, 0.0625);
  EXPECT_EQ(back->step_seconds, 0.25);
}

}  // namespace
}  // namespace latchkey
