// What `latchkey checkpoint inspect | export --hf | convert` do with a resumable training
// checkpoint (docs/fault-tolerance.md), torch-free so the CLI can link it: verify and describe
// one, consolidate its weights into an HF GPTBigCode folder, rewrite a version 1 checkpoint as
// latchkey-checkpoint/2. Each works on a checkpoint of any layout.
//
// Thread-safety: reentrant (concurrent calls on the same output folder are not).
// Errors: DATA_LOSS naming the file (a size or SHA-256 that does not match, a truncated piece),
// NOT_FOUND for a missing folder or manifest, FAILED_PRECONDITION (convert: already version 2),
// INVALID_ARGUMENT for an output the HF writer refuses, INTERNAL for OS errors.
#ifndef LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_TOOLS_H_
#define LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_TOOLS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latchkey {

// Verifies every file (size, SHA-256) and every piece (SHA-256) of the checkpoint in `step_dir`
// and returns a report: format, job, step, data position, writing layout, model, each logical
// tensor with its shape and pieces, each file with its size.
absl::StatusOr<std::string> InspectCheckpoint(const std::string& step_dir);

// Writes `out_dir`/model.safetensors and config.json (hf_checkpoint.h): every parameter
// assembled from the checkpoint's pieces (the fp32 master in bf16 mode).
absl::Status ExportCheckpointToHf(const std::string& step_dir, const std::string& out_dir);

// Rewrites the version 1 checkpoint in `src_step_dir` as latchkey-checkpoint/2 under `dst_root`
// (dst_root/step-N, committed as a save commits: rank files, then the manifest last), with the
// pieces the writing layout would have written. The result keeps the source's data position
// (next_first_sample -1: derived at load, as for version 1) and records seed 0 (version 1 did
// not record it). Version 1 had no job uid and neither has the result: FAILED_PRECONDITION when
// dst_root/step-N holds another job's checkpoint (CommitCheckpoint). Returns the new step folder.
absl::StatusOr<std::string> ConvertCheckpoint(const std::string& src_step_dir,
                                              const std::string& dst_root);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_CHECKPOINT_TOOLS_H_
