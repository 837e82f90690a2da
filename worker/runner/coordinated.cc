#include "worker/runner/coordinated.h"

#include <unistd.h>

#include <iostream>

#include "worker/session/worker_session.h"
#include "common/latch.h"
#include "worker/comm/gloo/gloo_groups.h"
#include "worker/runner/env.h"
#include "worker/train/threads.h"

namespace latchkey {
namespace {

// How long one AwaitLatch call blocks before the loop checks the job's state again.
constexpr absl::Duration kLatchPoll = absl::Seconds(1);

// Reports a failure of this rank to the coordinator (best effort) and returns it.
absl::Status Fail(WorkerSession& session, absl::Status st) {
  std::string msg(st.message());
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  (void)session.ReportFailure(msg);
  return st;
}

absl::StatusOr<ReceivedLatch> AwaitLatch(WorkerSession& session, int64_t window) {
  while (true) {
    auto latch = session.AwaitLatch(window, kLatchPoll);
    if (latch.ok() || latch.status().code() != absl::StatusCode::kDeadlineExceeded) return latch;
    if (auto end = session.job_end(); end.has_value()) {
      return absl::CancelledError("job " + end->state +
                                  (end->reason.empty() ? "" : ": " + end->reason));
    }
  }
}

// A collective that failed because a peer vanished is a symptom; the coordinator's liveness
// check names the cause (the rank that died). Wait for its verdict for up to the liveness
// timeout (plus slack) before reporting this rank's own error.
absl::Status CollectiveFailure(WorkerSession& session, absl::Status st) {
  const bool peer_trouble = st.code() == absl::StatusCode::kUnavailable ||
                            st.code() == absl::StatusCode::kDeadlineExceeded;
  if (peer_trouble) {
    const absl::Time until = absl::Now() + session.info().liveness_timeout * 1.5 + absl::Seconds(2);
    while (absl::Now() < until) {
      if (auto end = session.job_end(); end.has_value()) {
        return absl::AbortedError("job " + end->state +
                                  (end->reason.empty() ? "" : ": " + end->reason) +
                                  " (this rank: " + std::string(st.message()) + ")");
      }
      (void)session.Heartbeat();  // also refreshes job_end()
      absl::SleepFor(absl::Milliseconds(200));
    }
  }
  return Fail(session, st);
}

}  // namespace

absl::Status RunCoordinated(const CoordinatedOptions& options) {
  WorkerSessionOptions so;
  so.coordinator = options.coordinator;
  so.job_id = options.job_id;
  so.join_token = options.join_token;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  so.worker_id = std::string(host) + ":" + std::to_string(getpid());
  if (options.requested_rank >= 0) so.requested_rank = options.requested_rank;
  so.advertise_host = options.advertise_host;
  auto session_or = WorkerSession::Join(so);
  if (!session_or.ok()) {
    return absl::Status(session_or.status().code(),
                        "join " + options.job_id + " at " + options.coordinator + ": " +
                            std::string(session_or.status().message()));
  }
  WorkerSession& session = **session_or;
  const JoinInfo& info = session.info();

  auto spec = ParseJobSpec(info.spec_json, info.base_dir);
  if (!spec.ok()) return Fail(session, spec.status());
  auto local = EnvInt("LOCAL_WORLD_SIZE", info.world_size);
  if (!local.ok()) return Fail(session, local.status());
  ConfigureComputeThreads(*local);

  comm::RendezvousConfig rdv;
  rdv.host = info.rendezvous_host;
  rdv.port = info.rendezvous_port;
  rdv.rank = info.rank;
  rdv.world_size = info.world_size;
  rdv.tp = info.tp;
  rdv.prefix = options.job_id;
  rdv.collective_timeout = std::chrono::seconds(options.collective_timeout_seconds);
  auto groups = comm::CreateGlooProcessGroups(rdv);
  if (!groups.ok()) return Fail(session, groups.status());
  auto engine = CreateEngine(*spec, &*groups, options.engine);
  if (!engine.ok()) return Fail(session, engine.status());
  auto outputs = RankOutputs::Open(options.outputs, info.rank, groups->stats.get());
  if (!outputs.ok()) return Fail(session, outputs.status());

  session.StartLatches(0);
  for (int64_t s = 0; s < spec->steps; ++s) {
    const absl::Time wait_start = absl::Now();
    auto received = AwaitLatch(session, s);
    if (!received.ok()) {
      if (received.status().code() == absl::StatusCode::kCancelled) return received.status();
      return Fail(session, received.status());
    }
    const double waited = absl::ToDoubleSeconds(absl::Now() - wait_start);
    const Latch& latch = received->latch;
    auto report = (*engine)->RunWindow(latch);
    if (!report.ok()) return CollectiveFailure(session, report.status());
    report->latch_wait_seconds = waited;
    (*outputs)->OnStep(*spec, latch, *report, waited);
    if (absl::Status st = session.ReportStep(*report); !st.ok()) {
      return Fail(session, absl::Status(st.code(), "ReportStep: " + std::string(st.message())));
    }
  }
  if (!options.save_dir.empty()) {
    if (absl::Status st = (*engine)->SaveCheckpoint(options.save_dir); !st.ok()) {
      return Fail(session, absl::Status(st.code(), "--save: " + std::string(st.message())));
    }
  }
  (*outputs)->Linger();
  session.Close();
  return absl::OkStatus();
}

}  // namespace latchkey
