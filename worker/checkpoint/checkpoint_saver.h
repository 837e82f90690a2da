// The driver of resumable checkpoints (latchkey.checkpoint) under the checkpoint manager
// (checkpoint_manager.h, which decides when to call it): how a save starts, when it commits, and
// on which thread each phase of checkpointer.h runs.
//
// Synchronous (latchkey.checkpoint.async false): the save after window s runs whole at the
// boundary after s (SaveTrainingCheckpoint), as it always did.
//
// Asynchronous (the default): at the boundary after s the training thread only stages the state
// into the host buffers of one StagedCheckpoint (reused by every save of the process); a
// background thread then writes, fsyncs and checksums this rank's files while training goes on.
// The commit's collectives (CommitStagedCheckpoint: the all-gather of the outcomes, rank 0's
// commit, the broadcast, the barrier) run on the training thread at the boundary every rank
// picks by the same rule, CommitBoundary(): the boundary after the next window (s + 1), or s
// itself when s is the run's last window. There the training thread first waits for its own
// write if it has not finished. The next save waits for the previous one (it can start only
// after that one committed). Nothing of a save that has not committed is ever loaded: a crash
// (or a failed attempt) during the background write leaves the previous checkpoint the newest
// valid one, and its temporary folder is pruned by the next commit. A save whose write found no
// room on some rank comes back from CommitDue (or a synchronous Start) as the commit's
// CHECKPOINT_OUT_OF_SPACE error, no longer pending and with nothing of it left on disk: the
// manager drops it and training goes on (checkpoint_manager.h). Crash point (common/
// crash_point.h) checkpoint.background_write: on the background thread, as its write begins.
//
// Torch-free (the runner never includes torch). Thread-safety: every method is called by the
// training thread; the object owns the one background thread. Errors: the phases' Status.
#ifndef LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_SAVER_H_
#define LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_SAVER_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/comm/timeline.h"

namespace latchkey {

// The boundary after which the save started after window `save_step` commits, in a run of
// `steps` windows: the boundary after the next window, or the last window's own.
int64_t CommitBoundary(int64_t save_step, int64_t steps);

// A save that committed at a boundary.
struct CommittedSave {
  CheckpointCommit commit;  // blocked_seconds: the training time its start blocked
  // Asynchronous saves only: from the end of the staging to the end of the commit (the JSONL's
  // checkpoint_background_seconds on the committing step); nullopt for a synchronous save.
  std::optional<double> background_seconds;
  double write_seconds = 0;   // the background write alone (files, fsync, SHA-256)
  double commit_seconds = 0;  // the training thread at the commit boundary (waiting included)
  double wait_seconds = 0;    // of which waiting for the unfinished write
};

class CheckpointSaver {
 public:
  explicit CheckpointSaver(bool async) : async_(async) {}
  // Waits for an in-flight write (a process waits for its background save before it exits).
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  bool async() const { return async_; }
  void set_async(bool async) { async_ = async; }
  // Where the background write adds its span (null: nowhere). Set before Launch.
  void set_timeline(comm::Timeline* timeline) { timeline_ = timeline; }
  // Whether a started save has not committed yet.
  bool pending() const { return pending_; }
  // The step of the pending save (-1: none).
  int64_t pending_step() const { return pending_ ? staged_.step() : -1; }
  const StagedCheckpoint& staged() const { return staged_; }

  // At the boundary after window `step` of a run of `steps` windows: commits the pending save
  // when this is its CommitBoundary() (COLLECTIVE then; waits for the write first). Returns the
  // committed save, or nullopt when none is due.
  absl::StatusOr<std::optional<CommittedSave>> CommitDue(const TrainingState& state, int64_t step,
                                                         int64_t steps);

  // Starts the save of the state after window state.position.step on global rank `rank`.
  // Synchronous: the whole save (collective), returned as committed. Asynchronous: stages it
  // (not collective) and returns nullopt. Either way `blocked_seconds` gets the training time
  // it blocked here (the JSONL's checkpoint_seconds). REQUIRES: !pending().
  absl::StatusOr<std::optional<CommittedSave>> Start(const TrainingState& state,
                                                     const TrainingCheckpointRequest& req, int rank,
                                                     double* blocked_seconds);

  // Asynchronous: hands the staged save to the background thread (a no-op when nothing is
  // staged or it is already running). Called after Start, once the step's outputs are out.
  void Launch();

  // Waits for an in-flight write and drops the pending save without committing it (a failed
  // attempt: its temporary folder stays until a later commit prunes it).
  void Abandon();

 private:
  void Join();

  bool async_;
  StagedCheckpoint staged_;
  bool pending_ = false;   // staged, not committed
  bool launched_ = false;  // the write was handed to the thread (or has run)
  std::thread writer_;
  // Written by the background thread, read after Join().
  absl::Status write_status_;
  double write_seconds_ = 0;
  double blocked_seconds_ = 0;  // the staging time of the pending save
  int rank_ = 0;
  comm::Timeline* timeline_ = nullptr;
  std::chrono::steady_clock::time_point staged_at_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_SAVER_H_
