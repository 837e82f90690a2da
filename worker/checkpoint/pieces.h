// The pieces of a latchkey-checkpoint/2 (logical_layout.h, docs/fault-tolerance.md): writing a
// rank's share of the logical tensors as pieces, building the manifest's tensor list from every
// rank's piece digests (replicas must agree), and reading any rectangle of a logical tensor back
// by byte range. Version 1 checkpoints are read through the same reader: their per-rank flat
// buffers are described as pieces of the writing layout's table. Torch-free: the CLI's
// inspect / export / convert use it as the worker's load does.
//
// Thread-safety: a PieceReader is used by one thread; the free functions are reentrant.
// Errors: DATA_LOSS naming the file (a short read, a SHA-256 that differs, a tensor missing
// from a file, a checkpoint that does not cover what is asked), INTERNAL for OS errors.
#ifndef LATCHKEY_WORKER_CHECKPOINT_PIECES_H_
#define LATCHKEY_WORKER_CHECKPOINT_PIECES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/logical_layout.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey {

// The layout a manifest was written by.
LayoutSpec LayoutOfManifest(const CheckpointManifest& m);

// The SHA-256 (hex) of every region `rank` holds, in table.held_by(rank) order (the writer's
// digest is its piece's); `values[k]` holds the values of
// table.HeldRange(rank, table.kinds()[k]) (from its begin).
std::vector<std::string> ShareDigests(const LayoutTable& table, int rank,
                                      const std::vector<const float*>& values);

// Writes `rank`'s file (the regions it is the writer of, as F32 pieces named PieceKey; values as
// for ShareDigests) into `temp_dir` through WriteCheckpointRankFile.
absl::StatusOr<CheckpointFileEntry> WriteShare(const LayoutTable& table,
                                               const std::string& temp_dir, int rank, int64_t step,
                                               const std::vector<const float*>& values);

// The manifest's tensor list from every rank's digests (index = rank). DATA_LOSS "replicas of
// <kind>/<param> rows [a, b) cols [c, d) disagree: rank(s) X hold <sha>, rank(s) Y hold <sha>"
// when holders of one region differ.
absl::StatusOr<std::vector<CheckpointTensor>> TensorsFromDigests(
    const LayoutTable& table, const std::vector<std::vector<std::string>>& digests, int64_t step);

// Reads rectangles of a checkpoint's logical tensors by byte range (pread).
class PieceReader {
 public:
  // `m` as ReadCheckpointManifest / VerifyCheckpoint returned it for `dir`. Version 1: its
  // pieces are derived from the writing layout, and `verify_v1_files` hashes every rank file
  // first (version 1 has no piece digests). INVALID_ARGUMENT when the writing layout is not one
  // the model permits.
  static absl::StatusOr<std::unique_ptr<PieceReader>> Open(const std::string& dir,
                                                           CheckpointManifest m,
                                                           bool verify_v1_files = true);
  ~PieceReader();

  const CheckpointManifest& manifest() const { return m_; }
  // Steps the optimizer took (version 1: from rank 0's file's metadata).
  int64_t optimizer_step() const { return optimizer_step_; }

  // Fills the flat range [begin, end) of TP rank `tp_rank`'s local buffer in `target` with the
  // values of logical tensor `kind` (dst[i] = element begin + i). DATA_LOSS when a piece does
  // not verify or the checkpoint does not cover the range.
  absl::Status FillFlat(const LayoutTable& target, int tp_rank, TensorKind kind, int64_t begin,
                        int64_t end, float* dst);

  // Reads every piece of every tensor and checks its SHA-256 (inspect).
  absl::Status VerifyAllPieces();

 private:
  PieceReader() = default;
  struct Entry;
  struct File;
  absl::StatusOr<const std::vector<float>*> Piece(const CheckpointPiece& p);
  absl::StatusOr<File*> OpenFile(const std::string& name);

  std::string dir_;
  CheckpointManifest m_;
  int64_t optimizer_step_ = 0;
  std::map<std::string, const CheckpointTensor*> by_name_;  // "kind/param"
  std::map<std::string, std::unique_ptr<File>> files_;
  // The last piece read (consecutive rectangles of one block come from the same piece).
  std::string cached_id_;
  std::vector<float> cached_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_PIECES_H_
