// Resumable training checkpoints on disk (docs/fault-tolerance.md): the per-rank files, the
// manifest, the commit protocol's file operations, verification, discovery and pruning.
// Torch-free and comm-free: the engine gathers the state and the ranks' confirmations; this
// file only reads and writes folders.
//
//   root/step-00000011/rank-00000.safetensors ... manifest.json     committed
//   root/.step-00000015.a2.tmp/                                      being written (attempt 2)
//
// Errors name the path and the reason: NOT_FOUND (missing file), DATA_LOSS (a size or SHA-256
// that does not match the manifest, a malformed manifest), FAILED_PRECONDITION (a manifest of
// another job or layout), INTERNAL (an OS error).
//
// Thread-safety: all functions are reentrant; concurrent calls on the same folder are not.
#ifndef LATCHKEY_WORKER_CHECKPOINT_TRAIN_CHECKPOINT_H_
#define LATCHKEY_WORKER_CHECKPOINT_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "common/sha256.h"
#include "worker/checkpoint/safetensors.h"

namespace latchkey {

// The format written; version 1 (one flat file per rank, loadable only by its own layout when
// it was written, now by any) is still read.
inline constexpr char kTrainCheckpointFormat[] = "latchkey-checkpoint/2";
inline constexpr char kTrainCheckpointFormatV1[] = "latchkey-checkpoint/1";

struct CheckpointFileEntry {
  std::string name;  // e.g. "rank-00001.safetensors"
  int64_t bytes = 0;
  std::string sha256;  // lowercase hex
};

// One stored rectangle of a logical tensor (logical_layout.h): `key` in `file`, covering
// `offsets` + `shape` of the global tensor, F32, row-major; `sha256` of its bytes.
struct CheckpointPiece {
  std::string file;
  std::string key;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  std::string sha256;  // version 1: empty (its file's SHA-256 covers it)
  // Version 1 only (never written): where the piece starts in the elements of tensor `key`.
  int64_t element_offset = 0;
};

// A logical tensor: "param/<HF name>", "exp_avg/<HF name>" or "exp_avg_sq/<HF name>".
struct CheckpointTensor {
  std::string kind;   // TensorKindName
  std::string param;  // HF name
  std::vector<int64_t> shape;
  std::vector<CheckpointPiece> pieces;
};

struct CheckpointManifest {
  int version = 2;     // 1: latchkey-checkpoint/1
  std::string job_id;  // "standalone" without a coordinator
  int64_t step = 0;    // the state after this step
  int64_t attempt = 1;
  int64_t latch_generation = 0;        // of latch(step)
  int64_t next_window = 0;             // step + 1
  int64_t next_first_micro_batch = 0;  // in micro-batches of the writing layout
  int64_t next_first_sample = -1;      // stream positions consumed; -1 in version 1
  uint64_t seed = 0;                   // latchkey.seed (version 2)
  // The writing layout.
  int world_size = 1;
  int tp = 1;
  int dp = 1;
  int zero_stage = 0;
  bool bf16 = false;
  std::string optimizer;        // "AdamW" or "SGD"
  int64_t optimizer_step = -1;  // steps the optimizer took; version 1: in the rank files
  int compute_threads = 1;
  ModelConfig model;
  std::vector<CheckpointTensor> tensors;   // version 2
  std::vector<CheckpointFileEntry> files;  // one per global rank, rank order
  int64_t created_unix_seconds = 0;
};

// A checkpoint every rank has confirmed and rank 0 has committed (its manifest is on disk).
struct CheckpointCommit {
  int64_t step = 0;
  std::string dir;              // the committed step-N folder
  std::string manifest_sha256;  // hex
  int64_t bytes = 0;            // all files of the checkpoint
  double blocked_seconds = 0;   // training time it blocked on this rank
};

std::string CheckpointStepDirName(int64_t step);                   // "step-00000011"
std::string CheckpointTempDirName(int64_t step, int64_t attempt);  // ".step-00000011.a2.tmp"
std::string CheckpointRankFileName(int rank);                      // "rank-00001.safetensors"

// Whether a verified checkpoint's manifest `m` (read from `dir`) fits the job `want` describes,
// whatever layout wrote it (world_size, tp, dp, zero_stage and bf16 may all differ):
// FAILED_PRECONDITION "checkpoint <dir>: <field> <its value>, this job has <value>" naming the
// first field that differs among job_id (only when `job_id` is non-empty, compared with it),
// optimizer and model (every ModelConfig field).
absl::Status CheckManifestFits(const std::string& dir, const CheckpointManifest& m,
                               const CheckpointManifest& want, const std::string& job_id);

// Writes one rank's file into `temp_dir` (created if missing), fsyncs the file and the folder,
// and returns its entry (size and SHA-256 of the bytes written).
absl::StatusOr<CheckpointFileEntry> WriteCheckpointRankFile(const std::string& temp_dir, int rank,
                                                            const StFile& file);

// Rank 0, after every rank confirmed: writes manifest.json into `temp_dir` (temporary file,
// fsync, rename, folder fsync), renames `temp_dir` to root/step-N (moving a committed folder of
// the same step aside first, then removing it) and fsyncs `root`. Returns the SHA-256 of the
// manifest's bytes.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& root, const std::string& temp_dir,
                                             const CheckpointManifest& manifest);

// Where the data stream stands after the checkpoint, for a job with `dp` DP ranks and
// micro-batches of `micro_batch` samples: next_first_sample from the manifest (version 1:
// next_first_micro_batch of the writing layout x its dp x micro_batch), next_first_micro_batch
// the manifest's when dp is the writing layout's, else next_first_sample / (dp x micro_batch).
struct ResumePoint {
  int64_t next_window = 0;
  int64_t next_first_micro_batch = 0;
  int64_t next_first_sample = 0;
};
ResumePoint ResumePointFor(const CheckpointManifest& m, int dp, int micro_batch);

// Reads and parses step_dir's manifest (its SHA-256 checked when `expected_manifest_sha256` is
// non-empty) and checks that every file it lists exists with the listed size (DATA_LOSS naming
// the file otherwise), without reading the files.
absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(
    const std::string& step_dir, absl::string_view expected_manifest_sha256);

// Reads root/step-N's manifest and checks every file it lists (present, size, SHA-256).
// `expected_manifest_sha256` non-empty: the manifest's own SHA-256 must equal it.
absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& step_dir,
                                                    absl::string_view expected_manifest_sha256);

// One rank's file of a verified checkpoint.
absl::StatusOr<StFile> ReadCheckpointRankFile(const std::string& step_dir, int rank);

// The newest step under `root` whose checkpoint verifies (and, when `job_id` is non-empty,
// belongs to that job); nullopt when there is none. Partial folders are skipped.
absl::StatusOr<std::optional<int64_t>> NewestValidCheckpoint(const std::string& root,
                                                             const std::string& job_id);

// Keeps the `keep` newest committed checkpoints, never removing `protect_step` (-1: none), and
// removes temporary folders of earlier attempts. Call only after a commit.
absl::Status PruneCheckpoints(const std::string& root, int keep, int64_t protect_step);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_TRAIN_CHECKPOINT_H_
