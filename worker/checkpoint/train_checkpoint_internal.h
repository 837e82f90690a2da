// What train_checkpoint.cc (the format, the commit) and checkpoint_root.cc (names, ownership,
// discovery, pruning) share besides the public header train_checkpoint.h. Not for other users.
#ifndef LATCHKEY_WORKER_CHECKPOINT_TRAIN_CHECKPOINT_INTERNAL_H_
#define LATCHKEY_WORKER_CHECKPOINT_TRAIN_CHECKPOINT_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey {

// step_dir's manifest, parsed, without looking at the files it lists: DATA_LOSS when its
// SHA-256 is not `expected` (when non-empty), when it is malformed, or when the folder's name
// (step-N, step-N.<uid>) disagrees with its step or job uid. `sha256` (may be null) receives
// the SHA-256 of its bytes.
absl::StatusOr<CheckpointManifest> ReadManifestOnly(const std::string& step_dir,
                                                    absl::string_view expected,
                                                    std::string* sha256);

// The name under `root` that CommitCheckpoint commits `manifest` to (train_checkpoint.h):
// step-N or step-N.<job uid>.
absl::StatusOr<std::string> CommitDirName(const std::string& root,
                                          const CheckpointManifest& manifest);

// Where CommitCheckpoint moves a committed folder of the same job and step before replacing
// it: ".step-00000011.<uid>.replaced.tmp" (".step-00000011.replaced.tmp" without a uid).
std::string CheckpointAsideDirName(int64_t step, const std::string& job_uid);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_TRAIN_CHECKPOINT_INTERNAL_H_
