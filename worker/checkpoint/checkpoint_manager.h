// The checkpoint choreography of one attempt of a rank (latchkey.checkpoint), behind one call
// per window (AfterWindow; then Launch, which only starts a staged write): when a save is due
// (every_steps), starting it (synchronous, or staged and written in the background:
// checkpoint_saver.h), committing it at its boundary, pruning after a commit (rank 0,
// latchkey.checkpoint.keep) and the barrier that pruning needs. The runner calls AfterWindow once
// per window and Launch once the window's record is out; SaveNow saves on demand (a preemption
// notice); Abandon drops an unfinished save of a failed attempt. As torchtitan's trainer calls
// checkpointer.save(step) each step and leaves should-save, the async wait and the purge to the
// checkpointer.
//
// Order at the boundary after window s (every rank the same, it is collective):
//   1. a pending asynchronous save whose CommitBoundary() is s commits (waiting for its write);
//   2. for each save committed: the attempt's on_commit (the runner's metrics and its report to
//      the coordinator), then rank 0 prunes (after the report: the coordinator learns of the
//      new checkpoint before an old one goes);
//   3. a save due at s (not after a diverged window) starts, after a world barrier when step 2
//      pruned at this same boundary (every_steps 1: rank 0's pruning removes the job's
//      temporary folders, so no rank may create its own before the pruning is done). A
//      synchronous save commits here (step 2 again); an asynchronous one is staged, and commits
//      at once when s is the run's last window;
//   4. the runner emits the window's record, then calls Launch(): the background write starts
//      once the record is out.
//
// A full disk (docs/fault-tolerance.md, "Disk full"): a save that some rank could not write for
// lack of room (ENOSPC, EDQUOT, EFBIG), its file or rank 0's manifest, fails at its commit
// (step 1, or step 3 when synchronous) on every rank alike: the commit's exchange of outcomes is
// the agreement (checkpointer.h, CommitStagedCheckpoint), no manifest is committed and every
// rank removes what it wrote. The manager then drops the save (WindowCheckpoint::not_saved,
// save_failures.h's count, a line on the rank's stderr naming the file and the error) and the
// boundary goes on as if no save had been pending: the previous committed checkpoint stays the
// newest, training goes on, the next save is tried at its cadence. Any other write error ends
// the attempt as before.
//
// Thread-safety: the training thread only (the saver owns the background writer). Errors: the
// phases' Status, prefixed with what failed ("checkpoint after step N: ", "latchkey.checkpoint.
// keep: pruning: "); on_commit's own Status as it returns it. A save dropped for lack of room
// is not an error. After an error the attempt is over: destroy the manager (or call Abandon)
// and do not call AfterWindow again.
#ifndef LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_MANAGER_H_
#define LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_MANAGER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/checkpoint/checkpoint_saver.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/comm/comm.h"
#include "worker/comm/flight_recorder.h"

namespace latchkey {

struct CheckpointManagerOptions {
  CheckpointConfig config;  // latchkey.checkpoint (disabled: no dir; nothing is ever saved)
  int64_t steps = 0;        // the run's windows (the last one commits its own save)
  TrainingCheckpointRequest request;  // root (config.dir), job id and uid, attempt, threads
  CheckpointOwner owner;              // pruned as this job's
  int64_t resume_step = -1;           // the attempt's resume checkpoint: never pruned
  int rank = 0;                       // global rank (rank 0 prunes)
  // The world: the barrier after pruning (world_size > 1). Not owned.
  comm::Group* world = nullptr;
  int world_size = 1;
  // Marks the checkpoint phase of the flight recorder (RankPhase::kCheckpoint); may be null.
  comm::FlightRecorder* recorder = nullptr;
  // Called for each committed save, in commit order, before rank 0 prunes. Its error ends
  // AfterWindow / SaveNow with that error, unchanged.
  std::function<absl::Status(const CommittedSave&)> on_commit;
};

// What the checkpoint work at one boundary did (the window's record reports it).
struct WindowCheckpoint {
  std::vector<CommittedSave> committed;  // in commit order (every_steps 1, last window: two)
  // A save started at this boundary: the training time it blocked (JSONL checkpoint_seconds).
  std::optional<double> blocked_seconds;
  // Sum of the committed asynchronous saves' background_seconds; nullopt when none committed.
  std::optional<double> background_seconds;
  // The steps whose saves failed here for lack of room and were dropped (counted and logged).
  std::vector<int64_t> not_saved;
};

class CheckpointManager {
 public:
  // `saver` is the process's (its staging buffers are reused by every attempt); its async mode
  // is set from options.config.async. Not owned; must outlive the manager.
  CheckpointManager(CheckpointSaver& saver, CheckpointManagerOptions options);
  // Abandon(): a save that has not committed is never committed by a later attempt.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Whether a save is due after window `step` (every_steps), checkpoints enabled.
  bool SaveDue(int64_t step) const;

