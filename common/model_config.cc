#include "common/model_config.h"

#include <climits>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json_reader.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using Json = nlohmann::ordered_json;
using Member = std::variant<int ModelConfig::*, bool ModelConfig::*, double ModelConfig::*>;

// One ModelConfig field: its key in every format, and whether it fixes the weights' shapes.
// `null_is_zero`: JSON null reads as 0 and 0 writes as null (HF's n_inner None), except in the
// manifest, which stores the number as it is.
struct Field {
  const char* key;
  Member member;
  bool shape;
  bool null_is_zero = false;
};

// In ModelConfig's order, which is also the manifest's key order and the order comparisons
// report differences in.
const Field kFields[] = {
    {"n_layer", &ModelConfig::n_layer, true},
    {"n_embd", &ModelConfig::n_embd, true},
    {"n_head", &ModelConfig::n_head, true},
    {"n_inner", &ModelConfig::n_inner, true, true},
    {"vocab_size", &ModelConfig::vocab_size, true},
    {"n_positions", &ModelConfig::n_positions, true},
    {"multi_query", &ModelConfig::multi_query, true},
    {"resid_pdrop", &ModelConfig::resid_pdrop, false},
    {"embd_pdrop", &ModelConfig::embd_pdrop, false},
    {"attn_pdrop", &ModelConfig::attn_pdrop, false},
    {"layer_norm_epsilon", &ModelConfig::layer_norm_epsilon, false},
    {"initializer_range", &ModelConfig::initializer_range, false},
    {"scale_attn_weights", &ModelConfig::scale_attn_weights, false},
};

const Field* FindField(absl::string_view key) {
  for (const Field& f : kFields) {
    if (key == f.key) return &f;
  }
  return nullptr;
}

