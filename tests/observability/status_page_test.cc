// The status page's tables for a job driven through an in-process coordinator, as its workers
// would drive it: the job list shows the newest evaluation (not "-" once one ran) and a diverged
// step's loss as NaN; a job's page shows the accumulation steps its windows run with after
// `latchkey update --gas`, labels the attempts' as the layout's, writes "spec" for a policy that
// keeps the spec's, "–" for no resume step and no checkpoint, and lists a cancel among the
// events.
#include "server/status_page.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/coordinator.h"
#include "server/sqlite_store.h"
#include "tests/support/specs.h"

namespace latchkey::testing {
namespace {

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

class StatusPageTables : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = SqliteStore::Open(":memory:");
    ASSERT_TRUE(store.ok()) << store.status();
    auto core = Coordinator::Create(*std::move(store), {}, nullptr);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
    SpecParams p;  // TP 2, world 2, gradient_accumulation_steps 4
    p.steps = 8;
    auto job = core_->SubmitJob({SpecJson(p), "", "", 0});
    ASSERT_TRUE(job.ok()) << job.status();
    id_ = job->job.record.job_id;
    for (int i = 0; i < 2; ++i) {
      JoinArgs a;
      a.call = {id_, job->join_token, "w" + std::to_string(i), -1, 0};
      a.requested_rank = i;
      a.peer_host = "127.0.0.1";
      auto r = core_->Join(a);
      ASSERT_TRUE(r.ok()) << r.status();
      calls_.push_back({id_, job->join_token, a.call.worker_id, r->rank, r->attempt});
    }
    page_ = std::make_unique<StatusPage>(core_.get(), nullptr);
  }

  // Every rank reports `step` with `loss` (and `eval_loss` where given).
  void Step(int64_t step, double loss, std::optional<double> eval_loss = std::nullopt) {
    for (const WorkerCall& call : calls_) {
      StepReportRecord r;
      r.report.step = step;
      r.report.loss = loss;
      r.report.grad_norm = std::isfinite(loss) ? 1.5 : loss;
      r.report.eval_loss = eval_loss;
      r.report.micro_batches = 4;
      r.report.tokens = 256;
      r.report.step_seconds = 0.5;
      auto done = core_->ReportStep(call, r);
      ASSERT_TRUE(done.ok()) << "step " << step << ": " << done.status();
    }
  }

  std::string IndexRow() {
    const HttpResponse index = page_->Index(HttpRequest{"/", {}, ""});
    EXPECT_EQ(index.status, 200);
    const size_t at = index.body.find("href=\"/jobs/" + id_ + "\"");
    if (at == std::string::npos) return "";
    return index.body.substr(at, index.body.find("</tr>", at) - at);
  }
  std::string JobPage() {
    const HttpResponse job = page_->Job(HttpRequest{"/jobs/" + id_, {id_}, ""});
    EXPECT_EQ(job.status, 200) << job.body;
    return job.body;
  }

  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<StatusPage> page_;
  std::string id_;
  std::vector<WorkerCall> calls_;
};

TEST_F(StatusPageTables, JobListShowsTheNewestEvaluationAndANonFiniteLoss) {
  Step(0, 5.5, 5.25);
  Step(1, 5.0);  // no evaluation in the last step: the list still shows step 0's
  std::string row = IndexRow();
  EXPECT_TRUE(Has(row, "<td>5.0000</td><td>5.2500 (step 0)</td>")) << row;
  Step(2, std::nan(""));
  row = IndexRow();
  EXPECT_TRUE(Has(row, "<td>NaN</td><td>5.2500 (step 0)</td>")) << row;
  const std::string job = JobPage();
  EXPECT_TRUE(Has(job, "last step 2: loss NaN, grad_norm NaN,")) << job;
}

TEST_F(StatusPageTables, JobPageShowsTheWindowsAccumulationAndNoneForMissingSteps) {
  std::string job = JobPage();
  EXPECT_TRUE(Has(job, "<span id=\"gas\">gradient accumulation steps 4 (the layout's)</span>"))
      << job;
  EXPECT_TRUE(Has(job, "last checkpoint step –,")) << job;
  EXPECT_TRUE(Has(job, "<th>layout's gradient_accumulation_steps</th>")) << job;
  // Attempt 1 of world 2 = tp 2 x dp 1, 4 accumulation steps, resumed from no checkpoint.
  EXPECT_TRUE(Has(job, "<tr><td>1</td><td>2</td><td>2</td><td>1</td><td>4</td><td>–</td>")) << job;

  JobPolicyUpdate kv;
  kv.job_id = id_;
  kv.kv_reduce = KvReducePolicy::kPerMicroBatch;
  ASSERT_TRUE(core_->UpdateJobPolicy(kv).ok());
  JobPolicyUpdate gas;
  gas.job_id = id_;
  gas.gradient_accumulation_steps = 2;
  ASSERT_TRUE(core_->UpdateJobPolicy(gas).ok());
  job = JobPage();
  EXPECT_TRUE(
      Has(job, "<span id=\"gas\">gradient accumulation steps 2 (policy generation 2)</span>"))
      << job;
  // The first change kept the spec's accumulation steps, the second set 2.
  EXPECT_TRUE(Has(job, "<tr><td>1</td><td>per_micro_batch</td><td>spec</td>")) << job;
  EXPECT_TRUE(Has(job, "<tr><td>2</td><td>per_micro_batch</td><td>2</td>")) << job;
  // The attempts table keeps the layout's, labelled so.
  EXPECT_TRUE(Has(job, "<tr><td>1</td><td>2</td><td>2</td><td>1</td><td>4</td><td>–</td>")) << job;
}

TEST_F(StatusPageTables, CancelIsListedAmongTheEvents) {
  Step(0, 5.5);
  ASSERT_TRUE(core_->CancelJob(id_, "cancelled from the status page test").ok());
  const std::string job = JobPage();
  const size_t events = job.find("<table id=\"events\">");
  ASSERT_NE(events, std::string::npos) << job;
  EXPECT_TRUE(
      Has(job.substr(events), "<td>cancel</td><td>cancelled from the status page test</td>"))
      << job;
}

}  // namespace
}  // namespace latchkey::testing
