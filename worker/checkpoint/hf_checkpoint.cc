#include "worker/checkpoint/hf_checkpoint.h"

#include <climits>
#include <initializer_list>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_reader.h"
#include "common/spec_limits.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/files.h"
#include "worker/model/gpt_bigcode_params.h"

namespace latchkey {
namespace {

constexpr IntBounds kPositive{1, INT_MAX, "positive"};
constexpr DoubleRange kNonNegative{0.0, false, std::numeric_limits<double>::infinity(), true};

// `key` (or its first present alias) as a positive int.
absl::Status ReadSize(JsonObjectReader& r, std::initializer_list<const char*> keys, int* out) {
  return r.Int(r.FirstPresent(keys), out, kPositive);
}

// A string key that must be one of `allowed` when present.
absl::Status ReadOneOf(JsonObjectReader& r, const char* key,
                       std::initializer_list<const char*> allowed, const char* why) {
  const nlohmann::json* v = r.Get(key);
  if (v == nullptr) return absl::OkStatus();
  for (const char* a : allowed) {
    if (v->is_string() && v->get_ref<const std::string&>() == a) return absl::OkStatus();
  }
  return r.Error(key, absl::StrCat(DescribeJson(*v), " is not supported (", why, ")"));
}

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
  // HF GPTBigCodeConfig defaults for absent keys.
  ModelConfig c;
  c.vocab_size = 50257;
  c.n_positions = 1024;
  c.n_embd = 768;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_inner = 0;
  c.multi_query = true;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.1;
  c.layer_norm_epsilon = 1e-5;
  c.initializer_range = 0.02;
  c.scale_attn_weights = true;

  // Keys latchkey does not use (architectures, bos_token_id, ...) are ignored.
  JsonObjectReader r(obj, "", std::string(source));
  LK_RETURN_IF_ERROR(
      ReadOneOf(r, "model_type", {"gpt_bigcode"}, "latchkey reads GPTBigCode checkpoints only"));
  LK_RETURN_IF_ERROR(ReadOneOf(r, "activation_function", {"gelu_pytorch_tanh", "gelu_new"},
                               "latchkey implements the tanh GELU only"));
  LK_RETURN_IF_ERROR(ReadSize(r, {"vocab_size"}, &c.vocab_size));
  LK_RETURN_IF_ERROR(ReadSize(r, {"n_positions", "max_position_embeddings"}, &c.n_positions));
  LK_RETURN_IF_ERROR(ReadSize(r, {"n_embd", "hidden_size"}, &c.n_embd));
  LK_RETURN_IF_ERROR(ReadSize(r, {"n_layer", "num_hidden_layers"}, &c.n_layer));
  LK_RETURN_IF_ERROR(ReadSize(r, {"n_head", "num_attention_heads"}, &c.n_head));
  const nlohmann::json* inner = r.Get("n_inner");
  if (inner != nullptr && inner->is_null()) {
    c.n_inner = 0;
  } else {
    LK_RETURN_IF_ERROR(r.Int("n_inner", &c.n_inner, IntBounds{0, INT_MAX, ">= 0 or null"}));
  }
  LK_RETURN_IF_ERROR(r.Bool("multi_query", &c.multi_query));
  LK_RETURN_IF_ERROR(r.Double("resid_pdrop", &c.resid_pdrop, kNonNegative));
  LK_RETURN_IF_ERROR(r.Double("embd_pdrop", &c.embd_pdrop, kNonNegative));
  LK_RETURN_IF_ERROR(r.Double("attn_pdrop", &c.attn_pdrop, kNonNegative));
  LK_RETURN_IF_ERROR(r.Double("layer_norm_epsilon", &c.layer_norm_epsilon, kNonNegative));
  LK_RETURN_IF_ERROR(r.Double("initializer_range", &c.initializer_range, kNonNegative));
  LK_RETURN_IF_ERROR(r.Bool("scale_attn_weights", &c.scale_attn_weights));
  bool tie = true;
  LK_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &tie));
  if (!tie) {
    return r.Error("tie_word_embeddings",
                   "false is not supported (latchkey ties lm_head to transformer.wte)");
  }
  if (c.n_embd % c.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": n_embd ", c.n_embd, " is not divisible by n_head ", c.n_head));
  }
  return c;
}

std::string SerializeHfConfig(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["model_type"] = "gpt_bigcode";
  j["architectures"] = {"GPTBigCodeForCausalLM"};
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.n_positions;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_inner"] = c.n_inner > 0 ? nlohmann::ordered_json(c.n_inner) : nlohmann::ordered_json();
  j["activation_function"] = "gelu_pytorch_tanh";
  j["resid_pdrop"] = c.resid_pdrop;
  j["embd_pdrop"] = c.embd_pdrop;
  j["attn_pdrop"] = c.attn_pdrop;
  j["layer_norm_epsilon"] = c.layer_norm_epsilon;
  j["initializer_range"] = c.initializer_range;
  j["scale_attn_weights"] = c.scale_attn_weights;
  j["attention_softmax_in_fp32"] = true;
  j["scale_attention_softmax_in_fp32"] = true;
  j["multi_query"] = c.multi_query;
  j["tie_word_embeddings"] = true;
  j["bos_token_id"] = c.vocab_size - 1;
  j["eos_token_id"] = c.vocab_size - 1;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

absl::Status CheckConfigAgrees(const ModelConfig& spec_model, const ModelConfig& ckpt,
                               const std::string& field) {
  std::vector<std::string> diffs;
  auto check = [&](const char* key, auto spec_value, auto ckpt_value) {
    if (spec_value != ckpt_value) {
      diffs.push_back(absl::StrCat("checkpoint ", key, " ", ckpt_value, " disagrees with model.",
                                   key, " ", spec_value));
    }
  };
  check("n_layer", spec_model.n_layer, ckpt.n_layer);
  check("n_embd", spec_model.n_embd, ckpt.n_embd);
  check("n_head", spec_model.n_head, ckpt.n_head);
  check("n_inner", spec_model.inner(), ckpt.inner());
  check("vocab_size", spec_model.vocab_size, ckpt.vocab_size);
  check("n_positions", spec_model.n_positions, ckpt.n_positions);
  check("multi_query", spec_model.multi_query ? "true" : "false",
        ckpt.multi_query ? "true" : "false");
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
