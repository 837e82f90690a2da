#include "worker/runner/coordinated.h"

#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/error_info.h"
#include "common/spec_files.h"
#include "worker/comm/collective_stats.h"
#include "worker/comm/flight_recorder.h"
#include "worker/runner/device.h"
#include "worker/runner/stop_signal.h"
#include "worker/session/coordinator_latch_source.h"
#include "worker/session/worker_session.h"

namespace latchkey {
namespace {

// Once fenced, how long the training thread may stay where no error reaches it (a collective
// with a stopped or cut-off peer) before the process exits for a restart (kExitRestartMe): two
// heartbeats, so a fenced attempt's ranks leave promptly and the next one forms.
constexpr absl::Duration kStuckExitAfter = absl::Seconds(2);

}  // namespace

absl::Status RunCoordinated(const CoordinatedOptions& options, const WorkerEnv& env) {
  // One recorder and one set of counters per process: the groups of every attempt record into
  // them, so the heartbeats and metrics carry on across attempts.
  auto recorder =
      std::make_shared<comm::FlightRecorder>(static_cast<size_t>(options.run.outputs.trace_spans));
  auto stats = std::make_shared<comm::CollectiveStats>();

  WorkerSessionOptions so;
  so.coordinator = options.coordinator;
  so.job_id = options.job_id;
  so.join_token = options.join_token;
  so.credentials = options.credentials;
  so.worker_id = ProcessWorkerId();
  if (options.requested_rank >= 0) so.requested_rank = options.requested_rank;
  so.advertise_host = options.advertise_host;
  so.node = env.node_name;
  so.node_relay = env.node_relay;
  so.position = [recorder] { return recorder->Snapshot(); };
  so.clock_sample = [recorder](int64_t offset, int64_t error) {
    recorder->timeline()->NoteClock(offset, error);
  };
  so.trace = [recorder](int64_t first_step, int64_t last_step, size_t max_bytes) {
    return recorder->timeline()->Jsonl(first_step, last_step, max_bytes);
  };
  so.stuck_exit_after = kStuckExitAfter;
  // SIGTERM, SIGINT: the attempt saves and stops, and this process leaves for a replacement.
  so.stop_signal = InstallStopSignals();
  so.join_timeout = absl::FromChrono(options.join_timeout);
  auto session_or = WorkerSession::Join(so);
  if (!session_or.ok()) {
    // A suspended job: this worker leaves as a preempted one does (kExitPreempted).
    if (HasErrorReason(session_or.status(), error_reason::kJobSuspended)) {
      return session_or.status();
    }
    return absl::Status(session_or.status().code(), "join " + options.job_id + " at " +
                                                        options.coordinator + ": " +
                                                        std::string(session_or.status().message()));
  }
  WorkerSession& session = **session_or;
  const JoinInfo& info = session.info();
  if (info.spare) {  // it waited as a spare and the job ended without it
    std::cerr << "latchkey-worker: not needed: job " << options.job_id << " "
              << JobStateName(info.state) << " with world " << info.world_size
              << " without this worker; exiting" << std::endl;
    if (info.state == JobState::kSucceeded) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", options.job_id, " ", JobStateName(info.state), ": ", info.failure_reason));
  }
  comm::RendezvousConfig rdv;
  rdv.local_address = env.transport_host;
  rdv.collective_timeout = options.collective_timeout;
  rdv.stats = stats;
  rdv.recorder = recorder;
  CoordinatorLatchSource source(&session, rdv);

  RankJob job;
  auto spec = ParseJobSpec(info.spec_json, info.base_dir);
  if (!spec.ok()) return source.Abandon(spec.status());
  job.spec = *std::move(spec);
  session.SetStopGrace(absl::Seconds(job.spec.preemption_grace_seconds));
  // A file the spec names that this machine cannot read fails the job at once, naming the field
  // (INVALID_ARGUMENT: a configuration error), instead of failing every attempt the same way.
  if (absl::Status files = CheckSpecFiles(job.spec); !files.ok()) return source.Abandon(files);
  job.local_ranks = env.local_world_size.value_or(info.world_size);
  auto placed = PlaceRank(job.spec, env, info.rank, job.local_ranks);
  if (!placed.ok()) return source.Abandon(placed.status());
  job.device = placed->device;
  job.backend = placed->backend;
  absl::Status st = RunRank(job, source, options.run);
  // A spare of an elastic job (or a survivor a shrink left without a rank) that the job
  // finished without: nothing failed, so an Indexed Job's pod completes.
  const JoinInfo& last = session.info();
  if (st.code() == absl::StatusCode::kCancelled && last.spare) {
    std::cerr << "latchkey-worker: not needed: job " << options.job_id << " "
              << JobStateName(last.state) << " with world " << last.world_size
              << " without this worker; exiting" << std::endl;
    if (last.state == JobState::kSucceeded) return absl::OkStatus();
  }
  return st;
}

}  // namespace latchkey
