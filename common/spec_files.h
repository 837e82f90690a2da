// The files a job spec names, checked as its workers will open them, before any process starts
// or any restart is spent on them: latchkey.data.tokens_file and latchkey.eval.tokens_file
// (readable regular files), a Megatron dataset's P.idx and P.bin for latchkey.data.path_prefix
// and every latchkey.data.blend[i].path_prefix (readable regular files), the index cache folder
// (latchkey.data.cache_dir, or its default: writable, or creatable in a writable folder) and
// latchkey.init_from (a readable folder). `latchkey submit`, `latchkey up` and `latchkey
// validate` call it where they run (unless --no-file-check); a worker calls it once it has the
// job's spec and reports a refusal as a configuration error, so the job fails at once naming the
// field.
//
// Thread-safety: reentrant; the filesystem is read, never written.
#ifndef LATCHKEY_COMMON_SPEC_FILES_H_
#define LATCHKEY_COMMON_SPEC_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "common/job_spec.h"

namespace latchkey {

// OK when every file the spec names exists and is readable (paths are absolute after
// ParseJobSpec) and the index cache folder can be written. Otherwise INVALID_ARGUMENT for the
// first that is not, naming the field, the path and the reason: "latchkey.data.tokens_file:
// cannot read '/d/x.bin': No such file or directory", "...: it is a folder, not a file",
// "latchkey.init_from: cannot read '/m': it is not a folder", "latchkey.data.path_prefix: cannot
// read '/d/corpus.idx': No such file or directory", "latchkey.data.cache_dir: cannot write
// '/c': Permission denied".
absl::Status CheckSpecFiles(const JobSpec& spec);

// The index cache folder of a Megatron dataset (docs/data.md "The index cache"):
// latchkey.data.cache_dir, else "latchkey-index-cache" beside the first dataset when that folder
// is writable, else "index-cache" under latchkey.checkpoint.dir, else "latchkey-index-cache"
// under the system's temporary folder.
std::string MegatronCacheDir(const JobSpec& spec);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_SPEC_FILES_H_
