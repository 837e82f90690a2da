// HF GPTBigCode checkpoint folders (docs/checkpoints.md), torch-free:
//   <dir>/config.json        GPTBigCodeConfig keys <-> latchkey::ModelConfig
//   <dir>/model.safetensors  F32 weights, HF names ("transformer.h.0.attn.c_attn.weight"),
//                            __metadata__ {"format":"pt"}, lm_head omitted (tied to wte).
//
// The tensor names and shapes come from the one parameter table (worker/model/
// gpt_bigcode_params.h); config.json is read with the common JSON reader (common/json_reader.h);
// file operations are those of files.h.
//
// Thread-safety: all functions are reentrant.
#ifndef LATCHKEY_WORKER_CHECKPOINT_HF_CHECKPOINT_H_
#define LATCHKEY_WORKER_CHECKPOINT_HF_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "worker/checkpoint/safetensors.h"

namespace latchkey {

inline constexpr char kHfConfigFileName[] = "config.json";
inline constexpr char kHfWeightsFileName[] = "model.safetensors";

struct HfCheckpoint {
  ModelConfig config;
  StFile weights;  // tensors sorted by name; use weights.Find("transformer.wte.weight")
};

// Parses config.json text. Missing keys take the HF GPTBigCodeConfig defaults (vocab 50257,
// n_positions 1024, n_embd 768, n_layer 12, n_head 12, n_inner null, pdrops 0.1, ...); the HF
// aliases hidden_size, max_position_embeddings, num_attention_heads, num_hidden_layers are
// accepted. n_inner null -> 0. INVALID_ARGUMENT ("<source>: <key>: <reason>") on a wrong type,
// a non-positive size, n_embd not divisible by n_head, model_type other than "gpt_bigcode",
// activation_function other than gelu_pytorch_tanh / gelu_new (same tanh GELU), or
// tie_word_embeddings false (latchkey always ties lm_head to wte).
absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text,
                                          absl::string_view source = kHfConfigFileName);
// config.json text, pretty-printed and ending in a newline, with exactly these keys in this
// order: model_type, architectures, vocab_size, n_positions, n_embd, n_layer, n_head, n_inner
// (0 -> null), activation_function ("gelu_pytorch_tanh"), resid/embd/attn_pdrop,
// layer_norm_epsilon, initializer_range, scale_attn_weights, attention_softmax_in_fp32,
// scale_attention_softmax_in_fp32, multi_query, tie_word_embeddings (true), bos/eos_token_id
// (vocab_size - 1, as in GPT-2), torch_dtype ("float32").
std::string SerializeHfConfig(const ModelConfig& config);

// Refuses a checkpoint whose shape-defining keys disagree with the job spec's model: n_layer,
// n_embd, n_head, n_inner (compared as inner(): 0 and 4*n_embd agree), vocab_size, n_positions,
// multi_query. INVALID_ARGUMENT listing every disagreement, e.g.
//   "latchkey.init_from: checkpoint n_head 4 disagrees with model.n_head 8"
// (`field` is the spec field that named the checkpoint).
absl::Status CheckConfigAgrees(const ModelConfig& spec_model, const ModelConfig& ckpt,
                               const std::string& field);

// Checks that `weights` holds exactly the GPTBigCodeForCausalLM tensors for `config` with HF
// shapes (c_attn.weight [n_embd + 2*kv, n_embd], kv = head_dim for MQA, n_embd for MHA; Linear
// weights [out, in]) in a floating dtype (F32/F64/F16/BF16). "lm_head.weight" [vocab, n_embd] is
// allowed but optional (tied). INVALID_ARGUMENT naming `source` and the first offending tensor,
// or an invalid config (non-positive sizes, n_embd not divisible by n_head).
absl::Status CheckWeightsMatchConfig(const ModelConfig& config, const StFile& weights,
                                     absl::string_view source);

// Reads <dir>/config.json and <dir>/model.safetensors and checks they agree
// (CheckWeightsMatchConfig). NOT_FOUND naming the path for a missing folder or file;
// UNIMPLEMENTED for sharded (model.safetensors.index.json) or pytorch_model.bin-only folders.
absl::StatusOr<HfCheckpoint> ReadHfCheckpoint(const std::string& dir);

// Creates `dir` (and parents) if needed and writes model.safetensors (with
// __metadata__ "format": "pt" added to weights.metadata) and then config.json, each atomically.
// Refuses (INVALID_ARGUMENT, nothing written) weights that fail CheckWeightsMatchConfig.
// `weights` is taken by value: std::move it in to avoid copying the tensor data.
absl::Status WriteHfCheckpoint(const std::string& dir, const ModelConfig& config, StFile weights);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_HF_CHECKPOINT_H_
