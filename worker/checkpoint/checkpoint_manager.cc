// The checkpoint manager (checkpoint_manager.h): the order of a boundary's checkpoint work.
#include "worker/checkpoint/checkpoint_manager.h"

#include <chrono>
#include <iostream>
#include <string>
#include <utility>

#include "common/error_info.h"
#include "worker/checkpoint/save_failures.h"
#include "worker/checkpoint/training_state.h"

namespace latchkey {
namespace {

absl::Status Prefixed(const absl::Status& st, const std::string& prefix) {
  return absl::Status(st.code(), prefix + std::string(st.message()));
}

std::string After(int64_t step) { return "checkpoint after step " + std::to_string(step) + ": "; }

}  // namespace

CheckpointManager::CheckpointManager(CheckpointSaver& saver, CheckpointManagerOptions options)
    : saver_(saver), opt_(std::move(options)) {
  saver_.set_async(opt_.config.async);
  saver_.set_timeline(timeline());
}

comm::Timeline* CheckpointManager::timeline() const {
  return opt_.recorder != nullptr ? opt_.recorder->timeline() : nullptr;
}

CheckpointManager::~CheckpointManager() { Abandon(); }

bool CheckpointManager::SaveDue(int64_t step) const {
  return opt_.config.enabled() && (step + 1) % opt_.config.every_steps == 0;
}

void CheckpointManager::SetPhaseCheckpoint() {
  if (opt_.recorder != nullptr) opt_.recorder->SetPhase(RankPhase::kCheckpoint);
}

absl::Status CheckpointManager::Committed(const CommittedSave& c, WindowCheckpoint& out) {
  out.committed.push_back(c);
  if (c.background_seconds) {
    out.background_seconds = out.background_seconds.value_or(0) + *c.background_seconds;
  }
  if (opt_.on_commit) {
    if (absl::Status st = opt_.on_commit(c); !st.ok()) return st;
  }
  if (opt_.rank == 0) {
    if (absl::Status st =
            PruneCheckpoints(opt_.request.root, opt_.owner, opt_.config.keep, opt_.resume_step);
        !st.ok()) {
      return Prefixed(st, "latchkey.checkpoint.keep: pruning: ");
    }
  }
  return absl::OkStatus();
}

bool CheckpointManager::DroppedForLackOfRoom(const absl::Status& st, int64_t step,
                                             WindowCheckpoint& out) {
  if (!HasErrorReason(st, error_reason::kCheckpointOutOfSpace)) return false;
  out.not_saved.push_back(step);
  const int64_t count = CountCheckpointSaveFailure();
  std::string next = "no later save is due in this run";
  if (opt_.config.enabled()) {
    const int64_t every = opt_.config.every_steps;
    const int64_t due = (step + 1) / every * every + every - 1;
    if (due < opt_.steps) next = "the next save is tried after step " + std::to_string(due);
  }
  // One write: the ranks of a process (threads in tests) do not interleave their lines.
  std::cerr << ("latchkey-worker: rank " + std::to_string(opt_.rank) + ": " + After(step) +
                "not saved (" + std::to_string(count) +
                " dropped so far), training goes on; the newest committed checkpoint stays the "
                "newest; " +
                next + ": " + std::string(st.message()) + "\n")
            << std::flush;
  return true;
}

absl::Status CheckpointManager::CommitDue(const TrainingState& state, int64_t step, int64_t steps,
                                          WindowCheckpoint& out) {
  const int64_t saved = saver_.pending_step();
  comm::ScopedSpan span(timeline(), comm::SpanKind::kCheckpointCommit, saved);
  absl::StatusOr<std::optional<CommittedSave>> due = saver_.CommitDue(state, step, steps);
  if (!due.ok() && DroppedForLackOfRoom(due.status(), saved, out)) return absl::OkStatus();
  if (!due.ok()) return Prefixed(due.status(), After(saver_.staged().step()));
  if (!due->has_value()) {
    span.Cancel();  // not this boundary's to commit
    return absl::OkStatus();
  }
  pruned_at_ = step;
  return Committed(**due, out);
}

absl::Status CheckpointManager::BarrierAfterPruning(int64_t step) {
  // Rank 0 has just pruned the job's temporary folders: a save starting at the same boundary
  // may write its own only once every rank knows the pruning is done.
  if (pruned_at_ != step || opt_.world == nullptr || opt_.world_size <= 1) {
    return absl::OkStatus();
  }
  return opt_.world->Barrier();
}

absl::Status CheckpointManager::Start(const TrainingState& state, int64_t step,
                                      WindowCheckpoint& out) {
  SetPhaseCheckpoint();
  comm::ScopedSpan span(timeline(), comm::SpanKind::kCheckpoint, step);
  double blocked = 0;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::optional<CommittedSave>> started =
      saver_.Start(state, opt_.request, opt_.rank, &blocked);
  if (!started.ok() && DroppedForLackOfRoom(started.status(), step, out)) {
    // A synchronous save: it blocked training until every rank agreed it failed.
    last_started_step_ = step;
    out.blocked_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return absl::OkStatus();
  }
  if (!started.ok()) return Prefixed(started.status(), After(step));
  last_started_step_ = step;
  out.blocked_seconds = blocked;
  if (started->has_value()) {
    pruned_at_ = step;
    return Committed(**started, out);
  }
  // The run's last window commits its own save at once.
  return CommitDue(state, step, opt_.steps, out);
}

absl::StatusOr<WindowCheckpoint> CheckpointManager::AfterWindow(const TrainingState& state,
                                                                int64_t step, bool diverged) {
  WindowCheckpoint out;
  const bool save = !diverged && SaveDue(step);
  if (saver_.pending()) {
    SetPhaseCheckpoint();
    if (absl::Status st = CommitDue(state, step, opt_.steps, out); !st.ok()) return st;
    if (save && !saver_.pending()) {
      if (absl::Status st = BarrierAfterPruning(step); !st.ok()) return st;
    }
  }
  if (save) {
    if (absl::Status st = Start(state, step, out); !st.ok()) return st;
  }
  return out;
}

void CheckpointManager::Launch() { saver_.Launch(); }

absl::StatusOr<WindowCheckpoint> CheckpointManager::SaveNow(const TrainingState& state,
                                                            const std::string& reason) {
  const int64_t step = state.position.step;
  if (!opt_.config.enabled()) {
    return absl::FailedPreconditionError("checkpoint on demand (" + reason +
                                         "): latchkey.checkpoint.dir is not set");
  }
  WindowCheckpoint out;
  if (last_started_step_ == step) return out;  // this boundary's save is already under way
  if (saver_.pending()) {
    return absl::FailedPreconditionError(
        "checkpoint on demand (" + reason + "): the save after step " +
        std::to_string(saver_.pending_step()) + " has not committed (latchkey.checkpoint.dir " +
        opt_.request.root + ")");
  }
  if (opt_.rank == 0) {
    std::cerr << "latchkey-worker: checkpoint after step " << step << " on demand: " << reason
              << std::endl;
  }
  SetPhaseCheckpoint();
  if (absl::Status st = BarrierAfterPruning(step); !st.ok()) return st;
  if (absl::Status st = Start(state, step, out); !st.ok()) return st;
  saver_.Launch();  // no record to wait for
  return out;
}

absl::StatusOr<WindowCheckpoint> CheckpointManager::SaveForStop(const TrainingState& state,
                                                                const std::string& reason) {
  const int64_t step = state.position.step;
  if (!opt_.config.enabled()) {
    return absl::FailedPreconditionError("checkpoint for a stop (" + reason +
                                         "): latchkey.checkpoint.dir is not set");
  }
  WindowCheckpoint out;
  // The run ends at this boundary: a save pending here commits now, as at a run's last window.
  if (saver_.pending()) {
    if (absl::Status st = CommitDue(state, step, /*steps=*/step + 1, out); !st.ok()) return st;
  }
  if (last_started_step_ == step && !saver_.pending()) return out;  // this step is saved
  if (opt_.rank == 0) {
    std::cerr << "latchkey-worker: checkpoint after step " << step << " for a stop: " << reason
              << std::endl;
  }
  if (absl::Status st = BarrierAfterPruning(step); !st.ok()) return st;
  if (absl::Status st = Start(state, step, out); !st.ok()) return st;
  saver_.Launch();
  if (saver_.pending()) {  // asynchronous: the write commits here, not after a next window
    if (absl::Status st = CommitDue(state, step, /*steps=*/step + 1, out); !st.ok()) return st;
  }
  return out;
}

void CheckpointManager::Abandon() { saver_.Abandon(); }

absl::Status CheckpointManager::CheckAllCommitted() const {
  if (!saver_.pending()) return absl::OkStatus();
  return absl::InternalError("checkpoint after step " + std::to_string(saver_.pending_step()) +
                             ": not committed by the end of the run");
}

}  // namespace latchkey
