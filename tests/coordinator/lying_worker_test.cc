// A worker with the job's join token that lies, over the real gRPC API (docs/fault-tolerance.md
// "A worker that lies"): a report for a rank it does not hold, for a step not reached or past the
// job, a step sent again with other numbers, an oversized report, and the same for checkpoints.
// Each is refused with the code the docs name and recorded in the job's audit (ListLatches'
// events, kind "refused_report"); the job is unharmed: what was stored stays, and it runs on to
// its end.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"

namespace latchkey::testing {
namespace {

constexpr int kSteps = 6;

class LyingWorkerTest : public CoordinatorRpcTest {
 protected:
  // A job of two ranks with every rank held: "a" rank 0, "b" rank 1; latches 0 and 1 published.
  void SetUp() override {
    CoordinatorRpcTest::SetUp();
    SpecParams p;
    p.steps = kSteps;
    job_ = Submit(p);
    for (const std::string worker : {"a", "b"}) {
      v1::JoinRequest req;
      *req.mutable_identity() = Id(job_, worker);
      v1::JoinResponse resp;
      ASSERT_TRUE(workers_->Join(Ctx().get(), req, &resp).ok()) << worker;
    }
  }

  v1::ReportStepRequest Step(const std::string& worker, int rank, int64_t step, double loss = 2.0) {
    v1::ReportStepRequest req;
    *req.mutable_identity() = Id(job_, worker);
    req.set_rank(rank);
    req.set_step(step);
    req.set_kv_mode(v1::KV_MODE_COALESCED);
    req.set_loss(loss);
    req.set_tokens(256);
    req.set_step_seconds(0.5);
    (*req.mutable_collective_calls())["all_reduce/tp"] = 96;
    return req;
  }

  grpc::Status Send(const v1::ReportStepRequest& req, v1::ReportStepResponse* resp = nullptr) {
    v1::ReportStepResponse unused;
    return workers_->ReportStep(Ctx().get(), req, resp ? resp : &unused);
  }

  grpc::Status Checkpoint(const std::string& worker, int rank, int64_t step,
                          const std::string& sha) {
    v1::ReportCheckpointRequest req;
    *req.mutable_identity() = Id(job_, worker);
    req.set_rank(rank);
    req.set_step(step);
    req.set_manifest_sha256(sha);
    req.set_bytes(1024);
    v1::ReportCheckpointResponse resp;
    return workers_->ReportCheckpoint(Ctx().get(), req, &resp);
  }

  // The messages of the job's "refused_report" events, in order.
  std::vector<std::string> Refusals() {
    v1::ListLatchesRequest req;
    req.set_job_id(job_.job_id());
    v1::ListLatchesResponse resp;
    EXPECT_TRUE(jobs_->ListLatches(Ctx().get(), req, &resp).ok());
    std::vector<std::string> out;
    for (const v1::JobEvent& e : resp.events()) {
      if (e.kind() == "refused_report") out.push_back(e.message());
    }
    return out;
  }

  // The newest refusal contains `text` and one was recorded for this call.
  void ExpectRecorded(size_t before, const std::string& text) {
    const std::vector<std::string> now = Refusals();
    ASSERT_EQ(now.size(), before + 1) << text;
    EXPECT_NE(now.back().find(text), std::string::npos) << now.back();
  }

  v1::Job Job() {
    v1::GetJobRequest req;
    req.set_job_id(job_.job_id());
    v1::GetJobResponse resp;
    EXPECT_TRUE(jobs_->GetJob(Ctx().get(), req, &resp).ok());
    return resp.job();
  }

  // Both ranks report steps [from, kSteps) honestly; the job ends SUCCEEDED.
  void RunToTheEnd(int64_t from) {
    for (int64_t s = from; s < kSteps; ++s) {
      ASSERT_TRUE(Send(Step("a", 0, s)).ok()) << s;
      ASSERT_TRUE(Send(Step("b", 1, s)).ok()) << s;
    }
    EXPECT_EQ(Job().state(), v1::JOB_STATE_SUCCEEDED);
  }