  // Steps 1-3 of the header, at the boundary after window `step` (the state is the state after
  // it). `diverged`: the window's update was not applied: a due commit still happens, no save
  // starts. COLLECTIVE.
  absl::StatusOr<WindowCheckpoint> AfterWindow(const TrainingState& state, int64_t step,
                                               bool diverged = false);

  // Step 4: starts the background write of a save staged at this boundary (a no-op otherwise).
  void Launch();

  // A save of the state now (after window state.position.step), whatever the cadence, for
  // `reason` (said on rank 0's stderr and in its errors). Call between windows, after
  // AfterWindow of that window; COLLECTIVE (every rank at the same boundary). Synchronous
  // (latchkey.checkpoint.async false): saved and committed here (returned, on_commit called,
  // pruned). Asynchronous: staged and its write started here; it commits at the boundary its
  // CommitBoundary() names, through AfterWindow (at once when this is the run's last window).
  // A no-op (nothing returned) when the save of this step was already started. Errors:
  // FAILED_PRECONDITION naming latchkey.checkpoint.dir when checkpoints are disabled, or when a
  // save of an earlier step has not committed yet; else as AfterWindow.
  absl::StatusOr<WindowCheckpoint> SaveNow(const TrainingState& state, const std::string& reason);

  // The save a stop needs (docs/fault-tolerance.md "Preemption"): the state now (after window
  // state.position.step, the attempt's last) saved and committed here, whatever the cadence and
  // whether saves are asynchronous: a pending save of this step commits at once (waiting for
  // its write), else this step is saved synchronously and committed. on_commit runs for what
  // commits. Call after AfterWindow and Launch of that window; COLLECTIVE. Errors as SaveNow.
  absl::StatusOr<WindowCheckpoint> SaveForStop(const TrainingState& state,
                                               const std::string& reason);

  // Waits for an in-flight background write and drops the save that has not committed (a
  // failed attempt: nothing of it is loaded, its temporary folder is pruned by a later commit).
  void Abandon();

  // At the end of the run: INTERNAL when a save has not committed (CommitBoundary() is never
  // past the last window, so it cannot happen).
  absl::Status CheckAllCommitted() const;

  // Whether a save has started and not committed.
  bool pending() const { return saver_.pending(); }

 private:
  // When `st` says every rank agreed the save of `step` failed for lack of room
  // (CHECKPOINT_OUT_OF_SPACE): counts it, says so on stderr, notes it in `out`; true. Else false.
  bool DroppedForLackOfRoom(const absl::Status& st, int64_t step, WindowCheckpoint& out);
  // Commits the pending save when `step` is its boundary in a run of `steps` windows:
  // on_commit, then rank 0 prunes.
  absl::Status CommitDue(const TrainingState& state, int64_t step, int64_t steps,
                         WindowCheckpoint& out);
  // on_commit, then (rank 0) pruning, for one committed save.
  absl::Status Committed(const CommittedSave& c, WindowCheckpoint& out);
  // The world barrier a save starting at `step` needs when a commit pruned at that boundary.
  absl::Status BarrierAfterPruning(int64_t step);
  // Starts the save of the state after `step`; commits it when synchronous or the last window.
  absl::Status Start(const TrainingState& state, int64_t step, WindowCheckpoint& out);
  comm::Timeline* timeline() const;  // the recorder's (null: none)
  void SetPhaseCheckpoint();

  CheckpointSaver& saver_;
  CheckpointManagerOptions opt_;
  int64_t last_started_step_ = -1;  // the step of the newest save started by this attempt
  int64_t pruned_at_ = -1;          // the boundary of the newest commit (rank 0 pruned there)
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_MANAGER_H_
