// Machine-readable details on an error, in the shape of google.rpc.ErrorInfo: a domain, a
// reason (an UPPER_SNAKE constant) and string metadata. Callers decide on the Status code and
// these details, never on message text; the message is for people.
//
// The details ride on the absl::Status as a payload (type URL kErrorInfoTypeUrl), so they
// survive being returned through any number of layers; proto/grpc_status.cc turns them into a
// google.rpc.Status detail on the wire and back, in exactly one place.
//
// Thread-safety: free functions on values.
#ifndef LATCHKEY_COMMON_ERROR_INFO_H_
#define LATCHKEY_COMMON_ERROR_INFO_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace latchkey {

inline constexpr char kErrorDomain[] = "latchkey.v1";
inline constexpr char kErrorInfoTypeUrl[] = "type.googleapis.com/google.rpc.ErrorInfo";

// The reasons latchkey gives (domain kErrorDomain). Metadata keys are listed with each.
namespace error_reason {
// ABORTED: the call named an attempt of the job that is not the job's current one.
// Metadata: job_attempt (the job's current attempt), worker_attempt (the one the call named).
inline constexpr char kAttemptFenced[] = "ATTEMPT_FENCED";
// FAILED_PRECONDITION: the worker's session was closed; its calls end with this.
inline constexpr char kSessionClosed[] = "SESSION_CLOSED";
// FAILED_PRECONDITION: the training diverged: a window's loss or global gradient norm is not
// finite (NaN or ±Inf), so its update was not applied. A training outcome, not a fault: a re-run
// from the same state diverges the same way, so the job fails at once, with no recovery.
// Metadata: quantity ("loss" or "grad_norm"), value ("NaN", "Inf" or "-Inf"), step (0-based),
// rank (the rank that says so; every rank reaches the same verdict).
inline constexpr char kTrainingDiverged[] = "TRAINING_DIVERGED";
// RESOURCE_EXHAUSTED: a resumable checkpoint's save found no room on some rank (ENOSPC, EDQUOT
// or EFBIG): every rank agreed it failed, none committed it and each removed what it had
// written. The worker's checkpoint manager counts it and training goes on; it never ends an
// attempt. Metadata: step (the save's), rank (the first rank that found no room).
inline constexpr char kCheckpointOutOfSpace[] = "CHECKPOINT_OUT_OF_SPACE";
// ABORTED: the rank a join asked for is held by another worker of the job's current attempt.
// Not final: the rank is freed when its holder leaves, is fenced, or misses its liveness
// deadline (the job then recovers, and its next attempt frees every rank), so the joiner (a
// replacement of a dead process) waits and asks again. Metadata: rank, holder (worker id).
inline constexpr char kRankHeld[] = "RANK_HELD";
// ABORTED, worker side: the attempt stops before window `before_window` (a rank left on a stop
// signal, or the job is being suspended: docs/fault-tolerance.md "Preemption"). No latch from
// that window on comes; the rank saves the state after before_window - 1 with the others.
// Metadata: before_window.
inline constexpr char kAttemptStopped[] = "ATTEMPT_STOPPED";
// FAILED_PRECONDITION: the job is suspended (latchkey suspend); it takes workers again after
// `latchkey resume`. A worker refused so, or whose attempt ended so, exits kExitPreempted.
inline constexpr char kJobSuspended[] = "JOB_SUSPENDED";
}  // namespace error_reason

struct ErrorInfo {
  std::string reason;
  std::string domain = kErrorDomain;
  std::map<std::string, std::string> metadata;

  // The metadata value `key` as an integer; nullopt when absent or not an integer.
  std::optional<int64_t> IntMetadata(const std::string& key) const;
  friend bool operator==(const ErrorInfo& a, const ErrorInfo& b) {
    return a.reason == b.reason && a.domain == b.domain && a.metadata == b.metadata;
  }
};

// `status` with `info` attached (replacing any earlier ErrorInfo). An OK status stays OK.
absl::Status WithErrorInfo(absl::Status status, const ErrorInfo& info);
// The ErrorInfo attached to `status`, if any (and well formed).
std::optional<ErrorInfo> GetErrorInfo(const absl::Status& status);
// True when `status` carries an ErrorInfo of domain kErrorDomain with `reason`.
bool HasErrorReason(const absl::Status& status, absl::string_view reason);

// The payload's bytes: a JSON object {"reason","domain","metadata"}. Exposed for the wire
// conversion (proto/grpc_status.cc) only.
std::string EncodeErrorInfo(const ErrorInfo& info);
std::optional<ErrorInfo> DecodeErrorInfo(absl::string_view bytes);

// The end of a closed worker session's calls: FAILED_PRECONDITION "session closed", reason
// SESSION_CLOSED (not CANCELLED: a cancelled job; not ABORTED with ATTEMPT_FENCED: a fenced
// attempt).
absl::Status SessionClosedError();

// The refusal of a call of a fenced attempt (ABORTED, reason ATTEMPT_FENCED).
absl::Status AttemptFencedError(absl::string_view message, int64_t job_attempt,
                                int64_t worker_attempt);

// The end of an attempt that stops before `before_window` (ABORTED, reason ATTEMPT_STOPPED).
absl::Status AttemptStoppedError(int64_t before_window);

// "NaN", "Inf" or "-Inf" for a value that is not finite; the number ("%g") otherwise.
std::string NonFiniteName(double value);

// The verdict on a window whose `quantity` ("loss" or "grad_norm") is `value` (not finite):
// FAILED_PRECONDITION "loss is NaN at step 1 (rank 0)", reason TRAINING_DIVERGED.
absl::Status TrainingDivergedError(absl::string_view quantity, double value, int64_t step,
                                   int rank);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_ERROR_INFO_H_
