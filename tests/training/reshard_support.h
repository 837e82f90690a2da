// Shared pieces of the resharding tests (reshard_test.cc, reshard_refusal_test.cc): the job of
// the reshard matrix at a layout, deviations between JSONL numbers, and a checkpoint's logical
// tensors as bytes (read through the torch-free piece reader, whatever layout wrote it).
#ifndef LATCHKEY_TESTS_TRAINING_RESHARD_SUPPORT_H_
#define LATCHKEY_TESTS_TRAINING_RESHARD_SUPPORT_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/specs.h"
#include "worker/checkpoint/logical_layout.h"
#include "worker/checkpoint/pieces.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey::testing {

struct MatrixLayout {
  int tp = 2;
  int dp = 2;
  int zero = 1;
  bool bf16 = false;
  double dropout = 0.0;
  int gas = 2;  // at DP 2; DP' runs GAS * 2 / DP'
};

// AdamW with clipping, 6 steps, a checkpoint every 3 steps into "ckpt" beside the spec.
inline nlohmann::json MatrixSpec(const MatrixLayout& l) {
  SpecParams p;  // synthetic data
  p.tp = l.tp;
  p.world_size = l.tp * l.dp;
  p.gas = l.gas;
  p.clip = 0.5;
  p.steps = 6;
  p.seed = 7;
  p.zero_stage = l.zero;
  p.optimizer = "AdamW";
  p.lr = 0.001;
  p.model["resid_pdrop"] = l.dropout;
  p.model["attn_pdrop"] = l.dropout;
  p.model["embd_pdrop"] = l.dropout;
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", 3}, {"keep", 3}}}};
  nlohmann::json spec = SpecObject(p);
  if (l.bf16) spec["bf16"] = {{"enabled", true}};
  return spec;
}

inline double RelativeDeviation(const nlohmann::json& got, const nlohmann::json& want) {
  const double g = got.get<double>(), w = want.get<double>();
  return std::abs(g - w) / std::max(std::abs(w), 1e-12);
}

// Every logical tensor of the checkpoint in `step_dir` ("param/<name>", "exp_avg/<name>", ...)
// as the bytes of its whole global tensor.
inline std::map<std::string, std::string> LogicalTensors(const std::string& step_dir) {
  std::map<std::string, std::string> out;
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(step_dir, "");
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return out;
  const bool adamw = m->optimizer == "AdamW";
  absl::StatusOr<std::unique_ptr<PieceReader>> reader = PieceReader::Open(step_dir, *m, false);
  EXPECT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<LayoutTable> one = LayoutTable::Build(LayoutSpec{m->model, 1, 1, 0, false, adamw});
  if (!reader.ok() || !one.ok()) return out;
  for (TensorKind kind : one->kinds()) {
    std::vector<float> flat(one->numel());
    absl::Status st = (*reader)->FillFlat(*one, 0, kind, 0, one->numel(), flat.data());
    EXPECT_TRUE(st.ok()) << st;
    int64_t offset = 0;
    for (int i = 0; i < one->num_params(); ++i) {
      int64_t n = 1;
      for (int64_t d : one->global_shape(i)) n *= d;
      out[std::string(TensorKindName(kind)) + "/" + one->param_name(i)] =
          std::string(reinterpret_cast<const char*>(flat.data() + offset), n * sizeof(float));
      offset += n;
    }
  }
  return out;
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_TRAINING_RESHARD_SUPPORT_H_
