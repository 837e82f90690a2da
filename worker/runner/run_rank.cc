#include "worker/runner/run_rank.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "absl/strings/str_replace.h"
#include "common/backend.h"
#include "common/error_info.h"
#include "common/job_uid.h"
#include "common/worker_protocol.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_manager.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/comm/collective_error.h"
#include "worker/comm/collective_stats.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/store.h"
#include "worker/train/threads.h"

namespace latchkey {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status Prefixed(const absl::Status& st, const std::string& prefix) {
  return absl::Status(st.code(), prefix + std::string(st.message()));
}

// A standalone run that continues no checkpoint of its own is a job of its own: rank 0 draws its
// uid and hands it to the other ranks through the rendezvous store (every rank names the same
// temporary folders, and rank 0's manifests and pruning the same job).
absl::StatusOr<std::string> DrawStandaloneJobUid(const comm::ProcessGroups& groups,
                                                 const comm::RendezvousConfig& rendezvous) {
  if (groups.world_size == 1 || groups.store == nullptr) return NewJobUid();
  comm::PrefixStore store(rendezvous.prefix, groups.store);
  if (groups.rank == 0) {
    const std::string uid = NewJobUid();
    if (absl::Status st = store.Set("job_uid", std::vector<uint8_t>(uid.begin(), uid.end()));
        !st.ok()) {
      return st;
    }
    return uid;
  }
  absl::StatusOr<std::vector<uint8_t>> got = store.Get("job_uid", rendezvous.rendezvous_timeout);
  if (!got.ok()) return got.status();
  const std::string uid(got->begin(), got->end());
  if (!IsJobUid(uid)) {
    return absl::InternalError("rendezvous store: job_uid \"" + uid + "\" is not a job uid");
  }
  return uid;
}

// What lives as long as the process: the counters and flight recorder every attempt's groups
// record into, and the outputs (JSONL, metrics endpoint, port file), opened once the first
// attempt has formed its groups.
struct RankProcess {
  int compute_threads = 1;
  std::shared_ptr<comm::CollectiveStats> stats;
  std::shared_ptr<comm::FlightRecorder> recorder;
  std::unique_ptr<RankOutputs> outputs;
  // The checkpoint driver: its host staging buffers are reused by every save of the process.
  CheckpointSaver saver{true};
};

// The end of a run at a window that diverged (StepDiverged: its update was not applied). Every
// rank gets here at the same window, after the commit due at its boundary (an asynchronous save
// of an earlier step: the state it staged is good). The step's record goes out as any step's
// (JSONL, metrics, TensorBoard, the coordinator's report), nothing is saved for it, and the rank
// ends with TRAINING_DIVERGED (common/error_info.h), which fails the job without a recovery.
// Every rank's reports (rank 0's checkpoint, each rank's step) are in before any rank reports
// the divergence, which ends the job: one barrier over the world, after the step's record.
absl::Status EndDiverged(const StepReport& report, comm::ProcessGroups& groups,
                         RankOutputs& outputs, LatchSource& source, const JobSpec& spec,
                         const Latch& latch, double waited) {
  const int rank = groups.rank;
  outputs.OnStep(spec, latch, report, waited);
  const bool loss_bad = !std::isfinite(report.loss);
  const absl::Status diverged =
      TrainingDivergedError(loss_bad ? "loss" : "grad_norm",
                            loss_bad ? report.loss : report.grad_norm, report.step, rank);
  // The verdict stands whatever the report's fate (a coordinator that does not take it): said
  // in the rank's log, not returned.
  if (absl::Status st = source.StepDone(report); !st.ok()) {
    std::cerr << "latchkey-worker: rank " << rank << ": ReportStep of diverged step " << report.step
              << ": " << st.message() << std::endl;
  }
  if (groups.world_size > 1) {
    if (absl::Status st = groups.world->Barrier(); !st.ok()) {
      std::cerr << "latchkey-worker: rank " << rank << ": barrier after diverged step "
                << report.step << ": " << st.message() << std::endl;
    }
  }
  std::cerr << "latchkey-worker: rank " << rank << ": " << diverged.message()
            << "; the update was not applied, the job ends here" << std::endl;
  return diverged;
}

// The spec an attempt runs: the job's, in the attempt's layout. An elastic attempt may run
// fewer ranks than the spec names, with more micro-batches per window (the global batch kept);
// the engine, the data placement and the checkpoint see this layout, never the spec's.
JobSpec AttemptSpec(const JobSpec& job_spec, const AttemptPlan& plan) {
  JobSpec spec = job_spec;
  spec.world_size = plan.rendezvous.world_size;
  const int gas = plan.gradient_accumulation_steps;
  if (gas > 0 && gas != spec.gradient_accumulation_steps) {
    spec.gradient_accumulation_steps = gas;
    spec.no_sync.clear();  // a mask of the spec's window length: the latch carries the mask
  }
  return spec;
}

// An open attempt: the attempt's spec and plan, its groups, and its engine, declared after the
// groups so that on any exit (a Status or an exception unwinding) it is destroyed first.
struct Attempt {
  JobSpec spec;
  AttemptPlan plan;
  comm::ProcessGroups groups;
  std::unique_ptr<Engine> engine;
};

// Opens attempt `a` (a.plan set): its groups, the job uid of a standalone run, the process's
// outputs (the first attempt opens them), the engine, and the checkpoint it resumes.
absl::Status OpenAttempt(const RankJob& job, const RunOptions& options, RankProcess& proc,
                         Attempt& a) {
  AttemptPlan& plan = a.plan;
  a.spec = AttemptSpec(job.spec, plan);
  proc.recorder->SetAttempt(plan.attempt);
  proc.recorder->SetPhase(RankPhase::kIdle);
  plan.rendezvous.stats = proc.stats;
  plan.rendezvous.recorder = proc.recorder;
  plan.rendezvous.local_ranks = job.local_ranks;
  plan.rendezvous.device = job.device;
  auto groups = comm::CreateProcessGroups(job.backend, plan.rendezvous);
  if (!groups.ok()) return groups.status();
  a.groups = *std::move(groups);
  if (plan.job_id == "standalone" && plan.job_uid.empty()) {
    absl::StatusOr<std::string> uid = DrawStandaloneJobUid(a.groups, plan.rendezvous);
    if (!uid.ok()) return Prefixed(uid.status(), "job uid: ");
    plan.job_uid = *uid;
  }
  if (proc.outputs == nullptr) {
    OutputOptions output_options = options.outputs;
    // A fresh run (attempt 1, nothing to resume) starts its JSONL afresh; a resumed or
    // restarted rank appends to what its earlier process wrote.
    output_options.fresh_jsonl = plan.attempt == 1 && plan.resume_step < 0;
    auto outputs = RankOutputs::Open(output_options, a.groups.rank, proc.stats.get());
    if (!outputs.ok()) return outputs.status();
    proc.outputs = *std::move(outputs);
  }
  if (absl::Status st = proc.outputs->BeginAttempt(a.spec, a.groups.rank, plan.first_window());
      !st.ok()) {
    return st;
  }
  EngineOptions engine_options = options.engine;
  engine_options.device = job.device;
  engine_options.load_init_from = LoadInitFrom;
  engine_options.write_grads = WriteGradDump;
  auto engine = CreateEngine(a.spec, &a.groups, engine_options);
  if (!engine.ok()) return engine.status();
  a.engine = *std::move(engine);
  if (plan.resume_step < 0) return absl::OkStatus();
  // Whatever layout wrote it: the load reshards (checkpointer.h). Under the coordinator the
  // step's folder of this job: step-N, or step-N.<uid> when another job's took step-N.
  std::string step_dir = plan.resume_dir;
  if (step_dir.empty()) {
    absl::StatusOr<std::string> found =
        FindCheckpointDir(a.spec.checkpoint.dir, plan.resume_step,
                          CheckpointOwner(plan.job_id, plan.job_uid), plan.resume_manifest_sha256);
    if (!found.ok()) return Prefixed(found.status(), "resume: ");
    step_dir = *found;
  }
  const bool standalone = plan.job_id == "standalone";
  if (absl::Status st =
          LoadTrainingCheckpoint(a.engine->state(), step_dir, standalone ? "" : plan.job_id,
                                 plan.resume_manifest_sha256, standalone ? "" : plan.job_uid);
      !st.ok()) {
    return Prefixed(st, "resume: ");
  }
  return absl::OkStatus();
}

// The checkpoint manager of attempt `a` (checkpoint_manager.h): each committed save goes to the
// rank's metrics and to the source (the coordinator's resume step) before rank 0 prunes.
CheckpointManagerOptions CheckpointOptions(const Attempt& a, RankProcess& proc, LatchSource& source,
                                           const RunOptions& options) {
  CheckpointManagerOptions o;
  o.config = a.spec.checkpoint;
  o.steps = a.spec.steps;
  o.request.root = a.spec.checkpoint.dir;
  o.request.job_id = a.plan.job_id;
  o.request.job_uid = a.plan.job_uid;
  o.request.attempt = a.plan.attempt;
  o.request.compute_threads = proc.compute_threads;
  o.request.perturb_replica_rank_for_testing = options.perturb_replica_rank_for_testing;
  o.owner = CheckpointOwner(a.plan.job_id, a.plan.job_uid);
  o.resume_step = a.plan.resume_step;
  o.rank = a.groups.rank;
  o.world = a.groups.world.get();
  o.world_size = a.groups.world_size;
  o.recorder = proc.recorder.get();
  RankOutputs* outputs = proc.outputs.get();
  o.on_commit = [outputs, &source](const CommittedSave& c) -> absl::Status {
    outputs->OnCheckpoint(c.commit, c.background_seconds);
    if (absl::Status st = source.CheckpointCommitted(c.commit); !st.ok()) {
      return Prefixed(st, "ReportCheckpoint: ");
    }
    return absl::OkStatus();
  };
  return o;
}

// The checkpoint work at a window's boundary, in its record: the training time a save started
// here blocked, and the background time of the asynchronous saves committed here.
void NoteCheckpoint(const WindowCheckpoint& c, StepReport& report) {
  if (c.background_seconds) {
    report.checkpoint_background_seconds =
        report.checkpoint_background_seconds.value_or(0) + *c.background_seconds;
  }
  if (c.blocked_seconds) report.checkpoint_seconds = *c.blocked_seconds;
}

// The attempt stops before window `s` (a preemption or a suspend, `stop`: ATTEMPT_STOPPED):
// the state after window s - 1 is saved and committed with every rank (rank 0 reports it),
// then the attempt ends with `stop`. Nothing ran since the resume: the resumed checkpoint is
// that state, and rank 0 reports it again.
absl::Status SaveAndStop(Attempt& a, CheckpointManager& checkpoints, LatchSource& source, int64_t s,
                         absl::Status stop) {
  if (s - 1 <= a.plan.resume_step) {
    if (a.plan.resume_step < 0) return stop;  // nothing trained, nothing to keep
    CheckpointCommit again;
    again.step = a.plan.resume_step;
    again.manifest_sha256 = a.plan.resume_manifest_sha256;
    if (absl::Status st = source.CheckpointCommitted(again); !st.ok()) return st;
    return stop;
  }
  absl::StatusOr<WindowCheckpoint> saved =
      checkpoints.SaveForStop(a.engine->state(), std::string(stop.message()));
  if (!saved.ok()) return saved.status();
  return stop;
}

// One attempt: open it (groups, engine, the checkpoint to resume), then every remaining window.
absl::Status RunAttempt(const RankJob& job, LatchSource& source, const RunOptions& options,
                        AttemptPlan plan, RankProcess& proc) {
  Attempt a;
  a.plan = std::move(plan);
  if (absl::Status st = OpenAttempt(job, options, proc, a); !st.ok()) return st;
  const JobSpec& spec = a.spec;
  RankOutputs& outputs = *proc.outputs;
  TrainingState& state = a.engine->state();
  // Whatever ends the attempt, its in-flight background write is waited for and, unless it
  // committed, dropped (the manager's destructor): nothing of it is loaded.
  CheckpointManager checkpoints(proc.saver, CheckpointOptions(a, proc, source, options));
  for (int64_t s = a.plan.first_window(); s < spec.steps; ++s) {
    proc.recorder->BeginWindow(s, RankPhase::kLatch);
    comm::ScopedSpan window(proc.recorder->timeline(), comm::SpanKind::kWindow, s);
    comm::ScopedSpan latch_wait(proc.recorder->timeline(), comm::SpanKind::kLatchWait, s);
    const auto wait_start = Clock::now();
    auto latch = source.Await(s);
    latch_wait.End();
    if (!latch.ok()) {
      if (HasErrorReason(latch.status(), error_reason::kAttemptStopped)) {
        return SaveAndStop(a, checkpoints, source, s, latch.status());
      }
      return latch.status();
    }
    const double waited = std::chrono::duration<double>(Clock::now() - wait_start).count();
    if (s == options.throw_at_window_for_testing) {
      throw std::logic_error("injected fault in window " + std::to_string(s));
    }
    const auto window_start = Clock::now();
    auto report = a.engine->RunWindow(*latch);
    if (!report.ok()) return report.status();
    report->latch_wait_seconds = waited;
    if (options.min_window_seconds > 0) {  // tests: a slow step without the compute
      std::this_thread::sleep_until(window_start +
                                    std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options.min_window_seconds)));
    }
    const bool diverged = StepDiverged(*report);
    // Commits what is due here, then starts the save due here (not after a diverged window).
    absl::StatusOr<WindowCheckpoint> saved = checkpoints.AfterWindow(state, s, diverged);
    if (!saved.ok()) return saved.status();
    NoteCheckpoint(*saved, *report);
    if (diverged) return EndDiverged(*report, a.groups, outputs, source, spec, *latch, waited);
    outputs.OnStep(spec, *latch, *report, waited);
    checkpoints.Launch();  // the background write starts once the step's record is out
    if (absl::Status st = source.StepDone(*report); !st.ok()) {
      return Prefixed(st, "ReportStep: ");
    }
  }
  if (absl::Status st = checkpoints.CheckAllCommitted(); !st.ok()) return st;
  proc.recorder->SetPhase(RankPhase::kIdle);
  if (!options.save_dir.empty()) {
    if (absl::Status st = SaveHfCheckpoint(state, options.save_dir); !st.ok()) {
      return Prefixed(st, "--save: ");
    }
    if (a.groups.rank == 0 && !options.outputs.quiet) {
      std::cerr << "saved " << options.save_dir << "\n";
    }
  }
  outputs.Linger();
  return absl::OkStatus();
}

