// Role tokens and join tokens over real gRPC on loopback: every RPC of JobService and
// WorkerService against each kind of caller, checked against the table below; no raw join
// token in the SQLite file; the refused calls in the coordinator's log (docs/protocol.md
// "Security").
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "latchkey/v1/job_service.grpc.pb.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "server/coordinator.h"
#include "server/security.h"
#include "server/server.h"
#include "server/sqlite_store.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using grpc::StatusCode;
constexpr int kPasses = -1;  // past authentication and authorization: any other code

const char* kAdmin = "tok-admin-0000";
const char* kAlice = "tok-alice-submit";
const char* kBob = "tok-bob-submit";
const char* kReader = "tok-viewer-read";

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = dir_.path() + "/coord.db";
    auto store = SqliteStore::Open(db_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions opt;
    opt.latch_lookahead = 1;
    auto core = Coordinator::Create(*std::move(store), opt, nullptr);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
    auto table = TokenTable::Parse("admin root " + Sha256Hex(kAdmin) + "\nsubmit alice " +
                                       Sha256Hex(kAlice) + "\nsubmit bob " + Sha256Hex(kBob) +
                                       "\nread viewer " + Sha256Hex(kReader) + "\n",
                                   "tokens");
    ASSERT_TRUE(table.ok()) << table.status();
    ServerOptions so;
    so.listen = "127.0.0.1:0";
    so.stream_poll = absl::Milliseconds(50);
    so.auth_tokens = std::make_shared<TokenTable>(*table);
    so.log = [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      log_ += line + "\n";
    };
    auto server = CoordinatorServer::Start(core_.get(), so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                       grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel);
    workers_ = v1::WorkerService::NewStub(channel);
  }
  void TearDown() override {
    server_->Shutdown(absl::Seconds(1));
    server_->Wait();
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int ms = 5000) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  v1::SubmitJobResponse Submit(const std::string& token) {
    v1::SubmitJobRequest req;
    req.set_spec_json(SpecJson());
    v1::SubmitJobResponse resp;
    grpc::Status st = jobs_->SubmitJob(Ctx(token).get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

  std::string Log() {
    absl::MutexLock lock(&mu_);
    return log_;
  }

  ScopedTempDir dir_{"auth"};
  std::string db_;
  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  absl::Mutex mu_;
  std::string log_;
};

TEST_F(AuthTest, EveryJobServiceRpcAgainstEveryCaller) {
  // Callers: none, unknown, read, submit on its own job, submit on another's job, admin, and a
  // join token presented as a bearer token.
  const v1::SubmitJobResponse join_src = Submit(kAdmin);
  struct Caller {
    std::string name;
    std::string token;
    bool others_job;  // the target job was submitted by bob, not alice
  };
  const std::vector<Caller> callers = {
      {"none", "", false},
      {"unknown", "tok-nobody", false},
      {"read", kReader, false},
      {"submit-own", kAlice, false},
      {"submit-other", kAlice, true},
      {"admin", kAdmin, false},
      {"join-token", join_src.join_token(), false},
  };
  const int U = static_cast<int>(StatusCode::UNAUTHENTICATED);
  const int P = static_cast<int>(StatusCode::PERMISSION_DENIED);
  const int K = static_cast<int>(StatusCode::OK);
  // Expected code per RPC, in the order of `callers`.
  const std::vector<std::pair<std::string, std::vector<int>>> table = {
      {"SubmitJob", {U, U, P, K, K, K, U}},       {"GetJob", {U, U, K, K, K, K, U}},
      {"ListJobs", {U, U, K, K, K, K, U}},        {"CancelJob", {U, U, P, K, P, K, U}},
      {"UpdateJobPolicy", {U, U, P, K, P, K, U}}, {"WatchJob", {U, U, K, K, K, K, U}},
      {"ListLatches", {U, U, K, K, K, K, U}},     {"ResumeJob", {U, U, P, K, P, K, U}},
  };
  for (const auto& [rpc, expected] : table) {
    for (size_t i = 0; i < callers.size(); ++i) {
      const Caller& c = callers[i];
      // A fresh job per cell: CancelJob ends it.
      const std::string job = Submit(c.others_job ? kBob : kAlice).job_id();
      grpc::Status st;
      auto ctx = Ctx(c.token);
      if (rpc == "SubmitJob") {
        v1::SubmitJobRequest req;
        req.set_spec_json(SpecJson());
        v1::SubmitJobResponse resp;
        st = jobs_->SubmitJob(ctx.get(), req, &resp);
      } else if (rpc == "GetJob") {
        v1::GetJobRequest req;
        req.set_job_id(job);
        v1::GetJobResponse resp;
        st = jobs_->GetJob(ctx.get(), req, &resp);
      } else if (rpc == "ListJobs") {
        v1::ListJobsRequest req;
        v1::ListJobsResponse resp;
        st = jobs_->ListJobs(ctx.get(), req, &resp);
      } else if (rpc == "CancelJob") {
        v1::CancelJobRequest req;
        req.set_job_id(job);
        v1::CancelJobResponse resp;
        st = jobs_->CancelJob(ctx.get(), req, &resp);
      } else if (rpc == "UpdateJobPolicy") {
        v1::UpdateJobPolicyRequest req;
        req.set_job_id(job);
        req.mutable_gradient_accumulation_steps()->set_value(2);
        v1::UpdateJobPolicyResponse resp;
        st = jobs_->UpdateJobPolicy(ctx.get(), req, &resp);
      } else if (rpc == "WatchJob") {
        v1::WatchJobRequest req;
        req.set_job_id(job);
        auto reader = jobs_->WatchJob(ctx.get(), req);
        v1::WatchJobResponse m;
        if (reader->Read(&m)) {
          ctx->TryCancel();
          while (reader->Read(&m)) {
          }
          reader->Finish();
          st = grpc::Status::OK;  // the first message came: allowed
        } else {
          st = reader->Finish();
        }
      } else if (rpc == "ResumeJob") {
        // The same role as CancelJob; the job is cancelled (by the admin) first, so an allowed
        // caller's resume succeeds.
        v1::CancelJobRequest cancel;
        cancel.set_job_id(job);
        v1::CancelJobResponse cancelled;
        auto admin = Ctx(kAdmin);
        ASSERT_TRUE(jobs_->CancelJob(admin.get(), cancel, &cancelled).ok());
        v1::ResumeJobRequest req;
        req.set_job_id(job);
        v1::ResumeJobResponse resp;
        st = jobs_->ResumeJob(ctx.get(), req, &resp);
      } else if (rpc == "ListLatches") {
        v1::ListLatchesRequest req;
        req.set_job_id(job);
        v1::ListLatchesResponse resp;
        st = jobs_->ListLatches(ctx.get(), req, &resp);
      }
      EXPECT_EQ(static_cast<int>(st.error_code()), expected[i])
          << rpc << " by " << c.name << ": " << st.error_message();
      if (st.error_code() == StatusCode::PERMISSION_DENIED ||
          st.error_code() == StatusCode::UNAUTHENTICATED) {
        EXPECT_FALSE(st.error_message().empty()) << rpc << " by " << c.name;
      }
    }
  }
  // Every refusal is logged with the RPC and the peer, never a token.
  const std::string log = Log();
  for (const char* rpc : {"SubmitJob", "GetJob", "CancelJob", "UpdateJobPolicy", "WatchJob"}) {
    EXPECT_NE(log.find(std::string("refused ") + rpc + " from ipv4:127.0.0.1:"), std::string::npos)
        << rpc << "\n"
        << log;
  }
  EXPECT_NE(log.find("PERMISSION_DENIED"), std::string::npos) << log;
  for (const std::string& t : {std::string(kAlice), std::string(kReader), std::string("tok-nobody"),
                               join_src.join_token()}) {
    EXPECT_EQ(log.find(t), std::string::npos) << t;
  }
}

TEST_F(AuthTest, EveryWorkerServiceRpcOpensOnlyWithItsJobsJoinToken) {
  const v1::SubmitJobResponse job = Submit(kAlice);
  const v1::SubmitJobResponse other = Submit(kBob);
  struct Caller {
    std::string name;
    std::string join_token;
    std::string bearer;
  };
  const std::vector<Caller> callers = {
      {"none", "", ""},
      {"unknown", "not-a-token", ""},
      {"admin-bearer-only", "", kAdmin},
      {"another-jobs-join-token", other.join_token(), kAdmin},
      {"its-join-token", job.join_token(), ""},
  };
  const int U = static_cast<int>(StatusCode::UNAUTHENTICATED);
  const int K = static_cast<int>(StatusCode::OK);
  // ReportFailure last: it fails the job.
  const std::vector<std::pair<std::string, std::vector<int>>> table = {
      {"Join", {U, U, U, U, K}},
      {"Heartbeat", {U, U, U, U, K}},
      {"WatchLatches", {U, U, U, U, kPasses}},
      {"ReportStep", {U, U, U, U, kPasses}},
      {"ReportCheckpoint", {U, U, U, U, kPasses}},
      {"ReportFailure", {U, U, U, U, K}},
  };
  int rank = 0;
  for (const auto& [rpc, expected] : table) {
    for (size_t i = 0; i < callers.size(); ++i) {
      const Caller& c = callers[i];
      v1::WorkerIdentity id;
      id.set_job_id(job.job_id());
      id.set_join_token(c.join_token);
      id.set_worker_id("w0");
      auto ctx = Ctx(c.bearer, 2000);
      grpc::Status st;
      if (rpc == "Join") {
        v1::JoinRequest req;
        *req.mutable_identity() = id;
        req.set_advertise_host("127.0.0.1");
        v1::JoinResponse resp;
        st = workers_->Join(ctx.get(), req, &resp);
        if (st.ok()) rank = resp.rank();
      } else if (rpc == "Heartbeat") {
        v1::HeartbeatRequest req;
        *req.mutable_identity() = id;
        req.set_rank(rank);
        v1::HeartbeatResponse resp;
        st = workers_->Heartbeat(ctx.get(), req, &resp);
      } else if (rpc == "WatchLatches") {
        v1::WatchLatchesRequest req;
        *req.mutable_identity() = id;
        req.set_rank(rank);
        auto reader = workers_->WatchLatches(ctx.get(), req);
        v1::WatchLatchesResponse m;
        while (reader->Read(&m)) {
        }
        st = reader->Finish();
      } else if (rpc == "ReportStep") {
        v1::ReportStepRequest req;
        *req.mutable_identity() = id;
        req.set_rank(rank);
        req.set_step(0);
        req.set_micro_batches(1);
        req.set_kv_mode(v1::KV_MODE_PER_MICRO_BATCH);
        v1::ReportStepResponse resp;
        st = workers_->ReportStep(ctx.get(), req, &resp);
      } else if (rpc == "ReportCheckpoint") {
        v1::ReportCheckpointRequest req;
        *req.mutable_identity() = id;
        req.set_rank(rank);
        req.set_step(0);
        req.set_manifest_sha256(std::string(64, 'a'));
        v1::ReportCheckpointResponse resp;
        st = workers_->ReportCheckpoint(ctx.get(), req, &resp);
      } else if (rpc == "ReportFailure") {
        v1::ReportFailureRequest req;
        *req.mutable_identity() = id;
        req.set_rank(rank);
        req.set_message("test");
        v1::ReportFailureResponse resp;
        st = workers_->ReportFailure(ctx.get(), req, &resp);
      }
      const int code = static_cast<int>(st.error_code());
      if (expected[i] == kPasses) {
        EXPECT_NE(code, U) << rpc << " by " << c.name << ": " << st.error_message();
        EXPECT_NE(code, static_cast<int>(StatusCode::PERMISSION_DENIED))
            << rpc << " by " << c.name << ": " << st.error_message();
      } else {
        EXPECT_EQ(code, expected[i]) << rpc << " by " << c.name << ": " << st.error_message();
      }
    }
  }
  const std::string log = Log();
  for (const char* rpc : {"Join", "Heartbeat", "WatchLatches", "ReportStep", "ReportFailure"}) {
    EXPECT_NE(log.find(std::string("refused ") + rpc + " from ipv4:127.0.0.1:"), std::string::npos)
        << rpc << "\n"
        << log;
  }
  EXPECT_EQ(log.find(other.join_token()), std::string::npos);
  EXPECT_EQ(log.find(job.join_token()), std::string::npos);
}

TEST_F(AuthTest, TheDatabaseFileHoldsNoRawJoinToken) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 3; ++i) tokens.push_back(Submit(i % 2 ? kAlice : kAdmin).join_token());
  auto slurp = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string bytes = slurp(db_) + slurp(db_ + "-wal");
  ASSERT_FALSE(bytes.empty());
  for (const std::string& t : tokens) {
    ASSERT_FALSE(t.empty());
    EXPECT_EQ(bytes.find(t), std::string::npos) << t;
    EXPECT_NE(bytes.find(Sha256Hex(t)), std::string::npos) << t;  // only its hash is stored
  }
  EXPECT_NE(bytes.find("alice"), std::string::npos);  // the submitter is stored
}

