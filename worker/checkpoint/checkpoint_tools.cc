#include "worker/checkpoint/checkpoint_tools.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_config.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/hf_checkpoint.h"
#include "worker/checkpoint/logical_layout.h"
#include "worker/checkpoint/pieces.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey {
namespace {

std::string Shape(const std::vector<int64_t>& s) { return "[" + absl::StrJoin(s, ", ") + "]"; }

// A verified checkpoint and a reader over it (every file hashed: tools read everything).
struct Opened {
  CheckpointManifest manifest;
  std::unique_ptr<PieceReader> reader;
};

absl::StatusOr<Opened> Open(const std::string& step_dir) {
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(step_dir, "");
  if (!m.ok()) return m.status();
  absl::StatusOr<std::unique_ptr<PieceReader>> reader =
      PieceReader::Open(step_dir, *m, /*verify_v1_files=*/false);
  if (!reader.ok()) return reader.status();
  return Opened{*std::move(m), *std::move(reader)};
}

}  // namespace

absl::StatusOr<std::string> InspectCheckpoint(const std::string& step_dir) {
  absl::StatusOr<Opened> o = Open(step_dir);
  if (!o.ok()) return o.status();
  if (absl::Status st = o->reader->VerifyAllPieces(); !st.ok()) return st;
  const CheckpointManifest& m = o->manifest;
  const CheckpointManifest& logical = o->reader->manifest();  // version 1: pieces derived
  std::string out = absl::StrCat(
      "checkpoint ", step_dir, "\n", "format ",
      m.version >= 2 ? kTrainCheckpointFormat : kTrainCheckpointFormatV1, "\n", "job ", m.job_id,
      m.job_uid.empty() ? std::string() : absl::StrCat("  job_uid ", m.job_uid), "  step ", m.step,
      "  attempt ", m.attempt, "  latch_generation ", m.latch_generation, "\n", "next_window ",
      m.next_window, "  next_first_micro_batch ", m.next_first_micro_batch, "  next_first_sample ",
      m.next_first_sample, "  seed ", m.seed, "\n", "layout world ", m.world_size, " = tp ", m.tp,
      " x dp ", m.dp, "  zero_stage ", m.zero_stage, "  bf16 ", m.bf16 ? "true" : "false",
      "  optimizer ", m.optimizer, " (step ", o->reader->optimizer_step(), ")\n", "model ",
      ModelConfigToJson(m.model, ModelJsonFormat::kManifest).dump(), "\n");
  int64_t pieces = 0, elements = 0;
  std::string lines;
  for (const CheckpointTensor& t : logical.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    pieces += static_cast<int64_t>(t.pieces.size());
    elements += n;
    absl::StrAppend(&lines, "  ", t.kind, "/", t.param, " F32 ", Shape(t.shape), " ", n * 4,
                    " bytes, ", t.pieces.size(), " piece(s)\n");
  }
  absl::StrAppend(&out, "tensors ", logical.tensors.size(), " (", pieces, " pieces, ", elements * 4,
                  " bytes)\n", lines);
  int64_t bytes = 0;
  std::string files;
  for (const CheckpointFileEntry& f : m.files) {
    bytes += f.bytes;
    absl::StrAppend(&files, "  ", f.name, " ", f.bytes, " bytes sha256 ", f.sha256, "\n");
  }
  absl::StrAppend(&out, "files ", m.files.size(), " (", bytes, " bytes)\n", files,
                  "verified: every file's size and SHA-256",
                  m.version >= 2 ? " and every piece's SHA-256" : "", " match the manifest\n");
  return out;
}

absl::Status ExportCheckpointToHf(const std::string& step_dir, const std::string& out_dir) {
  absl::StatusOr<Opened> o = Open(step_dir);
  if (!o.ok()) return o.status();
  // The whole model on one rank: TP 1, DP 1, every parameter one contiguous block.
  absl::StatusOr<LayoutTable> one =
      LayoutTable::Build(LayoutSpec{o->manifest.model, 1, 1, 0, false, false});
  if (!one.ok()) return one.status();
  std::vector<float> flat(one->numel());
  if (absl::Status st =
          o->reader->FillFlat(*one, 0, TensorKind::kParam, 0, one->numel(), flat.data());
      !st.ok()) {
    return st;
  }
  StFile file;
  int64_t offset = 0;
  for (int i = 0; i < one->num_params(); ++i) {
    int64_t n = 1;
    for (int64_t d : one->global_shape(i)) n *= d;
    StTensor t{one->param_name(i), StDtype::kF32, one->global_shape(i),
               std::string(reinterpret_cast<const char*>(flat.data() + offset), n * 4)};
    file.tensors.push_back(std::move(t));
    offset += n;
  }
  return WriteHfCheckpoint(out_dir, o->manifest.model, std::move(file));
}

absl::StatusOr<std::string> ConvertCheckpoint(const std::string& src_step_dir,
                                              const std::string& dst_root) {
  absl::StatusOr<Opened> o = Open(src_step_dir);
  if (!o.ok()) return o.status();
  const CheckpointManifest& src = o->manifest;
  if (src.version >= 2) {
    return absl::FailedPreconditionError(
        absl::StrCat(src_step_dir, ": already ", kTrainCheckpointFormat));
  }
  absl::StatusOr<LayoutTable> table = LayoutTable::Build(LayoutOfManifest(src));
  if (!table.ok()) return table.status();
  if (absl::Status st = CreateDirectories(dst_root); !st.ok()) return st;
  const std::string temp =
      JoinPath(dst_root, CheckpointTempDirName(src.step, src.job_uid, src.attempt));
  CheckpointManifest dst = src;
  dst.version = 2;
  dst.files.clear();
  dst.optimizer_step = o->reader->optimizer_step();
  dst.next_first_sample = -1;
  dst.seed = 0;
  std::vector<std::vector<std::string>> digests;
  for (int rank = 0; rank < src.world_size; ++rank) {
    // This rank's held values, from whichever rank files hold them.
    std::vector<std::vector<float>> values;
    std::vector<const float*> ptrs;
    for (TensorKind kind : table->kinds()) {
      const auto [begin, end] = table->HeldRange(rank, kind);
      values.emplace_back(end - begin);
      if (absl::Status st =
              o->reader->FillFlat(*table, rank % src.tp, kind, begin, end, values.back().data());
          !st.ok()) {
        return st;
      }
    }
    for (const std::vector<float>& v : values) ptrs.push_back(v.data());
    digests.push_back(ShareDigests(*table, rank, ptrs));
    absl::StatusOr<CheckpointFileEntry> e = WriteShare(*table, temp, rank, src.step, ptrs);
    if (!e.ok()) return e.status();
    dst.files.push_back(*e);
  }
  absl::StatusOr<std::vector<CheckpointTensor>> tensors =
      TensorsFromDigests(*table, digests, src.step);
  if (!tensors.ok()) return tensors.status();
  dst.tensors = *std::move(tensors);
  absl::StatusOr<CommittedCheckpoint> done = CommitCheckpoint(dst_root, temp, dst);
  if (!done.ok()) return done.status();
  return done->dir;
}

}  // namespace latchkey
