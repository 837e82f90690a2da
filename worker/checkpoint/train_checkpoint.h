// Resumable training checkpoints on disk (docs/fault-tolerance.md): the per-rank files, the
// manifest, the commit protocol's file operations, verification, discovery and pruning.
// Torch-free and comm-free: the engine gathers the state and the ranks' confirmations; this
// file only reads and writes folders.
//
//   root/step-00000011/rank-00000.safetensors ... manifest.json     committed
//   root/step-00000011.<job uid>/...                                 committed, step-00000011 is
//                                                                    another job's
//   root/.step-00000015.<job uid>.a2.tmp/                            being written (attempt 2)
//
// A folder may be shared by several jobs (of one coordinator or of several, whose job ids may
// be the same): a checkpoint belongs to the job whose job id AND job uid (common/job_uid.h) its
// manifest names (CheckpointBelongsTo). A job discovers, resumes, replaces and prunes only its
// own checkpoints and temporary folders; a manifest without a job uid (written before uids, or
// by a writer that has none) is never replaced or pruned by a job that has one.
//
// Implemented in train_checkpoint.cc (format, commit, verification) and checkpoint_root.cc
// (names, ownership, discovery, pruning).
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
#include <utility>
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
  // The job's uid (IsJobUid); "" in manifests written before job uids (still read) and by a
  // writer without one. Written only when non-empty.
  std::string job_uid;
  int64_t step = 0;  // the state after this step
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
  std::string dir;              // the committed folder (step-N, or step-N.<job uid>)
  std::string manifest_sha256;  // hex
  int64_t bytes = 0;            // all files of the checkpoint
  double blocked_seconds = 0;   // training time it blocked on this rank
};

// Who a checkpoint belongs to: a job id and its uid. An empty field matches anything (a
// standalone --resume knows its job id, "standalone", but not yet its uid: it continues the
// newest standalone checkpoint's); pruning needs both (PruneCheckpoints).
struct CheckpointOwner {
  CheckpointOwner() = default;
  CheckpointOwner(std::string id, std::string uid = "")  // NOLINT: a job id alone converts
      : job_id(std::move(id)), job_uid(std::move(uid)) {}
  CheckpointOwner(const char* id) : job_id(id) {}  // NOLINT: as above, from a literal
  std::string job_id;
  std::string job_uid;
};

// THE ownership predicate (discovery, resume, pruning and the commit's replacement all ask
// it): `m`'s job_id equals owner.job_id (unless that is empty) and its job_uid equals
// owner.job_uid (unless that is empty). A manifest without a job uid never belongs to an owner
// with one.
bool CheckpointBelongsTo(const CheckpointManifest& m, const CheckpointOwner& owner);

// Folder names. The committed folder of step N is step-N when that name is free or already
// holds a checkpoint of the same job; when it holds another job's, step-N.<job uid>.
std::string CheckpointStepDirName(int64_t step);  // "step-00000011"
std::string CheckpointStepDirName(int64_t step,
                                  const std::string& job_uid);  // "step-00000011.<uid>"; "" plain
// ".step-00000011.<uid>.a2.tmp"; without a uid ".step-00000011.a2.tmp".
std::string CheckpointTempDirName(int64_t step, const std::string& job_uid, int64_t attempt);
std::string CheckpointRankFileName(int rank);  // "rank-00001.safetensors"

// A committed folder's name taken apart: step-N -> {N, ""}, step-N.<uid> -> {N, uid}; nullopt
// for any other name (temporary folders included).
struct CheckpointDirName {
  int64_t step = 0;
  std::string job_uid;  // the name's suffix; "" for step-N
};
std::optional<CheckpointDirName> ParseCheckpointDirName(const std::string& name);

