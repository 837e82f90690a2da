// The weights of a TrainingState in and out as safetensors: the HF export (the TP shards
// gathered onto rank 0), the HF import of latchkey.init_from, and the gradient dump.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "common/status_macros.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/hf_checkpoint.h"
#include "worker/checkpoint/tensor_bytes.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/process_groups.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/param_store.h"
#include "worker/model/tp_layout.h"

namespace latchkey {

absl::Status SaveHfCheckpoint(const TrainingState& state, const std::string& dir) {
  const comm::ProcessGroups& g = *state.groups;
  ParamStore& store = *state.params;
  const int64_t n = store.numel();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(store.device());
  at::Tensor local;
  if (!state.bf16()) {
    local = store.flat_params().narrow(0, 0, n);
  } else if (state.zero1) {
    // Reassemble the fp32 master from the DP partitions.
    at::Tensor full = at::empty({store.padded_numel()}, f32);
    LK_RETURN_IF_ERROR(g.dp_group->AllGather(CommBuffer(state.master), CommBuffer(full)));
    local = full.narrow(0, 0, n);
  } else {
    local = state.master.narrow(0, 0, n);
  }
  at::Tensor gathered = at::empty({g.tp * n}, f32);
  LK_RETURN_IF_ERROR(g.tp_group->AllGather(CommBuffer(local), CommBuffer(gathered)));
  if (g.rank != 0) return absl::OkStatus();
  gathered = gathered.cpu();
  std::vector<std::vector<ParamLayout>> layouts;
  std::vector<at::Tensor> flats;
  for (int r = 0; r < g.tp; ++r) {
    layouts.push_back(*BuildTpLayout(state.spec->model, g.tp, r));
    flats.push_back(gathered.narrow(0, r * n, n));
  }
  StFile file;
  for (const auto& [name, t] : AssembleFull(layouts, flats)) {
    file.tensors.push_back(ToStTensor(name, t));
  }
  return WriteHfCheckpoint(dir, state.spec->model, std::move(file));
}

absl::Status LoadInitFrom(const JobSpec& spec, int tp_rank, ParamStore& store) {
  std::map<std::string, at::Tensor> full;
  {
    auto ckpt = ReadHfCheckpoint(spec.init_from);
    if (!ckpt.ok()) {
      return absl::Status(ckpt.status().code(),
                          "latchkey.init_from: " + std::string(ckpt.status().message()));
    }
    LK_RETURN_IF_ERROR(CheckConfigAgrees(spec.model, ckpt->config, "latchkey.init_from"));
    for (const StTensor& t : ckpt->weights.tensors) {
      if (t.name == "lm_head.weight") continue;  // tied to wte
      auto tensor = ToFloatTensor(t);
      if (!tensor.ok()) return tensor.status();
      full[t.name] = *tensor;
    }
  }  // the file's bytes go before the shard is copied out
  if (absl::Status st = store.LoadFromFull(full, tp_rank); !st.ok()) {
    return absl::InvalidArgumentError("latchkey.init_from: " + std::string(st.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteGradDump(const TrainingState& state, const std::string& dir) {
  const comm::ProcessGroups& g = *state.groups;
  ParamStore& store = *state.params;
  at::Tensor grads = store.flat_grads();
  if (state.grads_part.defined()) {
    // ZeRO-2: only the partition exists; gather every rank's into a full copy.
    grads = at::empty({store.padded_numel()}, state.grads_part.options());
    LK_RETURN_IF_ERROR(g.dp_group->AllGather(CommBuffer(state.grads_part), CommBuffer(grads)));
  } else if (state.zero1) {
    // Only this rank's partition holds the reduced gradient; the in-place reduce-scatter used
    // the rest of the buffer as scratch. Gather every rank's partition into a copy.
    at::Tensor full = at::empty_like(grads);
    const at::Tensor part = grads.narrow(0, state.part_begin, state.part_numel());
    LK_RETURN_IF_ERROR(g.dp_group->AllGather(CommBuffer(part), CommBuffer(full)));
    grads = full;
  }
  grads = grads.cpu();
  StFile file;
  const auto& layout = store.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    const at::Tensor t =
        grads.narrow(0, store.offset(i), layout[i].local_numel()).view(layout[i].local_shape);
    file.tensors.push_back(ToStTensor(layout[i].name, t));
  }
  std::sort(file.tensors.begin(), file.tensors.end(),
            [](const StTensor& a, const StTensor& b) { return a.name < b.name; });
  std::filesystem::create_directories(dir);
  return WriteSafetensorsFile(dir + "/grads-rank" + std::to_string(g.rank) + ".safetensors", file);
}

}  // namespace latchkey