absl::Status RunAttemptCaught(const RankJob& job, LatchSource& source, const RunOptions& options,
                              AttemptPlan plan, RankProcess& proc) {
  try {
    return RunAttempt(job, source, options, std::move(plan), proc);
  } catch (const std::exception& e) {
    return StatusFromException(e);
  }
}

}  // namespace

absl::Status StatusFromException(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const comm::CollectiveError*>(&e)) return ce->status();
  std::string what = e.what();
  if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  return absl::InternalError("internal error: " + what);
}

// Who the timeline's spans are of, from this attempt on (its dumps' header).
void SetTraceIdentity(const RankJob& job, const AttemptPlan& plan, comm::Timeline& timeline) {
  nlohmann::ordered_json id;
  id["trace"] = 1;
  id["rank"] = plan.rendezvous.rank;
  id["world_size"] = plan.rendezvous.world_size;
  id["tp"] = plan.rendezvous.tp;
  id["attempt"] = plan.attempt;
  id["backend"] = CommBackendName(job.backend);
  id["device"] = job.device.ToString();
  id["worker"] = ProcessWorkerId();  // host:pid
  timeline.SetIdentity(id);
}

// Writes the rank's timeline to --trace-jsonl (OutputOptions::trace_jsonl) as the process's run
// ends; a file that cannot be written is said on stderr and the run's outcome kept.
void WriteTrace(const OutputOptions& out, int rank, const comm::Timeline& timeline) {
  if (out.trace_jsonl.empty() || !timeline.enabled()) return;
  const std::string path = absl::StrReplaceAll(out.trace_jsonl, {{"{rank}", std::to_string(rank)}});
  std::ofstream f(path, out.fresh_jsonl ? std::ios::trunc : std::ios::app);
  if (f) timeline.WriteJsonl(f);
  f.flush();
  if (!f) std::cerr << "latchkey-worker: --trace-jsonl " << path << ": cannot write" << std::endl;
}

