// The fixture of the tests that call the coordinator's RPCs directly: an in-process coordinator
// (latch_lookahead 1) on loopback, JobService and WorkerService stubs on one channel, a client
// context with a 10 s deadline, and the submit and identity helpers. Test-only.
#ifndef LATCHKEY_TESTS_COORDINATOR_GRPC_FIXTURE_H_
#define LATCHKEY_TESTS_COORDINATOR_GRPC_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "latchkey/v1/job_service.grpc.pb.h"
#include "latchkey/v1/worker_service.grpc.pb.h"
#include "proto/channel.h"
#include "tests/coordinator/harness.h"
#include "tests/support/specs.h"

namespace latchkey::testing {

class CoordinatorRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions opt;
    opt.latch_lookahead = 1;
    Start(opt);
  }

  // A coordinator with `opt` (in place of the running one, if any) and fresh stubs.
  void Start(const CoordinatorOptions& opt) {
    jobs_.reset();
    workers_.reset();
    server_ = std::make_unique<InProcessCoordinator>(opt);
    auto channel = MakeCoordinatorChannel(server_->address());
    jobs_ = v1::JobService::NewStub(channel);
    workers_ = v1::WorkerService::NewStub(channel);
  }

  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  v1::SubmitJobResponse Submit(const SpecParams& p = {}) {
    v1::SubmitJobRequest req;
    req.set_spec_json(SpecJson(p));
    v1::SubmitJobResponse resp;
    grpc::Status st = jobs_->SubmitJob(Ctx().get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

  // `attempt` 0: as in Join, or "whatever attempt this worker is in" in ReportFailure.
  v1::WorkerIdentity Id(const v1::SubmitJobResponse& job, const std::string& worker,
                        int64_t attempt = 0) {
    v1::WorkerIdentity id;
    id.set_job_id(job.job_id());
    id.set_join_token(job.join_token());
    id.set_worker_id(worker);
    id.set_attempt(attempt);
    return id;
  }

  std::unique_ptr<InProcessCoordinator> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_COORDINATOR_GRPC_FIXTURE_H_
