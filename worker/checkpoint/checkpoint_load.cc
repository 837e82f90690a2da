// Loading a resumable training checkpoint into a TrainingState of any layout: this rank's
// rectangles of every logical tensor are read from the pieces that meet them (pieces.h), then
// replace the parameters, the master and the optimizer state together.
#include <ATen/ATen.h>

#include <map>
#include <vector>

#include "common/status_macros.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/logical_layout.h"
#include "worker/checkpoint/pieces.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/process_groups.h"
#include "worker/model/param_store.h"
#include "worker/train/flat_ops.h"
#include "worker/train/optimizer.h"

namespace latchkey {
namespace {

// What this job's manifest would say about the fields a checkpoint must share with it.
CheckpointManifest Wanted(const TrainingState& s) {
  CheckpointManifest m;
  m.world_size = s.groups->world_size;
  m.tp = s.groups->tp;
  m.dp = s.groups->dp;
  m.zero_stage = s.spec->zero_stage;
  m.bf16 = s.spec->bf16;
  m.optimizer = s.spec->optimizer.type == OptimizerType::kSgd ? "SGD" : "AdamW";
  m.model = s.spec->model;
  return m;
}

}  // namespace

absl::Status LoadTrainingCheckpoint(TrainingState& state, const std::string& step_dir,
                                    const std::string& expected_job_id,
                                    const std::string& manifest_sha256,
                                    const std::string& expected_job_uid) {
  const comm::ProcessGroups& g = *state.groups;
  ParamStore& store = *state.params;
  const FlatOps& ops = *state.ops;
  if (g.recorder) g.recorder->SetPhase(RankPhase::kCheckpoint);
  LK_ASSIGN_OR_RETURN(CheckpointManifest m, ReadCheckpointManifest(step_dir, manifest_sha256));
  LK_RETURN_IF_ERROR(
      CheckManifestFits(step_dir, m, Wanted(state), expected_job_id, expected_job_uid));
  const ResumePoint point = ResumePointFor(m, g.dp, state.spec->micro_batch_size);
  LK_ASSIGN_OR_RETURN(std::unique_ptr<PieceReader> reader,
                      PieceReader::Open(step_dir, std::move(m)));
  LK_ASSIGN_OR_RETURN(const LayoutTable table,
                      LayoutTable::Build(LayoutSpec{
                          state.spec->model, g.tp, g.dp, state.spec->zero_stage, state.bf16(),
                          state.spec->optimizer.type == OptimizerType::kAdamW}));
  // Read and check everything before anything is replaced. The weights over the whole local
  // buffer (bf16: the compute copy is their rounding everywhere, the master this partition).
  const int64_t n = store.numel();
  std::vector<float> params(n);
  LK_RETURN_IF_ERROR(reader->FillFlat(table, g.tp_rank, TensorKind::kParam, 0, n, params.data()));
  // The optimizer state over this rank's partition; the ZeRO padding past numel stays zero.
  const int64_t chunk = state.part_numel();
  std::map<std::string, at::Tensor> opt;
  for (TensorKind kind : table.kinds()) {
    if (kind == TensorKind::kParam) continue;
    const auto [begin, end] = table.HeldRange(g.rank, kind);
    at::Tensor t = at::zeros({chunk}, at::kFloat);
    LK_RETURN_IF_ERROR(reader->FillFlat(table, g.tp_rank, kind, begin, end, t.data_ptr<float>()));
    opt[TensorKindName(kind)] = t;
  }
  if (absl::Status st = state.optimizer->LoadState(reader->optimizer_step(), opt); !st.ok()) {
    return absl::DataLossError(step_dir + ": " + std::string(st.message()));
  }
  state.position = {reader->manifest().step, reader->manifest().latch_generation,
                    point.next_first_micro_batch, point.next_first_sample};
  const c10::Device device = store.device();
  const at::Tensor host = at::from_blob(params.data(), {n}, at::kFloat);
  if (!state.bf16()) {
    ops.Copy(store.flat_params().narrow(0, 0, n), host.to(device));
    return absl::OkStatus();
  }
  const int64_t begin = std::min(state.part_begin, n);
  const int64_t end = std::min(state.part_end, n);
  at::Tensor master = at::zeros({chunk}, at::kFloat);
  master.narrow(0, 0, end - begin).copy_(host.narrow(0, begin, end - begin));
  ops.Copy(state.master, master.to(device));
  // The compute copy: the bf16 rounding of the master, exactly as the optimizer step makes it.
  ops.Copy(store.flat_compute().narrow(0, 0, n), host.to(device));
  return absl::OkStatus();
}

}  // namespace latchkey
