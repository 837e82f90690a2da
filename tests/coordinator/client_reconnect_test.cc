// JobClient across a coordinator restart: a client that was answered waits for the coordinator
// to come back within its call's timeout; one that never reached one fails at once.
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_client.h"
#include "gtest/gtest.h"
#include "tests/coordinator/harness.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

// A client that was answered and then lost its coordinator (kill -9, restarted seconds later on
// the same port) gets its next call answered once the coordinator is back, within the call's
// timeout; a client that never reached one fails at once, saying nothing is listening.
TEST(ClientReconnectTest, AnAnsweredClientWaitsForARestartedCoordinatorAndANewOneFailsAtOnce) {
  const ScopedTempDir dir("coord-db");
  const std::string db = dir / "coord.db";
  auto first = std::make_unique<CoordinatorProcess>(db);
  ASSERT_TRUE(first->Start());
  const int port = first->grpc_port();
  JobClient client({first->address(), absl::Seconds(10), absl::ZeroDuration(), {}});
  SpecParams p;
  p.world_size = 2;
  p.tp = 1;
  JobSubmission req;
  req.spec_json = SpecJson(p);
  const absl::StatusOr<SubmittedJob> job = client.SubmitJob(req);
  ASSERT_TRUE(job.ok()) << job.status();
  first->Kill9();
  absl::SleepFor(absl::Seconds(3));

  CoordinatorProcess second(db, port);
  std::thread restart([&] {
    absl::SleepFor(absl::Seconds(1));
    EXPECT_TRUE(second.Start());
  });
  const absl::Time sent = absl::Now();
  auto again = client.GetJob(job->job_id);
  const absl::Duration took = absl::Now() - sent;
  restart.join();
  ASSERT_TRUE(again.ok()) << again.status() << " after " << took;
  EXPECT_EQ(again->job_id, job->job_id);
  EXPECT_LT(took, absl::Seconds(10));

  JobClient stranger({"127.0.0.1:" + std::to_string(port + 1 == 65536 ? 1 : port + 1),
                      absl::Seconds(10),
                      absl::ZeroDuration(),
                      {}});
  const absl::Time asked = absl::Now();
  auto refused = stranger.GetJob(job->job_id);
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_LT(absl::Now() - asked, absl::Seconds(3)) << refused.status();
  EXPECT_EQ(second.Terminate(), 0);
}

}  // namespace
}  // namespace latchkey::testing
