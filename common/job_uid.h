// A job's uid: the identity its checkpoints carry (docs/fault-tolerance.md "Whose checkpoint
// is it"). Job ids repeat across coordinators (every coordinator numbers its jobs job-000001,
// job-000002, ...), so a checkpoint folder shared by jobs of two coordinators cannot tell them
// apart by job id. The coordinator draws a uid when a job is submitted and keeps it with the job
// for every attempt and `latchkey resume`; a standalone run draws one for itself (or continues
// the uid of the checkpoint it resumes).
//
// Thread-safety: both functions are reentrant.
#ifndef LATCHKEY_COMMON_JOB_UID_H_
#define LATCHKEY_COMMON_JOB_UID_H_

#include <string>

#include "absl/strings/string_view.h"

namespace latchkey {

// The digits NewJobUid draws: 64 random bits as lowercase hex.
inline constexpr int kJobUidDigits = 16;

// A fresh uid: kJobUidDigits lowercase hex digits from std::random_device (/dev/urandom).
std::string NewJobUid();

// Whether `uid` is a job uid as stored and written: 8 to 64 lowercase hex digits (it becomes
// part of a folder name, so nothing else is accepted).
bool IsJobUid(absl::string_view uid);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_JOB_UID_H_
