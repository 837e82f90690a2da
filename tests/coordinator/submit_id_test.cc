// SubmitJob with a client-chosen job id and join-token hash (how a Kubernetes deployment names
// its job before it exists): created as asked, idempotent for the same request, ALREADY_EXISTS
// for a different one, INVALID_ARGUMENT naming the field for a bad id or hash; kept across a
// restart of the real latchkey-coordinator; `latchkey submit --job-id --join-token-file`.
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "client/credentials.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

constexpr char kToken[] = "a-join-token-chosen-by-the-deployment";

class SubmitIdTest : public CoordinatorRpcTest {
 protected:
  grpc::Status SubmitAs(const std::string& job_id, const std::string& hash,
                        v1::SubmitJobResponse* resp, const SpecParams& p = {}) {
    v1::SubmitJobRequest req;
    req.set_spec_json(SpecJson(p));
    req.set_job_id(job_id);
    req.set_join_token_sha256(hash);
    return jobs_->SubmitJob(Ctx().get(), req, resp);
  }
  int JobCount() {
    v1::ListJobsResponse listed;
    EXPECT_TRUE(jobs_->ListJobs(Ctx().get(), v1::ListJobsRequest(), &listed).ok());
    return listed.jobs_size();
  }
};

TEST_F(SubmitIdTest, ChosenIdAndTokenHashAreIdempotentForTheSameSpec) {
  const std::string hash = Sha256Hex(kToken);
  v1::SubmitJobResponse first;
  ASSERT_TRUE(SubmitAs("train-7b", hash, &first).ok());
  EXPECT_EQ(first.job_id(), "train-7b");
  EXPECT_EQ(first.job().job_id(), "train-7b");
  EXPECT_TRUE(first.join_token().empty());  // the client holds the token, not the coordinator
  EXPECT_FALSE(first.already_submitted());

  // A worker joins with the token whose hash was submitted; a different token is refused.
  v1::JoinRequest join;
  join.mutable_identity()->set_job_id("train-7b");
  join.mutable_identity()->set_join_token(kToken);
  join.mutable_identity()->set_worker_id("w0");
  join.mutable_requested_rank()->set_value(1);
  v1::JoinResponse joined;
  grpc::Status st = workers_->Join(Ctx().get(), join, &joined);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(joined.rank(), 1);
  join.mutable_identity()->set_join_token("another-token");
  join.mutable_identity()->set_worker_id("w1");
  EXPECT_EQ(workers_->Join(Ctx().get(), join, &joined).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // The same request again (the hash in capitals is the same hash): the same job, nothing new.
  v1::SubmitJobResponse again;
  st = SubmitAs("train-7b", absl::AsciiStrToUpper(hash), &again);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(again.job_id(), "train-7b");
  EXPECT_TRUE(again.already_submitted());
  EXPECT_EQ(again.job().workers_joined(), 1);  // the job as it is now
  EXPECT_EQ(JobCount(), 1);

  // A different spec or token under the same id: ALREADY_EXISTS naming the id and the field.
  SpecParams other;
  other.steps = 11;
  st = SubmitAs("train-7b", hash, &again, other);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(st.error_message().find("job_id: 'train-7b'"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("spec_json"), std::string::npos) << st.error_message();
  st = SubmitAs("train-7b", Sha256Hex("another-token"), &again);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(st.error_message().find("join_token_sha256"), std::string::npos) << st.error_message();
  EXPECT_EQ(JobCount(), 1);

  // An id without a hash: the coordinator draws the token and returns it once.
  v1::SubmitJobResponse drawn;
  ASSERT_TRUE(SubmitAs("eval-run", "", &drawn).ok());
  EXPECT_EQ(drawn.job_id(), "eval-run");
  EXPECT_EQ(drawn.join_token().size(), 32u);
  ASSERT_TRUE(SubmitAs("eval-run", "", &again).ok());
  EXPECT_TRUE(again.already_submitted());
  EXPECT_TRUE(again.join_token().empty());
  // Coordinator-assigned ids go on after the chosen ones and never collide with them.
  v1::SubmitJobResponse assigned = Submit();
  EXPECT_EQ(assigned.job_id(), "job-000003");
  EXPECT_EQ(JobCount(), 3);
}

TEST_F(SubmitIdTest, BadIdsAndHashesAreRefusedNamingTheField) {
  const std::string hash = Sha256Hex(kToken);
  v1::SubmitJobResponse resp;
  for (const std::string& id : std::vector<std::string>{
           "Train", "-train", "train-", "train_7b", "a.b", "job-000001", std::string(64, 'a')}) {
    grpc::Status st = SubmitAs(id, hash, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_EQ(st.error_message().rfind("job_id: ", 0), 0u) << id << ": " << st.error_message();
  }
  for (const std::string& bad : std::vector<std::string>{std::string("abc"), hash.substr(1),
                                                         hash + "0", std::string(63, 'f') + "g"}) {
    grpc::Status st = SubmitAs("train", bad, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_EQ(st.error_message().rfind("join_token_sha256: ", 0), 0u) << st.error_message();
  }
  EXPECT_EQ(JobCount(), 0);
  // Accepted forms: one character, 63 characters, job- without only digits after it.
  for (const std::string& id :
       std::vector<std::string>{"a", std::string(63, 'b'), "job-7b", "job-1a"}) {
    grpc::Status st = SubmitAs(id, hash, &resp);
    EXPECT_TRUE(st.ok()) << id << ": " << st.error_message();
  }
}

TEST(SubmitIdCliTest, SubmitWithJobIdAndTokenFileSurvivesARestart) {
  ScopedTempDir dir("submit-id");
  const std::string spec = dir / "spec.json";
  const std::string token_file = dir / "join-token";
  std::ofstream(spec) << SpecJson();
  std::ofstream(token_file) << kToken << "\n";
  const std::string db = dir / "coord.db";
  auto cli = [](const CoordinatorProcess& proc, std::vector<std::string> args) {
    args.insert(args.begin(), {CliBinary(), "--coordinator", proc.address(), "--timeout", "5"});
    return RunAndCapture(args, std::chrono::seconds(30));
  };
  int port = 0;
  {
    CoordinatorProcess proc(db);
    ASSERT_TRUE(proc.Start());
    port = proc.grpc_port();
    Captured r =
        cli(proc, {"submit", spec, "--job-id", "deploy-1", "--join-token-file", token_file});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("job_id: deploy-1"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("join_token:"), std::string::npos) << r.output;  // never shown
    // --join-token-sha256 names the same token; --json shows already_submitted.
    r = cli(proc, {"--json", "submit", spec, "--job-id", "deploy-1", "--join-token-sha256",
                   Sha256Hex(kToken)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("\"already_submitted\":true"), std::string::npos) << r.output;
    // Both token flags at once: a usage error.
    r = cli(proc, {"submit", spec, "--job-id", "deploy-1", "--join-token-file", token_file,
                   "--join-token-sha256", Sha256Hex(kToken)});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(proc.Terminate(), 0);
  }
  // After a restart on the same database: still the same job; another spec is a conflict (5).
  CoordinatorProcess proc(db, port);
  ASSERT_TRUE(proc.Start());
  Captured r = cli(proc, {"submit", spec, "--job-id", "deploy-1", "--join-token-file", token_file});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already_submitted: true"), std::string::npos) << r.output;
  SpecParams other;
  other.steps = 12;
  std::ofstream(spec) << SpecJson(other);
  r = cli(proc, {"submit", spec, "--job-id", "deploy-1", "--join-token-file", token_file});
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("ALREADY_EXISTS: job_id: 'deploy-1'"), std::string::npos) << r.output;
  // LATCHKEY_JOB_ID is the default of --job-id: the rendered Kubernetes submit relies on it.
  r = RunAndCapture({"/usr/bin/env", "LATCHKEY_JOB_ID=Bad_Id", CliBinary(), "--coordinator",
                     proc.address(), "submit", spec},
                    std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 3) << r.output;  // INVALID_ARGUMENT
  EXPECT_NE(r.output.find("job_id: 'Bad_Id'"), std::string::npos) << r.output;
  EXPECT_EQ(proc.Terminate(), 0);
}

}  // namespace
}  // namespace latchkey::testing
