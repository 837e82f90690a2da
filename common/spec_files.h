// The files a job spec names, checked as its workers will open them, before any process starts
// or any restart is spent on them: latchkey.data.tokens_file and latchkey.eval.tokens_file
// (readable regular files) and latchkey.init_from (a readable folder). `latchkey submit`,
// `latchkey up` and `latchkey validate` call it where they run (unless --no-file-check); a
// worker calls it once it has the job's spec and reports a refusal as a configuration error,
// so the job fails at once naming the field.
//
// Thread-safety: reentrant; the filesystem is read, never written.
#ifndef LATCHKEY_COMMON_SPEC_FILES_H_
#define LATCHKEY_COMMON_SPEC_FILES_H_

#include "absl/status/status.h"
#include "common/job_spec.h"

namespace latchkey {

// OK when every file the spec names exists and is readable (paths are absolute after
// ParseJobSpec). Otherwise INVALID_ARGUMENT for the first that is not, naming the field, the
// path and the reason: "latchkey.data.tokens_file: cannot read '/d/x.bin': No such file or
// directory", "...: it is a folder, not a file", "latchkey.init_from: cannot read '/m': it is not a
// folder".
absl::Status CheckSpecFiles(const JobSpec& spec);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_SPEC_FILES_H_