// Whether a verified checkpoint's manifest `m` (read from `dir`) fits the job `want` describes,
// whatever layout wrote it (world_size, tp, dp, zero_stage and bf16 may all differ):
// FAILED_PRECONDITION "checkpoint <dir>: <field> <its value>, this job has <value>" naming the
// first field that differs among job_id (only when `job_id` is non-empty, compared with it),
// job_uid (only when both `job_uid` and the manifest's are non-empty: a manifest without one
// predates uids), optimizer and model (every ModelConfig field).
absl::Status CheckManifestFits(const std::string& dir, const CheckpointManifest& m,
                               const CheckpointManifest& want, const std::string& job_id,
                               const std::string& job_uid = "");

// Writes one rank's file into `temp_dir` (created if missing), fsyncs the file and the folder,
// and returns its entry (size and SHA-256 of the bytes written).
absl::StatusOr<CheckpointFileEntry> WriteCheckpointRankFile(const std::string& temp_dir, int rank,
                                                            const StFile& file);

// Rank 0, after every rank confirmed: writes manifest.json into `temp_dir` (temporary file,
// fsync, rename, folder fsync), renames `temp_dir` to the step's committed folder and fsyncs
// `root`. The folder is root/step-N when that is free or holds a checkpoint of the same job
// (the manifest's job_id and job_uid; a manifest without a uid is the same job only for a
// writer without one), which is moved aside first and then removed (an attempt the
// coordinator never heard from committed it); otherwise root/step-N.<job uid> (replaced the
// same way when it exists; the name is chosen again, once, when another job's commit takes
// step-N between the choice and the rename). FAILED_PRECONDITION naming step-N when it holds
// another job's checkpoint and the manifest has no job uid to name another folder by. A failure
// before the folder's rename (the manifest's write: a full disk) leaves `temp_dir` without a
// manifest, as it was.
struct CommittedCheckpoint {
  std::string dir;              // root/step-N or root/step-N.<job uid>
  std::string manifest_sha256;  // hex, of the manifest's bytes
};
absl::StatusOr<CommittedCheckpoint> CommitCheckpoint(const std::string& root,
                                                     const std::string& temp_dir,
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

// A committed checkpoint found under a root: its folder and manifest.
struct FoundCheckpoint {
  int64_t step = 0;
  std::string dir;
  CheckpointManifest manifest;
};

// The committed checkpoints under `root` that belong to `owner` (CheckpointBelongsTo; an empty
// owner: every one), newest step first (the same step: step-N before step-N.<uid>). A folder
// whose manifest cannot be read, or whose files are missing or of another size, is skipped
// (partial or damaged). A missing root lists nothing.
absl::StatusOr<std::vector<FoundCheckpoint>> ListCheckpoints(const std::string& root,
                                                             const CheckpointOwner& owner);

// The newest checkpoint under `root` that belongs to `owner` and verifies (every file's
// SHA-256); nullopt when there is none. Partial folders are skipped.
absl::StatusOr<std::optional<FoundCheckpoint>> NewestValidCheckpoint(const std::string& root,
                                                                     const CheckpointOwner& owner);

// The committed folder of `step` to resume (the coordinator's resume step): the step's folder
// whose manifest's SHA-256 is `manifest_sha256` when that is non-empty (it identifies the
// checkpoint exactly, a manifest without a job uid included), else the one that belongs to
// `owner`. NOT_FOUND naming root, step and owner when there is none.
absl::StatusOr<std::string> FindCheckpointDir(const std::string& root, int64_t step,
                                              const CheckpointOwner& owner,
                                              const std::string& manifest_sha256);

// Keeps the `keep` newest committed checkpoints of `owner` (both its job id and job uid must
// be set: an owner without them prunes nothing), never removing `protect_step` (-1: none),
// and removes the owner's own temporary folders (earlier attempts' saves, the aside folder of
// a replaced commit). Checkpoints and temporary folders of other jobs, and those without a job
// uid, are never touched. Call only after a commit (no save of the owner is in flight).
absl::Status PruneCheckpoints(const std::string& root, const CheckpointOwner& owner, int keep,
                              int64_t protect_step);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_TRAIN_CHECKPOINT_H_
