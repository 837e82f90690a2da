#include "worker/runner/run_rank.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/error_info.h"
#include "common/job_uid.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/comm/collective_error.h"
#include "worker/comm/collective_stats.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/store.h"
#include "worker/runner/checkpoint_saver.h"
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

// One attempt: groups, engine, the checkpoint to resume, then every remaining window. The
// engine is declared after the groups, so on any exit (a Status or an exception unwinding) it
// is destroyed first and the groups after it.
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

absl::Status RunAttempt(const RankJob& job, LatchSource& source, const RunOptions& options,
                        AttemptPlan plan, RankProcess& proc) {
  const JobSpec spec = AttemptSpec(job.spec, plan);
  proc.recorder->SetAttempt(plan.attempt);
  proc.recorder->SetPhase(RankPhase::kIdle);
  plan.rendezvous.stats = proc.stats;
  plan.rendezvous.recorder = proc.recorder;
  plan.rendezvous.local_ranks = job.local_ranks;
  plan.rendezvous.device = job.device;
  auto groups = comm::CreateProcessGroups(job.backend, plan.rendezvous);
  if (!groups.ok()) return groups.status();
  if (plan.job_id == "standalone" && plan.job_uid.empty()) {
    absl::StatusOr<std::string> uid = DrawStandaloneJobUid(*groups, plan.rendezvous);
    if (!uid.ok()) return Prefixed(uid.status(), "job uid: ");
    plan.job_uid = *uid;
  }
  const CheckpointOwner owner(plan.job_id, plan.job_uid);
  if (proc.outputs == nullptr) {
    OutputOptions output_options = options.outputs;
    // A fresh run (attempt 1, nothing to resume) starts its JSONL afresh; a resumed or
    // restarted rank appends to what its earlier process wrote.
    output_options.fresh_jsonl = plan.attempt == 1 && plan.resume_step < 0;
    auto outputs = RankOutputs::Open(output_options, groups->rank, proc.stats.get());
    if (!outputs.ok()) return outputs.status();
    proc.outputs = *std::move(outputs);
  }
  RankOutputs& outputs = *proc.outputs;
  if (absl::Status st = outputs.BeginAttempt(spec, groups->rank, plan.first_window()); !st.ok()) {
    return st;
  }
  EngineOptions engine_options = options.engine;
  engine_options.device = job.device;
  engine_options.load_init_from = LoadInitFrom;
  engine_options.write_grads = WriteGradDump;
  auto engine = CreateEngine(spec, &*groups, engine_options);
  if (!engine.ok()) return engine.status();
  TrainingState& state = (*engine)->state();
  const std::string& root = spec.checkpoint.dir;
  if (plan.resume_step >= 0) {
    // Whatever layout wrote it: the load reshards (checkpointer.h). Under the coordinator the
    // step's folder of this job: step-N, or step-N.<uid> when another job's took step-N.
    std::string step_dir = plan.resume_dir;
    if (step_dir.empty()) {
      absl::StatusOr<std::string> found =
          FindCheckpointDir(root, plan.resume_step, owner, plan.resume_manifest_sha256);
      if (!found.ok()) return Prefixed(found.status(), "resume: ");
      step_dir = *found;
    }
    const bool standalone = plan.job_id == "standalone";
    if (absl::Status st =
            LoadTrainingCheckpoint(state, step_dir, standalone ? "" : plan.job_id,
                                   plan.resume_manifest_sha256, standalone ? "" : plan.job_uid);
        !st.ok()) {
      return Prefixed(st, "resume: ");
    }
  }
  const bool checkpoints = spec.checkpoint.enabled();
  CheckpointSaver& saver = proc.saver;
  saver.set_async(spec.checkpoint.async);
  // Whatever ends the attempt, its in-flight background write is waited for and, unless it
  // committed, dropped: nothing of it is loaded (its temporary folder is pruned later).
  struct AbandonOnExit {
    CheckpointSaver& saver;
    ~AbandonOnExit() { saver.Abandon(); }
  } abandon_on_exit{saver};
  TrainingCheckpointRequest req;
  req.root = root;
  req.job_id = plan.job_id;
  req.job_uid = plan.job_uid;
  req.attempt = plan.attempt;
  req.compute_threads = proc.compute_threads;
  // A committed save: metrics, the source (the coordinator's resume step), pruning (rank 0).
  const auto committed = [&](const CommittedSave& c) -> absl::Status {
    outputs.OnCheckpoint(c.commit, c.background_seconds);
    if (absl::Status st = source.CheckpointCommitted(c.commit); !st.ok()) {
      return Prefixed(st, "ReportCheckpoint: ");
    }
    if (groups->rank == 0) {
      if (absl::Status st = PruneCheckpoints(root, owner, spec.checkpoint.keep, plan.resume_step);
          !st.ok()) {
        return Prefixed(st, "latchkey.checkpoint.keep: pruning: ");
      }
    }
    return absl::OkStatus();
  };
  // LATCHKEY_TEST_MIN_WINDOW_SECONDS (tests only, docs/fault-tolerance.md): every window lasts
  // at least this long, as a larger model's would.
  const char* min_window_env = std::getenv("LATCHKEY_TEST_MIN_WINDOW_SECONDS");
  const double min_window_seconds = min_window_env ? std::atof(min_window_env) : 0.0;
  for (int64_t s = plan.first_window(); s < spec.steps; ++s) {
    proc.recorder->BeginWindow(s, RankPhase::kLatch);
    const auto wait_start = Clock::now();
    auto latch = source.Await(s);
    if (!latch.ok()) return latch.status();
    const double waited = std::chrono::duration<double>(Clock::now() - wait_start).count();
    if (s == options.throw_at_window_for_testing) {
      throw std::logic_error("injected fault in window " + std::to_string(s));
    }
    const auto window_start = Clock::now();
    auto report = (*engine)->RunWindow(*latch);
    if (!report.ok()) return report.status();
    report->latch_wait_seconds = waited;
    if (min_window_seconds > 0) {  // tests: a slow step without the compute
      std::this_thread::sleep_until(window_start +
                                    std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(min_window_seconds)));
    }
    const bool diverged = StepDiverged(*report);
    const bool save = !diverged && checkpoints && (s + 1) % spec.checkpoint.every_steps == 0;
    // A background save commits at the boundary every rank derives from its step.
    const auto commit_due = [&]() -> absl::Status {
      auto due = saver.CommitDue(state, s, spec.steps);
      if (!due.ok()) {
        return Prefixed(due.status(),
                        "checkpoint after step " + std::to_string(saver.staged().step()) + ": ");
      }
      if (!due->has_value()) return absl::OkStatus();
      // every_steps 1: the last boundary commits two saves (the previous one's and its own).
      report->checkpoint_background_seconds =
          report->checkpoint_background_seconds.value_or(0) + *(*due)->background_seconds;
      return committed(**due);
    };
    if (saver.pending()) {
      proc.recorder->SetPhase(RankPhase::kCheckpoint);
      if (absl::Status st = commit_due(); !st.ok()) return st;
      // Rank 0 has just pruned the job's temporary folders: a save starting at the same boundary
      // (every_steps 1) may write its own only once every rank knows the pruning is done.
      if (save && !saver.pending() && groups->world_size > 1) {
        if (absl::Status st = groups->world->Barrier(); !st.ok()) return st;
      }
    }
    if (diverged) return EndDiverged(*report, *groups, outputs, source, spec, *latch, waited);
    if (save) {
      proc.recorder->SetPhase(RankPhase::kCheckpoint);
      double blocked = 0;
      auto started = saver.Start(state, req, groups->rank, &blocked);
      if (!started.ok()) {
        return Prefixed(started.status(), "checkpoint after step " + std::to_string(s) + ": ");
      }
      report->checkpoint_seconds = blocked;
      if (started->has_value()) {
        if (absl::Status st = committed(**started); !st.ok()) return st;
      } else if (absl::Status st = commit_due(); !st.ok()) {  // the run's last window
        return st;
      }
    }
    outputs.OnStep(spec, *latch, *report, waited);
    // The write starts once the step's record is out.
    saver.Launch();
    if (absl::Status st = source.StepDone(*report); !st.ok()) {
      return Prefixed(st, "ReportStep: ");
    }
  }
  if (saver.pending()) {  // CommitBoundary() is never past the last window
    return absl::InternalError("checkpoint after step " + std::to_string(saver.pending_step()) +
                               ": not committed by the end of the run");
  }
  proc.recorder->SetPhase(RankPhase::kIdle);
  if (!options.save_dir.empty()) {
    if (absl::Status st = SaveHfCheckpoint(state, options.save_dir); !st.ok()) {
      return Prefixed(st, "--save: ");
    }
    if (groups->rank == 0 && !options.outputs.quiet) {
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

absl::Status RunRank(const RankJob& job, LatchSource& source, const RunOptions& options) {
  RankProcess proc;
  proc.compute_threads = ConfigureComputeThreads(job.local_ranks);
  absl::StatusOr<AttemptPlan> plan = source.Begin();
  if (!plan.ok()) return plan.status();
  // A source that brings its own counters and recorder (the heartbeats read it) keeps them.
  proc.stats =
      plan->rendezvous.stats ? plan->rendezvous.stats : std::make_shared<comm::CollectiveStats>();
  proc.recorder = plan->rendezvous.recorder ? plan->rendezvous.recorder
                                            : std::make_shared<comm::FlightRecorder>();
  while (true) {
    absl::Status st = RunAttemptCaught(job, source, options, *std::move(plan), proc);
    if (st.ok()) {
      source.Finished();
      return st;
    }
    // The job ended elsewhere: nothing of this rank's to report.
    if (st.code() == absl::StatusCode::kCancelled) return st;
    proc.recorder->SetPhase(RankPhase::kIdle);
    plan = source.Recover(std::move(st));
    if (!plan.ok()) return plan.status();
  }
}

}  // namespace latchkey
