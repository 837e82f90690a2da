#include "worker/checkpoint/hf_checkpoint.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using json = nlohmann::json;

// Reads HF config keys from a parsed object; remembers the first error.
class ConfigReader {
 public:
  ConfigReader(const json& obj, absl::string_view source) : obj_(obj), source_(source) {}

  // The value under `key` or its first present alias; nullptr when none is present.
  const json* Find(const char* key, std::initializer_list<const char*> aliases = {}) {
    if (obj_.contains(key)) {
      name_ = key;
      return &obj_[key];
    }
    for (const char* a : aliases) {
      if (obj_.contains(a)) {
        name_ = a;
        return &obj_[a];
      }
    }
    return nullptr;
  }

  // A positive int (or, when allow_null_zero, null/0 -> 0).
  void Int(const char* key, int* out, std::initializer_list<const char*> aliases = {},
           bool allow_null_zero = false) {
    const json* v = Find(key, aliases);
    if (v == nullptr) return;
    if (allow_null_zero && v->is_null()) {
      *out = 0;
      return;
    }
    if (!v->is_number_integer()) return Fail(absl::StrCat("must be an integer, got ", v->dump()));
    int64_t x = v->get<int64_t>();
    int64_t min = allow_null_zero ? 0 : 1;
    if (x < min || x > INT_MAX) {
      return Fail(
          absl::StrCat("must be ", allow_null_zero ? ">= 0 or null" : "positive", ", got ", x));
    }
    *out = static_cast<int>(x);
  }
  void Bool(const char* key, bool* out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) return Fail(absl::StrCat("must be true or false, got ", v->dump()));
    *out = v->get<bool>();
  }
  void Double(const char* key, double* out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_number()) return Fail(absl::StrCat("must be a number, got ", v->dump()));
    *out = v->get<double>();
    if (*out < 0) Fail(absl::StrCat("must be >= 0, got ", v->dump()));
  }
  // A string key that must be one of `allowed` when present.
  void OneOf(const char* key, std::initializer_list<const char*> allowed, const char* why) {
    const json* v = Find(key);
    if (v == nullptr) return;
    for (const char* a : allowed) {
      if (v->is_string() && v->get_ref<const std::string&>() == a) return;
    }
    Fail(absl::StrCat(v->dump(), " is not supported (", why, ")"));
  }
  void Fail(absl::string_view what) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(absl::StrCat(source_, ": ", name_, ": ", what));
    }
  }
  const absl::Status& status() const { return status_; }

 private:
  const json& obj_;
  absl::string_view source_;
  std::string name_;
  absl::Status status_;
};

std::string JoinPath(const std::string& dir, const char* name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// name -> shape of every GPTBigCodeForCausalLM tensor (lm_head excluded).
std::map<std::string, std::vector<int64_t>> ExpectedShapes(const ModelConfig& c) {
  const int64_t e = c.n_embd;
  const int64_t kv = c.multi_query ? c.head_dim() : c.n_embd;
  const int64_t inner = c.inner();
  std::map<std::string, std::vector<int64_t>> m;
  m["transformer.wte.weight"] = {c.vocab_size, e};
  m["transformer.wpe.weight"] = {c.n_positions, e};
  m["transformer.ln_f.weight"] = {e};
  m["transformer.ln_f.bias"] = {e};
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = absl::StrCat("transformer.h.", i, ".");
    m[p + "ln_1.weight"] = {e};
    m[p + "ln_1.bias"] = {e};
    m[p + "attn.c_attn.weight"] = {e + 2 * kv, e};
    m[p + "attn.c_attn.bias"] = {e + 2 * kv};
    m[p + "attn.c_proj.weight"] = {e, e};
    m[p + "attn.c_proj.bias"] = {e};
    m[p + "ln_2.weight"] = {e};
    m[p + "ln_2.bias"] = {e};
    m[p + "mlp.c_fc.weight"] = {inner, e};
    m[p + "mlp.c_fc.bias"] = {inner};
    m[p + "mlp.c_proj.weight"] = {e, inner};
    m[p + "mlp.c_proj.bias"] = {e};
  }
  return m;
}

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text, absl::string_view source) {
  json obj;
  try {
    obj = json::parse(json_text.begin(), json_text.end());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!obj.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a JSON object but ", obj.type_name()));
  }
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

  ConfigReader r(obj, source);
  r.OneOf("model_type", {"gpt_bigcode"}, "latchkey reads GPTBigCode checkpoints only");
  r.OneOf("activation_function", {"gelu_pytorch_tanh", "gelu_new"},
          "latchkey implements the tanh GELU only");
  r.Int("vocab_size", &c.vocab_size);
  r.Int("n_positions", &c.n_positions, {"max_position_embeddings"});
  r.Int("n_embd", &c.n_embd, {"hidden_size"});
  r.Int("n_layer", &c.n_layer, {"num_hidden_layers"});
  r.Int("n_head", &c.n_head, {"num_attention_heads"});
  r.Int("n_inner", &c.n_inner, {}, /*allow_null_zero=*/true);
  r.Bool("multi_query", &c.multi_query);
  r.Double("resid_pdrop", &c.resid_pdrop);
  r.Double("embd_pdrop", &c.embd_pdrop);
  r.Double("attn_pdrop", &c.attn_pdrop);
  r.Double("layer_norm_epsilon", &c.layer_norm_epsilon);
  r.Double("initializer_range", &c.initializer_range);
  r.Bool("scale_attn_weights", &c.scale_attn_weights);
  bool tie = true;
  r.Bool("tie_word_embeddings", &tie);
  if (!tie) r.Fail("false is not supported (latchkey ties lm_head to transformer.wte)");
  if (!r.status().ok()) return r.status();
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
  std::map<std::string, std::vector<int64_t>> expected = ExpectedShapes(config);
  expected["lm_head.weight"] = {config.vocab_size, config.n_embd};
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
    if (t.name != "lm_head.weight") ++found;
  }
  if (found != expected.size() - 1) {
    for (const auto& [name, shape] : expected) {
      if (name != "lm_head.weight" && weights.Find(name) == nullptr) {
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
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    std::string msg = absl::StrCat("checkpoint directory ", dir, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  if (!S_ISDIR(st.st_mode)) {
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
  absl::StatusOr<std::string> config_text = ReadWholeFile(config_path);
  if (!config_text.ok()) return config_text.status();
  HfCheckpoint out;
  absl::StatusOr<ModelConfig> config = ParseHfConfig(*config_text, config_path);
  if (!config.ok()) return config.status();
  out.config = *config;
  absl::StatusOr<StFile> weights = ReadSafetensorsFile(weights_path);
  if (!weights.ok()) return weights.status();
  out.weights = *std::move(weights);
  absl::Status match = CheckWeightsMatchConfig(out.config, out.weights, weights_path);
  if (!match.ok()) return match;
  return out;
}

absl::Status WriteHfCheckpoint(const std::string& dir, const ModelConfig& config, StFile weights) {
  absl::Status match = CheckWeightsMatchConfig(config, weights, dir);
  if (!match.ok()) return match;
  absl::Status valid = ValidateStFile(weights);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", valid.message()));

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
  }
  // Weights first, then config.json: a complete config.json means the weights beside it are
  // complete too.
  weights.metadata["format"] = "pt";
  absl::Status s = WriteSafetensorsFile(JoinPath(dir, kHfWeightsFileName), weights);
  if (!s.ok()) return s;
  return WriteFileAtomically(JoinPath(dir, kHfConfigFileName), SerializeHfConfig(config));
}

}  // namespace latchkey
