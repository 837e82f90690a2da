#include "worker/checkpoint/hf_checkpoint.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_reader.h"
#include "common/model_config.h"
#include "common/spec_limits.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/files.h"
#include "worker/model/gpt_bigcode_params.h"

namespace latchkey {
namespace {

// name -> shape of every GPTBigCodeForCausalLM tensor, lm_head included.
std::map<std::string, std::vector<int64_t>> ExpectedShapes(const ModelConfig& c) {
  std::map<std::string, std::vector<int64_t>> m;
  for (GptBigCodeParam& p : GptBigCodeParams(c)) m[std::move(p.name)] = std::move(p.shape);
  m[kTiedLmHeadName] = {c.vocab_size, c.n_embd};
  return m;
}

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text, absl::string_view source) {
  LK_ASSIGN_OR_RETURN(const nlohmann::json obj, ParseJsonObject(json_text, source));
  return ModelConfigFromJson(obj, ModelJsonFormat::kHfConfig, source);
}

std::string SerializeHfConfig(const ModelConfig& c) {
  return ModelConfigToJson(c, ModelJsonFormat::kHfConfig).dump(2) + "\n";
}

absl::Status CheckConfigAgrees(const ModelConfig& spec_model, const ModelConfig& ckpt,
                               const std::string& field) {
  std::vector<std::string> diffs;
  for (const ModelFieldDiff& d : DiffModelConfigs(spec_model, ckpt, ModelFields::kShape)) {
    diffs.push_back(
        absl::StrCat("checkpoint ", d.key, " ", d.b, " disagrees with model.", d.key, " ", d.a));
  }
  if (diffs.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", absl::StrJoin(diffs, "; ")));
}

absl::Status CheckWeightsMatchConfig(const ModelConfig& config, const StFile& weights,
                                     absl::string_view source) {
  if (config.n_head <= 0 || config.n_embd <= 0 || config.n_embd % config.n_head != 0 ||
      config.n_layer <= 0 || config.vocab_size <= 0 || config.n_positions <= 0 ||
      config.n_inner < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": invalid model config (n_layer ", config.n_layer, ", n_embd ", config.n_embd,
        ", n_head ", config.n_head, ", n_inner ", config.n_inner, ", vocab_size ",
        config.vocab_size, ", n_positions ", config.n_positions, ")"));
  }
  const std::map<std::string, std::vector<int64_t>> expected = ExpectedShapes(config);
  size_t found = 0;
  for (const StTensor& t : weights.tensors) {
    auto it = expected.find(t.name);
    if (it == expected.end()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unexpected tensor '", t.name,
                                                     "' for a GPTBigCode model with n_layer ",
                                                     config.n_layer));
    }
    if (t.shape != it->second) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", t.name, "' has shape ",
                                                     Shape(t.shape), ", config.json implies ",
                                                     Shape(it->second)));
    }
    if (t.dtype != StDtype::kF32 && t.dtype != StDtype::kF64 && t.dtype != StDtype::kF16 &&
        t.dtype != StDtype::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", t.name, "' has dtype ",
                                                     StDtypeName(t.dtype),
                                                     ", expected a floating dtype"));
    }
    if (t.name != kTiedLmHeadName) ++found;
  }
  if (found != expected.size() - 1) {
    for (const auto& [name, shape] : expected) {
      if (name != kTiedLmHeadName && weights.Find(name) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": missing tensor '", name, "' ", Shape(shape)));
      }
    }
    // Only reachable with duplicate names in `weights`.
    return absl::InvalidArgumentError(absl::StrCat(source, ": duplicate tensor names"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HfCheckpoint> ReadHfCheckpoint(const std::string& dir) {
  LK_RETURN_IF_ERROR(CheckPathUnderEnvRoots("checkpoint directory", dir));
  LK_ASSIGN_OR_RETURN(const PathKind kind, GetPathKind(dir));
  if (kind == PathKind::kMissing) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory ", dir, ": No such file or directory"));
  }
  if (kind != PathKind::kDirectory) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", dir,
                     " is not a directory (expected an HF checkpoint folder "
                     "with config.json and model.safetensors)"));
  }
  const std::string config_path = JoinPath(dir, kHfConfigFileName);
  const std::string weights_path = JoinPath(dir, kHfWeightsFileName);
  if (!IsRegularFile(config_path)) {
    return absl::NotFoundError(absl::StrCat(config_path, ": missing (not an HF checkpoint?)"));
  }
  if (!IsRegularFile(weights_path)) {
    if (IsRegularFile(JoinPath(dir, "model.safetensors.index.json"))) {
      return absl::UnimplementedError(
          absl::StrCat(weights_path,
                       ": missing; sharded checkpoints (model.safetensors.index.json) are not "
                       "supported, save as one file"));
    }
    if (IsRegularFile(JoinPath(dir, "pytorch_model.bin"))) {
      return absl::UnimplementedError(
          absl::StrCat(weights_path,
                       ": missing; only safetensors weights are supported, not "
                       "pytorch_model.bin (save with safe_serialization=True)"));
    }
    return absl::NotFoundError(absl::StrCat(weights_path, ": missing"));
  }
  LK_ASSIGN_OR_RETURN(const std::string config_text, ReadWholeFile(config_path));
  HfCheckpoint out;
  LK_ASSIGN_OR_RETURN(out.config, ParseHfConfig(config_text, config_path));
  LK_ASSIGN_OR_RETURN(out.weights, ReadSafetensorsFile(weights_path));
  LK_RETURN_IF_ERROR(CheckWeightsMatchConfig(out.config, out.weights, weights_path));
  return out;
}

absl::Status WriteHfCheckpoint(const std::string& dir, const ModelConfig& config, StFile weights) {
  LK_RETURN_IF_ERROR(CheckWeightsMatchConfig(config, weights, dir));
  absl::Status valid = ValidateStFile(weights);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", valid.message()));

  LK_RETURN_IF_ERROR(CreateDirectories(dir));
  // Weights first, then config.json: a complete config.json means the weights beside it are
  // complete too.
  weights.metadata["format"] = "pt";
  LK_RETURN_IF_ERROR(WriteSafetensorsFile(JoinPath(dir, kHfWeightsFileName), weights));
  return WriteFileAtomically(JoinPath(dir, kHfConfigFileName), SerializeHfConfig(config));
}

}  // namespace latchkey