  v1::SubmitJobResponse job_;
};

TEST_F(LyingWorkerTest, ReportStepForARankNotHeldIsRefusedAndAudited) {
  // Another worker's rank: ABORTED, as a survivor of a lost rank hears it.
  EXPECT_EQ(Send(Step("a", 1, 0)).error_code(), grpc::StatusCode::ABORTED);
  ExpectRecorded(0,
                 "ReportStep of step 0 from worker a as rank 1 refused (ABORTED): rank 1 of job " +
                     job_.job_id() + " is held by worker b, not a");
  // A rank past the world: INVALID_ARGUMENT.
  EXPECT_EQ(Send(Step("a", 7, 0)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectRecorded(1, "as rank 7 refused (INVALID_ARGUMENT): rank: 7 is outside [0, 2)");
  // Rank 1's step 0 was not stored by the lie: b's own report is the first.
  v1::ReportStepResponse resp;
  ASSERT_TRUE(Send(Step("b", 1, 0), &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  RunToTheEnd(0);
}

TEST_F(LyingWorkerTest, ReportStepForAStepNotReachedOrPastTheJobIsRefusedAndAudited) {
  // Latches 0 and 1 are published: step 4 has not been reached by anyone.
  EXPECT_EQ(Send(Step("a", 0, 4)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectRecorded(0,
                 "ReportStep of step 4 from worker a as rank 0 refused (FAILED_PRECONDITION): "
                 "step: latch(4) is not published yet");
  EXPECT_EQ(Send(Step("a", 0, 1'000'000)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectRecorded(1, "step: 1000000 is outside [0, 6)");
  EXPECT_EQ(Send(Step("a", 0, -1)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectRecorded(2, "step: -1 is outside [0, 6)");
  EXPECT_EQ(Job().steps_completed(), 0);
  RunToTheEnd(0);
}

TEST_F(LyingWorkerTest, AStepSentAgainWithOtherNumbersIsRefusedAndTheFirstIsKept) {
  ASSERT_TRUE(Send(Step("a", 0, 0, 2.0)).ok());
  EXPECT_EQ(Send(Step("a", 0, 0, 3.0)).error_code(), grpc::StatusCode::ABORTED);
  ExpectRecorded(0,
                 "ReportStep of step 0 from worker a as rank 0 refused (ABORTED): step 0 was "
                 "reported by rank 0 in attempt 1 with loss 2,");
  v1::ReportStepRequest more_tokens = Step("a", 0, 0, 2.0);
  more_tokens.set_tokens(4096);
  EXPECT_EQ(Send(more_tokens).error_code(), grpc::StatusCode::ABORTED);
  ExpectRecorded(1, "tokens 4096 (the first report is kept)");
  // The report itself, sent again (a retry after a lost answer): a duplicate, so the stored
  // numbers are still the first ones.
  v1::ReportStepResponse resp;
  ASSERT_TRUE(Send(Step("a", 0, 0, 2.0), &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  RunToTheEnd(0);
  EXPECT_EQ(Refusals().size(), 2u);  // the honest reports left no trace there
}

TEST_F(LyingWorkerTest, OversizedReportsAreRefused) {
  v1::ReportStepRequest many = Step("a", 0, 0);
  for (int i = 0; i < 5000; ++i) (*many.mutable_collective_calls())["op" + std::to_string(i)] = 1;
  EXPECT_EQ(Send(many).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectRecorded(0, "collective_calls: 5001 keys, more than 1024");
  v1::ReportStepRequest long_key = Step("a", 0, 0);
  (*long_key.mutable_collective_calls())[std::string(512 << 10, 'k')] = 1;
  EXPECT_EQ(Send(long_key).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectRecorded(1, "collective_calls: a key of 524288 bytes, longer than 256");
  // Over the server's receive bound (1 MiB): gRPC refuses it before it is read, so no job is
  // known to record it against.
  v1::ReportStepRequest too_big = Step("a", 0, 0);
  (*too_big.mutable_collective_calls())[std::string(2 << 20, 'k')] = 1;
  EXPECT_EQ(Send(too_big).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Refusals().size(), 2u);
  EXPECT_EQ(Checkpoint("a", 0, 0, std::string(300, 'f')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ExpectRecorded(2, "manifest_sha256: 300 bytes, longer than 256");
  RunToTheEnd(0);
}

TEST_F(LyingWorkerTest, CheckpointLiesAreRefusedAndTheRecordedOneIsKept) {
  const std::string first(64, 'a');
  const std::string other(64, 'b');
  ASSERT_TRUE(Send(Step("a", 0, 0)).ok());
  ASSERT_TRUE(Send(Step("b", 1, 0)).ok());  // latches 0 .. 2 published
  EXPECT_EQ(Checkpoint("a", 1, 0, first).error_code(), grpc::StatusCode::ABORTED);
  ExpectRecorded(0, "ReportCheckpoint of step 0 from worker a as rank 1 refused (ABORTED)");
  EXPECT_EQ(Checkpoint("a", 0, 5, first).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectRecorded(1,
                 "ReportCheckpoint of step 5 from worker a as rank 0 refused "
                 "(FAILED_PRECONDITION): step: latch(5) is not published yet");
  EXPECT_EQ(Job().last_checkpoint_step(), -1);  // the resume point did not move

  ASSERT_TRUE(Checkpoint("a", 0, 0, first).ok());
  ASSERT_TRUE(Checkpoint("a", 0, 0, first).ok());  // a retry
  // A save of the same step again (a rank that re-ran it; the folder holds the newer save):
  // it replaces the recorded one, as the resume point's SHA-256 too.
  ASSERT_TRUE(Checkpoint("a", 0, 0, other).ok());
  EXPECT_EQ(Job().last_checkpoint_step(), 0);
  RunToTheEnd(1);
}

// A worker that lies without end cannot grow the audit without end.
TEST_F(LyingWorkerTest, RefusalsRecordedPerAttemptAreBounded) {
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(Send(Step("a", 0, 4)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  const std::vector<std::string> recorded = Refusals();
  ASSERT_EQ(recorded.size(), 20u);
  EXPECT_NE(recorded.back().find("the later refusals of attempt 1 are not recorded"),
            std::string::npos)
      << recorded.back();
  RunToTheEnd(0);
}

}  // namespace
}  // namespace latchkey::testing
