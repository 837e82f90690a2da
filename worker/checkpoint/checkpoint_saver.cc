#include "worker/checkpoint/checkpoint_saver.h"

#include <exception>
#include <string>
#include <utility>

#include "common/crash_point.h"

namespace latchkey {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int64_t CommitBoundary(int64_t save_step, int64_t steps) {
  // One window of slack: long enough for the write of a window's worth of training time, short
  // enough that a recovery rarely goes back further than a synchronous save would have.
  return save_step + 1 < steps ? save_step + 1 : save_step;
}

CheckpointSaver::~CheckpointSaver() { Join(); }

void CheckpointSaver::Join() {
  if (writer_.joinable()) writer_.join();
}

absl::StatusOr<std::optional<CommittedSave>> CheckpointSaver::CommitDue(const TrainingState& state,
                                                                        int64_t step,
                                                                        int64_t steps) {
  if (!pending_ || CommitBoundary(staged_.step(), steps) != step) return std::nullopt;
  const auto start = Clock::now();
  // The end of the run may come before Launch (the last window's own save).
  Launch();
  Join();
  CommittedSave out;
  out.wait_seconds = SecondsSince(start);
  out.write_seconds = write_seconds_;
  pending_ = false;
  launched_ = false;
  // Every rank calls this at the same boundary, also one whose write failed: the commit's
  // exchange of outcomes is how the others learn of it.
  absl::StatusOr<CheckpointCommit> commit = CommitStagedCheckpoint(state, staged_, write_status_);
  if (!commit.ok()) return commit.status();
  out.commit = *std::move(commit);
  out.commit.blocked_seconds = blocked_seconds_;
  out.commit_seconds = SecondsSince(start);
  out.background_seconds = SecondsSince(staged_at_);
  return std::optional<CommittedSave>(std::move(out));
}

absl::StatusOr<std::optional<CommittedSave>> CheckpointSaver::Start(
    const TrainingState& state, const TrainingCheckpointRequest& req, int rank,
    double* blocked_seconds) {
  if (pending_) {
    return absl::FailedPreconditionError("checkpoint: the save of step " +
                                         std::to_string(staged_.step()) + " has not committed");
  }
  rank_ = rank;
  if (!async_) {
    absl::StatusOr<CheckpointCommit> commit = SaveTrainingCheckpoint(state, req);
    if (!commit.ok()) return commit.status();
    *blocked_seconds = commit->blocked_seconds;
    CommittedSave out;
    out.commit = *std::move(commit);
    out.commit_seconds = out.commit.blocked_seconds;
    return std::optional<CommittedSave>(std::move(out));
  }
  const auto start = Clock::now();
  if (absl::Status st = StageTrainingCheckpoint(state, req, staged_); !st.ok()) return st;
  staged_at_ = Clock::now();
  blocked_seconds_ = std::chrono::duration<double>(staged_at_ - start).count();
  *blocked_seconds = blocked_seconds_;
  pending_ = true;
  launched_ = false;
  write_status_ = absl::OkStatus();
  write_seconds_ = 0;
  return std::nullopt;
}

void CheckpointSaver::Launch() {
  if (!pending_ || launched_) return;
  launched_ = true;
  // The thread touches only the staged host copy and the disk, never the training state or a
  // collective, so training (and its collectives) go on beside it.
  writer_ = std::thread([this] {
    const auto start = Clock::now();
    comm::ScopedSpan span(timeline_, comm::SpanKind::kCheckpointWrite, staged_.step());
    MaybeCrash("checkpoint.background_write", rank_, staged_.step());
    // Nothing may escape a thread: an exception (the allocator's) becomes the write's Status,
    // which the commit then shares with every rank.
    try {
      write_status_ = WriteStagedCheckpoint(staged_);
    } catch (const std::exception& e) {
      write_status_ = absl::InternalError("checkpoint of step " + std::to_string(staged_.step()) +
                                          ": background write: " + e.what());
    }
    write_seconds_ = SecondsSince(start);
  });
}

void CheckpointSaver::Abandon() {
  Join();
  pending_ = false;
  launched_ = false;
}

}  // namespace latchkey