TEST_F(AuthTest, TooManyCallsFromOnePeerAreResourceExhausted) {
  // A second coordinator capped at 2 calls per peer: two open streams, then the third call.
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.max_calls_per_peer = 2;
  so.log = [](const std::string&) {};
  auto capped = CoordinatorServer::Start(core_.get(), so);
  ASSERT_TRUE(capped.ok()) << capped.status();
  auto stub = v1::JobService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*capped)->port()), grpc::InsecureChannelCredentials()));
  const std::string job = Submit(kAlice).job_id();  // (the capped server has no auth)
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>>> streams;
  for (int i = 0; i < 2; ++i) {
    ctxs.push_back(Ctx(""));
    v1::WatchJobRequest req;
    req.set_job_id(job);
    streams.push_back(stub->WatchJob(ctxs.back().get(), req));
    v1::WatchJobResponse m;
    ASSERT_TRUE(streams.back()->Read(&m));  // open and counted
  }
  v1::GetJobRequest get;
  get.set_job_id(job);
  v1::GetJobResponse resp;
  grpc::Status st = stub->GetJob(Ctx("").get(), get, &resp);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  for (auto& c : ctxs) c->TryCancel();
  for (auto& s : streams) {
    v1::WatchJobResponse m;
    while (s->Read(&m)) {
    }
    s->Finish();
  }
  // The handlers notice the cancellations within their poll; then the slots are free again.
  grpc::Status after;
  for (int i = 0; i < 100; ++i) {
    after = stub->GetJob(Ctx("").get(), get, &resp);
    if (after.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(after.ok()) << after.error_message();
  (*capped)->Shutdown(absl::Seconds(1));
  (*capped)->Wait();
}

TEST(PeerCallLimiterTest, TheDefaultCapFollowsTheLiveJobsRanks) {
  int ranks = 0;
  PeerCallLimiter limiter(0, [&ranks] { return ranks; });
  EXPECT_EQ(limiter.limit(), PeerCallLimiter::kMinCallsPerPeer);  // no job: the floor
  ranks = 100;
  EXPECT_EQ(limiter.limit(), 4 * 100 + 16);
  ranks = 0;
  for (int i = 0; i < PeerCallLimiter::kMinCallsPerPeer; ++i) ASSERT_TRUE(limiter.Acquire("h"));
  EXPECT_FALSE(limiter.Acquire("h"));     // 64 open, no live ranks: refused
  EXPECT_TRUE(limiter.Acquire("other"));  // counted per peer host
  ranks = 20;                             // a 20-rank job arrives: 96
  for (int i = PeerCallLimiter::kMinCallsPerPeer; i < 96; ++i) ASSERT_TRUE(limiter.Acquire("h"));
  EXPECT_FALSE(limiter.Acquire("h"));
  limiter.Release("h");
  EXPECT_TRUE(limiter.Acquire("h"));

  PeerCallLimiter fixed(3, [] { return 1000; });  // --max-calls-per-peer 3: as given
  EXPECT_EQ(fixed.limit(), 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fixed.Acquire("h"));
  EXPECT_FALSE(fixed.Acquire("h"));
}

TEST_F(AuthTest, LiveRanksCountsTheJobsNotYetEnded) {
  EXPECT_EQ(core_->LiveRanks(), 0);
  const std::string a = Submit(kAlice).job_id();
  Submit(kAlice);
  const int world = core_->GetJob(a, false)->world_size;
  EXPECT_EQ(core_->LiveRanks(), 2 * world);
  ASSERT_TRUE(core_->CancelJob(a, "test").ok());
  EXPECT_EQ(core_->LiveRanks(), world);
}

}  // namespace
}  // namespace latchkey::testing