// How one format reads one field: the bounds of its kind (ints or doubles; bools have none),
// whether it must be present, and an HF alias read in its place when the key is absent.
struct ReadRule {
  const char* key;
  IntBounds ints = {};
  DoubleRange doubles = {};
  bool required = false;
  const char* alias = nullptr;
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr IntBounds kAtLeastOne{1};
constexpr IntBounds kHfPositive{1, INT_MAX, "positive"};
constexpr DoubleRange kUnitInterval{0.0, false, 1.0, true};  // [0, 1)
constexpr DoubleRange kPositive{0.0, true, kInf, true};      // (0, inf)
constexpr DoubleRange kNonNegative{0.0, false, kInf, true};  // [0, inf)

// The spec's rules in the order its errors are found (required keys are checked first).
const ReadRule kSpecRules[] = {
    {"n_layer", kAtLeastOne, {}, true},
    {"n_embd", kAtLeastOne, {}, true},
    {"n_head", kAtLeastOne, {}, true},
    {"n_inner", kAtLeastOne},
    {"vocab_size", kAtLeastOne, {}, true},
    {"n_positions", kAtLeastOne, {}, true},
    {"multi_query"},
    {"scale_attn_weights"},
    {"resid_pdrop", {}, kUnitInterval},
    {"embd_pdrop", {}, kUnitInterval},
    {"attn_pdrop", {}, kUnitInterval},
    {"layer_norm_epsilon", {}, kPositive},
    {"initializer_range", {}, kNonNegative},
};

// config.json's rules: transformers writes any float, so dropout is only non-negative here.
const ReadRule kHfRules[] = {
    {"vocab_size", kHfPositive},
    {"n_positions", kHfPositive, {}, false, "max_position_embeddings"},
    {"n_embd", kHfPositive, {}, false, "hidden_size"},
    {"n_layer", kHfPositive, {}, false, "num_hidden_layers"},
    {"n_head", kHfPositive, {}, false, "num_attention_heads"},
    {"n_inner", IntBounds{0, INT_MAX, ">= 0 or null"}},
    {"multi_query"},
    {"resid_pdrop", {}, kNonNegative},
    {"embd_pdrop", {}, kNonNegative},
    {"attn_pdrop", {}, kNonNegative},
    {"layer_norm_epsilon", {}, kNonNegative},
    {"initializer_range", {}, kNonNegative},
    {"scale_attn_weights"},
};

// config.json's keys in the order latchkey writes them (kFields' keys are the model's, the others
// FixedValue's). The spec writes "model_type" and every field (its JSON sorts them); the
// manifest every field in kFields' order.
const char* const kHfKeys[] = {
    // The architecture and its sizes.
    "model_type", "architectures", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
    "n_inner", "activation_function",
    // Dropout, normalization, initialization, attention.
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "initializer_range",
    "scale_attn_weights", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32",
    "multi_query",
    // Embeddings, special tokens, the weights' dtype.
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype"};

// The values latchkey always writes for the keys that are no ModelConfig field.
Json FixedValue(absl::string_view key, const ModelConfig& c) {
  if (key == "model_type") return "gpt_bigcode";
  if (key == "architectures") return Json::array({"GPTBigCodeForCausalLM"});
  if (key == "activation_function") return "gelu_pytorch_tanh";
  if (key == "torch_dtype") return "float32";
  // bos = eos = the last token, as in GPT-2.
  if (key == "bos_token_id" || key == "eos_token_id") return c.vocab_size - 1;
  return true;  // attention_softmax_in_fp32, scale_attention_softmax_in_fp32, tie_word_embeddings
}

Json FieldValue(const Field& f, const ModelConfig& c, ModelJsonFormat format) {
  return std::visit(
      [&](auto member) -> Json {
        const auto value = c.*member;
        if constexpr (std::is_same_v<decltype(value), const int>) {
          if (f.null_is_zero && format != ModelJsonFormat::kManifest && value <= 0) return Json();
        }
        return value;
      },
      f.member);
}

// One rule's key read into `c` with the common reader (the spec and config.json).
absl::Status ReadField(JsonObjectReader& r, const ReadRule& rule, ModelConfig* c) {
  const Field& f = *FindField(rule.key);
  const char* key = rule.alias != nullptr ? r.FirstPresent({rule.key, rule.alias}) : rule.key;
  if (f.null_is_zero) {
    const nlohmann::json* v = r.Get(key);
    if (v != nullptr && v->is_null()) {
      c->*std::get<int ModelConfig::*>(f.member) = 0;
      return absl::OkStatus();
    }
  }
  return std::visit(
      [&](auto member) -> absl::Status {
        auto* out = &(c->*member);
        if constexpr (std::is_same_v<decltype(out), int*>) {
          return r.Int(key, out, rule.ints);
        } else if constexpr (std::is_same_v<decltype(out), bool*>) {
          return r.Bool(key, out);
        } else {
          return r.Double(key, out, rule.doubles);
        }
      },
      f.member);
}

template <size_t N>
absl::Status ReadRules(JsonObjectReader& r, const ReadRule (&rules)[N], ModelConfig* c) {
  for (const ReadRule& rule : rules) {
    if (rule.required) LK_RETURN_IF_ERROR(r.Require(rule.key));
  }
  for (const ReadRule& rule : rules) LK_RETURN_IF_ERROR(ReadField(r, rule, c));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ReadSpecModel(const nlohmann::json& obj) {
  JsonObjectReader r(obj, "model");
  std::string type;
  LK_RETURN_IF_ERROR(r.Require("model_type"));
  LK_RETURN_IF_ERROR(r.String("model_type", &type));
  if (type != "gpt_bigcode") {
    return r.Error("model_type", absl::StrCat("must be \"gpt_bigcode\", got \"", type, "\""));
  }
  ModelConfig c;
  LK_RETURN_IF_ERROR(ReadRules(r, kSpecRules, &c));
  LK_RETURN_IF_ERROR(r.RefuseUnknown());
  return c;
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

// transformers' GPTBigCodeConfig() defaults, in ModelConfig's field order: 12 layers, n_embd 768,
// 12 heads, n_inner None, vocab 50257, 1024 positions, MQA, dropout 0.1, epsilon 1e-5,
// initializer range 0.02, scaled attention.
ModelConfig HfConfigDefaults() {
  return ModelConfig{12, 768, 12, 0, 50257, 1024, true, 0.1, 0.1, 0.1, 1e-5, 0.02, true};
}

absl::StatusOr<ModelConfig> ReadHfModel(const nlohmann::json& obj, absl::string_view source) {
  // Keys latchkey does not use (architectures, bos_token_id, ...) are ignored.
  JsonObjectReader r(obj, "", std::string(source));
  LK_RETURN_IF_ERROR(
      ReadOneOf(r, "model_type", {"gpt_bigcode"}, "latchkey reads GPTBigCode checkpoints only"));
  LK_RETURN_IF_ERROR(ReadOneOf(r, "activation_function", {"gelu_pytorch_tanh", "gelu_new"},
                               "latchkey implements the tanh GELU only"));
  ModelConfig c = HfConfigDefaults();
  LK_RETURN_IF_ERROR(ReadRules(r, kHfRules, &c));
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

// The manifest is latchkey's own file: every key is required and read with nlohmann's checked
// accessors, whose messages (key not found, wrong type) the manifest reader reports.
absl::StatusOr<ModelConfig> ReadManifestModel(const nlohmann::json& j) {
  ModelConfig c;
  try {
    for (const Field& f : kFields) {
      std::visit(
          [&](auto member) {
            auto& out = c.*member;
            out = j.at(f.key).template get<std::remove_reference_t<decltype(out)>>();
          },
          f.member);
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return c;
}

std::string Describe(const Field& f, const ModelConfig& c, ModelFields fields) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto value = c.*member;
        if constexpr (std::is_same_v<decltype(value), const bool>) {
          return value ? "true" : "false";
        } else if constexpr (std::is_same_v<decltype(value), const int>) {
          // n_inner's shape is the inner width it stands for.
          if (fields == ModelFields::kShape && member == &ModelConfig::n_inner) {
            return absl::StrCat(c.inner());
          }
          return absl::StrCat(value);
        } else {
          return absl::StrCat(value);
        }
      },
      f.member);
}

bool FieldEqual(const Field& f, const ModelConfig& a, const ModelConfig& b, ModelFields fields) {
  if (fields == ModelFields::kShape && f.key == absl::string_view("n_inner")) {
    return a.inner() == b.inner();
  }
  return std::visit([&](auto member) { return a.*member == b.*member; }, f.member);
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromJson(const nlohmann::json& obj, ModelJsonFormat format,
                                                absl::string_view source) {
  switch (format) {
    case ModelJsonFormat::kJobSpec:
      return ReadSpecModel(obj);
    case ModelJsonFormat::kHfConfig:
      return ReadHfModel(obj, source);
    case ModelJsonFormat::kManifest:
      return ReadManifestModel(obj);
  }
  return absl::InvalidArgumentError("unknown model JSON format");
}

Json ModelConfigToJson(const ModelConfig& config, ModelJsonFormat format) {
  Json j;
  auto put = [&](const char* key) {
    const Field* f = FindField(key);
    j[key] = f != nullptr ? FieldValue(*f, config, format) : FixedValue(key, config);
  };
  switch (format) {
    case ModelJsonFormat::kJobSpec:
      put("model_type");
      for (const Field& f : kFields) put(f.key);
      break;
    case ModelJsonFormat::kHfConfig:
      for (const char* key : kHfKeys) put(key);
      break;
    case ModelJsonFormat::kManifest:
      for (const Field& f : kFields) put(f.key);
      break;
  }
  return j;
}

std::vector<ModelFieldDiff> DiffModelConfigs(const ModelConfig& a, const ModelConfig& b,
                                             ModelFields fields) {
  std::vector<ModelFieldDiff> out;
  for (const Field& f : kFields) {
    if (fields == ModelFields::kShape && !f.shape) continue;
    if (FieldEqual(f, a, b, fields)) continue;
    out.push_back({f.key, Describe(f, a, fields), Describe(f, b, fields)});
  }
  return out;
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  for (const Field& f : kFields) {
    if (!FieldEqual(f, a, b, ModelFields::kAll)) return false;
  }
  return true;
}

}  // namespace latchkey
