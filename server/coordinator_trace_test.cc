// The coordinator collecting a running job's trace (docs/observability.md "Traces"): GetTrace
// opens a request that each live rank hears with its heartbeat until it answered (PutTrace);
// the call returns the answers once every rank answered, or at its deadline naming the others;
// a stale or foreign answer is ignored; one request at a time per job; a job that is not
// running is refused (its ranks wrote their spans to the run folder).
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/sqlite_store.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

using testing::ScopedTempDir;
using testing::SpecJson;
using testing::SpecParams;

class CoordinatorTraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = SqliteStore::Open(dir_.path() + "/c.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto c = Coordinator::Create(*std::move(store), {}, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
    SpecParams p;
    p.tp = 1;
    p.world_size = 2;
    p.steps = 4;
    auto r = c_->SubmitJob({SpecJson(p), "", "", 0});
    ASSERT_TRUE(r.ok()) << r.status();
    job_ = r->job.record.job_id;
    token_ = r->join_token;
  }
  void JoinAll() {
    for (int i = 0; i < 2; ++i) {
      JoinArgs a;
      a.call = WorkerCall{job_, token_, "w" + std::to_string(i), -1};
      a.peer_host = "10.0.0." + std::to_string(i + 1);
      auto joined = c_->Join(a);
      ASSERT_TRUE(joined.ok()) << joined.status();
      calls_.push_back(WorkerCall{job_, token_, a.call.worker_id, joined->rank});
    }
    auto view = c_->GetJob(job_, false);
    ASSERT_TRUE(view.ok());
    ASSERT_EQ(view->record.state, JobState::kRunning);
  }
  TraceAsk Ask(int rank) {
    auto hb = c_->Heartbeat(calls_[static_cast<size_t>(rank)]);
    EXPECT_TRUE(hb.ok()) << hb.status();
    return hb.ok() ? hb->trace : TraceAsk{};
  }
  // Heartbeats of `rank` until it hears a request (the collector opens it on its thread).
  TraceAsk AwaitAsk(int rank) {
    for (int i = 0; i < 2000; ++i) {
      TraceAsk a = Ask(rank);
      if (a.id != 0) return a;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "rank " << rank << " never heard a trace request";
    return {};
  }

  ScopedTempDir dir_;
  std::unique_ptr<Coordinator> c_;
  std::string job_, token_;
  std::vector<WorkerCall> calls_;
};

TEST_F(CoordinatorTraceTest, EveryLiveRankAnswersThroughItsHeartbeats) {
  JoinAll();
  EXPECT_EQ(Ask(0).id, 0);  // no request open
  absl::StatusOr<TraceAnswers> got;
  std::thread collector([&] { got = c_->CollectTrace(job_, 2, 3, absl::Seconds(30)); });
  const TraceAsk a0 = AwaitAsk(0);
  EXPECT_EQ(a0.first_step, 2);
  EXPECT_EQ(a0.last_step, 3);
  EXPECT_TRUE(c_->PutTrace(calls_[0], a0.id + 1, "stale\n").ok());  // another request: ignored
  EXPECT_TRUE(c_->PutTrace(calls_[0], a0.id, "rank 0 spans\n").ok());
  EXPECT_EQ(Ask(0).id, 0);  // answered: not asked again
  const TraceAsk a1 = AwaitAsk(1);
  EXPECT_EQ(a1.id, a0.id);
  EXPECT_EQ(c_->CollectTrace(job_, 0, -1, absl::Seconds(1)).status().code(),
            absl::StatusCode::kAborted);  // one request at a time
  EXPECT_TRUE(c_->PutTrace(calls_[1], a1.id, "rank 1 spans\n").ok());
  collector.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->answers.size(), 2u);
  EXPECT_EQ(got->answers[0], "rank 0 spans\n");
  EXPECT_EQ(got->answers[1], "rank 1 spans\n");
  EXPECT_TRUE(got->missing.empty());
  EXPECT_EQ(Ask(1).id, 0);  // closed
  // An answer after the request closed changes nothing.
  EXPECT_TRUE(c_->PutTrace(calls_[1], a1.id, "late\n").ok());
}

TEST_F(CoordinatorTraceTest, ARankThatDoesNotAnswerIsNamedAtTheDeadline) {
  JoinAll();
  absl::StatusOr<TraceAnswers> got;
  const absl::Time start = absl::Now();
  std::thread collector([&] { got = c_->CollectTrace(job_, 0, -1, absl::Milliseconds(300)); });
  const TraceAsk a = AwaitAsk(1);
  EXPECT_TRUE(c_->PutTrace(calls_[1], a.id, "rank 1\n").ok());
  collector.join();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->answers.size(), 1u);
  EXPECT_EQ(got->answers.count(1), 1u);
  EXPECT_EQ(got->missing, std::vector<int>{0});
  // The next request is a new one.
  std::thread again([&] { got = c_->CollectTrace(job_, 0, -1, absl::Milliseconds(100)); });
  const TraceAsk b = AwaitAsk(0);
  EXPECT_GT(b.id, a.id);
  again.join();
}

TEST_F(CoordinatorTraceTest, AJobThatIsNotRunningIsRefused) {
  absl::StatusOr<TraceAnswers> pending = c_->CollectTrace(job_, 0, -1, absl::Seconds(1));
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pending.status().message().find("--run-dir"), std::string::npos) << pending.status();
  EXPECT_EQ(c_->CollectTrace("no-such-job", 0, -1, absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace latchkey
