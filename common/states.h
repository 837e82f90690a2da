// The one name table for job and worker states. Server, CLI, worker session and metric labels
// all spell states with these lowercase names; proto JSON keeps its own enum names
// (JOB_STATE_RUNNING), converted in proto/wire.cc.
#ifndef LATCHKEY_COMMON_STATES_H_
#define LATCHKEY_COMMON_STATES_H_

#include <optional>
#include <string_view>

namespace latchkey {

// Values equal latchkey.v1.JobState / WorkerState (stored as integers; never renumber).
// kRecovering: a rank failed and the job restarts every rank from its last checkpoint (a new
// attempt); it goes back to kRunning once every rank of the new attempt has joined.
enum class JobState {
  kPending = 1,
  kRunning = 2,
  kSucceeded = 3,
  kFailed = 4,
  kCancelled = 5,
  kRecovering = 6,
  // Ranks left on a stop signal after the attempt committed its last completed step; resumes
  // (a new attempt, no restart) once they join again.
  kPreempted = 7,
  // The same save-and-stop on demand (latchkey suspend); resumes on latchkey resume.
  kSuspended = 8
};
enum class WorkerState { kJoined = 1, kActive = 2, kDone = 3, kLost = 4, kFailed = 5 };

inline constexpr JobState kAllJobStates[] = {
    JobState::kPending,   JobState::kRunning,    JobState::kSucceeded, JobState::kFailed,
    JobState::kCancelled, JobState::kRecovering, JobState::kPreempted, JobState::kSuspended};
inline constexpr WorkerState kAllWorkerStates[] = {WorkerState::kJoined, WorkerState::kActive,
                                                   WorkerState::kDone, WorkerState::kLost,
                                                   WorkerState::kFailed};

const char* JobStateName(JobState s);        // "pending", "running", ...
const char* WorkerStateName(WorkerState s);  // "joined", "active", ...
// Inverse of the above; nullopt for an unknown name.
std::optional<JobState> ParseJobState(std::string_view name);
std::optional<WorkerState> ParseWorkerState(std::string_view name);

inline bool IsTerminal(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled;
}

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_STATES_H_
