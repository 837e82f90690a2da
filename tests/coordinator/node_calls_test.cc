// A node agent's calls (docs/protocol.md "Node calls") against an in-process coordinator over
// real gRPC: NodeHeartbeat and ReportSteps answer each entry as its own call would be (a
// refused entry gets its own code while the others go on; a repeated report is a duplicate),
// and the relay of `latchkey node` (client/node_relay.h) forwards its local ranks' calls in one
// node call, hands each rank its own outcome with the error's reason, and does not hold a lone
// rank longer than its wait.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/node_relay.h"
#include "common/error_info.h"
#include "proto/grpc_status.h"
#include "tests/coordinator/grpc_fixture.h"

namespace latchkey::testing {
namespace {

class NodeCallsTest : public CoordinatorRpcTest {
 protected:
  // A two-rank job (TP 2) with ranks 0 ("a") and 1 ("b") joined: it runs.
  void SetUp() override {
    CoordinatorRpcTest::SetUp();
    SpecParams p;
    p.steps = 3;
    job_ = Submit(p);
    for (int r = 0; r < 2; ++r) {
      v1::JoinRequest req;
      *req.mutable_identity() = Id(job_, Worker(r));
      req.mutable_requested_rank()->set_value(r);
      v1::JoinResponse resp;
      ASSERT_TRUE(workers_->Join(Ctx().get(), req, &resp).ok());
      attempt_ = resp.attempt();
    }
  }
  static std::string Worker(int rank) { return rank == 0 ? "a" : "b"; }

  v1::HeartbeatRequest Beat(int rank) {
    v1::HeartbeatRequest hb;
    *hb.mutable_identity() = Id(job_, Worker(rank), attempt_);
    hb.set_rank(rank);
    return hb;
  }
  v1::ReportStepRequest Report(int rank, int64_t step, int64_t generation = 0) {
    v1::ReportStepRequest req;
    *req.mutable_identity() = Id(job_, Worker(rank), attempt_);
    req.set_rank(rank);
    req.set_step(step);
    req.set_kv_mode(v1::KV_MODE_COALESCED);
    req.set_latch_generation(generation);
    req.set_loss(2.0);
    req.set_tokens(256);
    req.set_step_seconds(0.5);
    return req;
  }

  v1::SubmitJobResponse job_;
  int64_t attempt_ = 0;
};

TEST_F(NodeCallsTest, EachEntryIsAnsweredAsItsOwnCallWouldBe) {
  v1::NodeHeartbeatRequest hb;
  hb.set_node("node-a");
  *hb.add_heartbeats() = Beat(0);
  *hb.add_heartbeats() = Beat(1);
  v1::HeartbeatRequest bad = Beat(1);
  bad.mutable_identity()->set_join_token("x");
  *hb.add_heartbeats() = bad;
  v1::NodeHeartbeatResponse hr;
  ASSERT_TRUE(workers_->NodeHeartbeat(Ctx().get(), hb, &hr).ok());
  ASSERT_EQ(hr.statuses_size(), 3);
  ASSERT_EQ(hr.responses_size(), 3);
  EXPECT_EQ(hr.statuses(0).code(), 0);
  EXPECT_EQ(hr.statuses(1).code(), 0);
  EXPECT_EQ(hr.responses(0).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(hr.statuses(2).code(), grpc::StatusCode::UNAUTHENTICATED);

  v1::ReportStepsRequest rs;
  rs.set_node("node-a");
  *rs.add_reports() = Report(0, 0);
  *rs.add_reports() = Report(1, 0);
  v1::ReportStepsResponse rr;
  ASSERT_TRUE(workers_->ReportSteps(Ctx().get(), rs, &rr).ok());
  ASSERT_EQ(rr.statuses_size(), 2);
  EXPECT_EQ(rr.statuses(0).code(), 0);
  EXPECT_EQ(rr.statuses(1).code(), 0);
  EXPECT_FALSE(rr.responses(0).duplicate());

  // Again: both duplicates. With a report under a stale generation: ABORTED, with its reason
  // in the details, while the other entry is recorded.
  rs.mutable_reports(1)->set_step(1);
  *rs.add_reports() = Report(0, 1, /*generation=*/7);
  ASSERT_TRUE(workers_->ReportSteps(Ctx().get(), rs, &rr).ok());
  ASSERT_EQ(rr.statuses_size(), 3);
  EXPECT_EQ(rr.statuses(0).code(), 0);
  EXPECT_TRUE(rr.responses(0).duplicate());
  EXPECT_EQ(rr.statuses(1).code(), 0);
  EXPECT_FALSE(rr.responses(1).duplicate());
  EXPECT_EQ(rr.statuses(2).code(), grpc::StatusCode::ABORTED) << rr.statuses(2).message();

  v1::ReportStepsRequest none;
  EXPECT_EQ(workers_->ReportSteps(Ctx().get(), none, &rr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(NodeCallsTest, TheRelayForwardsItsRanksInOneNodeCallAndEachHearsItsOwnOutcome) {
  NodeRelayOptions o;
  o.listen = absl::StrCat("unix-abstract:latchkey-node-calls-test-", getpid());
  o.node = "node-a";
  o.local_ranks = 2;
  o.heartbeat_wait = absl::Seconds(5);  // both ranks' heartbeats make one call
  o.report_wait = absl::Milliseconds(200);
  auto relay = NodeRelay::Start(o, MakeCoordinatorChannel(server_->address()));
  ASSERT_TRUE(relay.ok()) << relay.status();
  auto via =
      v1::WorkerService::NewStub(grpc::CreateChannel(o.listen, grpc::InsecureChannelCredentials()));

  // Two ranks' heartbeats at once: one node call, each answered.
  std::vector<grpc::Status> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      v1::HeartbeatResponse resp;
      got[static_cast<size_t>(r)] = via->Heartbeat(Ctx().get(), Beat(r), &resp);
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_TRUE(got[0].ok()) << got[0].error_message();
  EXPECT_TRUE(got[1].ok()) << got[1].error_message();
  NodeRelayCounts n = (*relay)->counts();
  EXPECT_EQ(n.node_heartbeats, 1);
  EXPECT_EQ(n.heartbeats, 2);

  // A lone rank's report goes after the report wait, not later; a refused one (fenced) keeps
  // its code and its reason (the details travel through the relay).
  const auto t0 = std::chrono::steady_clock::now();
  v1::ReportStepResponse resp;
  grpc::Status st = via->ReportStep(Ctx().get(), Report(0, 0), &resp);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 2.0);
  v1::ReportStepRequest fenced = Report(1, 0);
  fenced.mutable_identity()->set_attempt(attempt_ + 4);  // an attempt the job never had
  st = via->ReportStep(Ctx().get(), fenced, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED);
  const absl::Status back = FromGrpcStatus(st);
  EXPECT_TRUE(HasErrorReason(back, error_reason::kAttemptFenced)) << back;
  n = (*relay)->counts();
  EXPECT_EQ(n.report_calls, 2);
  EXPECT_EQ(n.reports, 2);
}

}  // namespace
}  // namespace latchkey::testing