absl::Status RunRank(const RankJob& job, LatchSource& source, const RunOptions& options) {
  RankProcess proc;
  proc.compute_threads = ConfigureComputeThreads(job.local_ranks);
  absl::StatusOr<AttemptPlan> plan = source.Begin();
  if (!plan.ok()) return plan.status();
  // A source that brings its own counters and recorder (the heartbeats read it) keeps them.
  proc.stats =
      plan->rendezvous.stats ? plan->rendezvous.stats : std::make_shared<comm::CollectiveStats>();
  proc.recorder = plan->rendezvous.recorder ? plan->rendezvous.recorder
                                            : std::make_shared<comm::FlightRecorder>(
                                                  static_cast<size_t>(options.outputs.trace_spans));
  int rank = plan->rendezvous.rank;
  auto end = [&](absl::Status st) {
    WriteTrace(options.outputs, rank, *proc.recorder->timeline());
    return st;
  };
  while (true) {
    rank = plan->rendezvous.rank;
    SetTraceIdentity(job, *plan, *proc.recorder->timeline());
    absl::Status st = RunAttemptCaught(job, source, options, *std::move(plan), proc);
    if (st.ok()) {
      source.Finished();
      return end(st);
    }
    // The job ended elsewhere: nothing of this rank's to report.
    if (st.code() == absl::StatusCode::kCancelled) return end(st);
    proc.recorder->SetPhase(RankPhase::kIdle);
    plan = source.Recover(std::move(st));
    if (!plan.ok()) return end(plan.status());
  }
}

}  // namespace latchkey
