#include "common/states.h"

namespace latchkey {

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kPending:
      return "pending";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelled:
      return "cancelled";
    case JobState::kRecovering:
      return "recovering";
    case JobState::kPreempted:
      return "preempted";
    case JobState::kSuspended:
      return "suspended";
  }
  return "unknown";
}

const char* WorkerStateName(WorkerState s) {
  switch (s) {
    case WorkerState::kJoined:
      return "joined";
    case WorkerState::kActive:
      return "active";
    case WorkerState::kDone:
      return "done";
    case WorkerState::kLost:
      return "lost";
    case WorkerState::kFailed:
      return "failed";
  }
  return "unknown";
}

std::optional<JobState> ParseJobState(std::string_view name) {
  for (JobState s : kAllJobStates) {
    if (name == JobStateName(s)) return s;
  }
  return std::nullopt;
}

std::optional<WorkerState> ParseWorkerState(std::string_view name) {
  for (WorkerState s : kAllWorkerStates) {
    if (name == WorkerStateName(s)) return s;
  }
  return std::nullopt;
}

}  // namespace latchkey
