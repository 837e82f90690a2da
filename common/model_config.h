// The model of a job (HF GPTBigCode config keys, the subset latchkey uses) and its one JSON
// codec: the three places a ModelConfig is written and read, each with its own keys, order,
// defaults and refusals, described by one field table (model_config.cc):
//
//   kJobSpec    the spec's "model" block (docs/job-spec.md). Sizes required and >= 1, dropout
//               in [0, 1), n_inner null or >= 1, unknown keys refused; absent optional keys
//               take ModelConfig's defaults (a missing *_pdrop is 0.0). Errors
//               "model.<key>: <reason>". Written with every key, n_inner 0 as null.
//   kHfConfig   an HF config.json (docs/checkpoints.md). Absent keys take HF GPTBigCodeConfig's
//               defaults (vocab 50257, n_embd 768, ...; a missing *_pdrop is 0.1), HF aliases
//               (hidden_size, ...) accepted, unknown keys ignored. Errors
//               "<source>: <key>: <reason>". Written as transformers writes it.
//   kManifest   a training checkpoint's manifest "model" object: every key required, as
//               written (n_inner 0 as 0). Errors carry nlohmann's text (the manifest reader
//               reports them as a malformed manifest).
//
// Comparison is one function too (DiffModelConfigs): every field, or only the fields that fix
// the weights' shapes.
//
// Thread-safety: value types and reentrant functions. Errors: INVALID_ARGUMENT from the
// readers; nothing else fails.
#ifndef LATCHKEY_COMMON_MODEL_CONFIG_H_
#define LATCHKEY_COMMON_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace latchkey {

// n_inner 0 means 4 * n_embd.
struct ModelConfig {
  int n_layer = 2;
  int n_embd = 64;
  int n_head = 8;
  int n_inner = 0;
  int vocab_size = 256;
  int n_positions = 64;
  bool multi_query = true;
  double resid_pdrop = 0.0;
  double embd_pdrop = 0.0;
  double attn_pdrop = 0.0;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true;

  int inner() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  int head_dim() const { return n_embd / n_head; }
};

enum class ModelJsonFormat { kJobSpec, kHfConfig, kManifest };

// Reads `obj` (a JSON object; for kManifest any JSON value) as `format` describes above.
// `source` prefixes kHfConfig's errors (a file name); the others ignore it.
absl::StatusOr<ModelConfig> ModelConfigFromJson(const nlohmann::json& obj, ModelJsonFormat format,
                                                absl::string_view source = "");

// `config` as `format` writes it, keys in that format's order (the job spec's canonical JSON
// sorts them when it is dumped).
nlohmann::ordered_json ModelConfigToJson(const ModelConfig& config, ModelJsonFormat format);

// One field that differs: its key and both values as messages show them ("8", "true").
struct ModelFieldDiff {
  const char* key;
  std::string a;
  std::string b;
};
// kAll: every field, n_inner as stored. kShape: the fields that fix the weights' shapes
// (n_layer, n_embd, n_head, n_inner compared as inner() so 0 and 4*n_embd agree, vocab_size,
// n_positions, multi_query).
enum class ModelFields { kAll, kShape };
// The fields of `fields` where `a` and `b` differ, in ModelConfig's field order (empty: equal).
std::vector<ModelFieldDiff> DiffModelConfigs(const ModelConfig& a, const ModelConfig& b,
                                             ModelFields fields = ModelFields::kAll);

// Every field equal (DiffModelConfigs(a, b) is empty).
bool operator==(const ModelConfig& a, const ModelConfig& b);
inline bool operator!=(const ModelConfig& a, const ModelConfig& b) { return !(a == b); }

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_MODEL_CONFIG_H_
