// Job spec: the JSON a user submits (docs/job-spec.md), parsed and validated into plain
// C++ types shared by the coordinator and the workers.
//
// Thread-safety: JobSpec is a value type; ParseJobSpec is pure and reentrant.
#ifndef LATCHKEY_COMMON_JOB_SPEC_H_
#define LATCHKEY_COMMON_JOB_SPEC_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/backend.h"
#include "common/model_config.h"

namespace latchkey {

// `latchkey.kv_reduce`: the user's policy for the replicated K/V gradient reduction.
enum class KvReducePolicy { kAuto, kPerMicroBatch, kDeferred, kCoalesced };
// What a window actually runs (a latch never carries kAuto).
enum class KvMode { kPerMicroBatch, kDeferred, kCoalesced };

const char* KvReducePolicyName(KvReducePolicy p);  // "auto", "per_micro_batch", ...
const char* KvModeName(KvMode m);                  // "per_micro_batch", "deferred", "coalesced"
std::optional<KvReducePolicy> ParseKvReducePolicy(absl::string_view name);
std::optional<KvMode> ParseKvMode(absl::string_view name);

enum class OptimizerType { kSgd, kAdamW };

// latchkey.backend and latchkey.device: CommBackend and DeviceKind (common/backend.h).
enum class TokenDtype { kUint16, kUint32 };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double momentum = 0.0;                       // SGD only; must be 0 for now
  std::array<double, 2> betas = {0.9, 0.999};  // AdamW
  double eps = 1e-8;                           // AdamW
  double weight_decay = 0.01;                  // AdamW (torch default)
};

// The top-level `scheduler` block: DeepSpeed's LR schedules (docs/job-spec.md), with the
// constructors' defaults. kNone: the optimizer's constant lr.
enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };
const char* SchedulerTypeName(SchedulerType t);  // "none", "WarmupLR", ...
const char* WarmupTypeName(WarmupType t);        // "log", "linear"

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  WarmupType warmup_type = WarmupType::kLog;
  int64_t warmup_num_steps = 1000;  // as given (>= 1); the schedule raises it to at least 2
  // WarmupLR / WarmupDecayLR. warmup_max_lr is resolved at parsing: WarmupLR's default is the
  // optimizer's lr, WarmupDecayLR's 0.001.
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  // WarmupDecayLR / WarmupCosineLR (required there; 0 for WarmupLR).
  int64_t total_num_steps = 0;
  // WarmupCosineLR: ratios of the optimizer's lr.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
};

// `latchkey.eval`: the held-out loss (docs/observability.md). Absent: tokens_file and split
// empty.
struct EvalConfig {
  std::string tokens_file;  // absolute after parsing; empty = no evaluation from a token file
  TokenDtype dtype = TokenDtype::kUint16;
  // "validation" or "test": that split of the Megatron dataset of latchkey.data instead of a
  // token file (exactly one of tokens_file / split is set when evaluation is on).
  std::string split;
  int64_t every_steps = 1;  // after the update of step s when (s + 1) % every_steps == 0
  int64_t samples = 1;      // K, eval samples 0..K-1 (modulo the file's sample count)

  bool enabled() const { return !tokens_file.empty() || !split.empty(); }
};

// `latchkey.checkpoint`: resumable training checkpoints (docs/checkpoints.md). Absent: dir empty.
// A checkpoint is taken after step s when (s + 1) % every_steps == 0 (after its evaluation).
struct CheckpointConfig {
  std::string dir;          // absolute after parsing; empty = no checkpoints
  int64_t every_steps = 1;  // >= 1
  int keep = 2;             // committed checkpoints kept (>= 1); pruning never removes the newest
  // Asynchronous saves (docs/fault-tolerance.md): training is blocked only while the state is
  // copied to host staging buffers; a background thread writes, and the commit runs at the
  // boundary after the next window (or at the end of the run). false: the synchronous save.
  bool async = true;

  bool enabled() const { return !dir.empty(); }
};

// `latchkey.tensorboard`: TensorBoard event files written by rank 0 (docs/observability.md
// "TensorBoard"). Absent: dir empty (`latchkey up` names RUN/tensorboard).
struct TensorboardConfig {
  std::string dir;  // absolute after parsing; empty = no event files

  bool enabled() const { return !dir.empty(); }
};

// `latchkey.elastic`: elastic recovery (docs/fault-tolerance.md "Elastic recovery"). Absent:
// min_dp 0, every attempt runs the spec's layout.
struct ElasticConfig {
  int min_dp = 0;  // >= 1 when present: the fewest DP replicas the job may shrink to

  bool enabled() const { return min_dp > 0; }
};

// `latchkey.stragglers` (docs/fault-tolerance.md "Stragglers"): when the coordinator names a
// rank slow, and whether the latch works around a slow data-parallel replica.
struct StragglerConfig {
  // Uneven micro-batches per DP replica, chosen from the measured speeds (off by default).
  bool rebalance = false;
  // A rank is slow when its compute time per micro-batch exceeds the median rank's by this
  // factor (> 1).
  double threshold = 1.25;
  // ... in this many consecutive windows before it is named (and as many under it to be
  // cleared).
  int windows = 3;
  // The speed of a rank: the median of its last `sample_steps` steps.
  int sample_steps = 5;
};

// `latchkey.activation_checkpointing` (docs/memory.md): which activations the backward
// recomputes instead of keeping.
enum class RecomputeMode {
  kNone,       // every activation is kept (the default)
  kSelective,  // core attention (scores, softmax, attention dropout, probs·V) is recomputed
  kFull,       // only the input of every `every_layers`-th layer group is kept
};
const char* RecomputeModeName(RecomputeMode m);  // "none", "selective", "full"
std::optional<RecomputeMode> ParseRecomputeMode(absl::string_view name);

struct ActivationCheckpointingConfig {
  RecomputeMode mode = RecomputeMode::kNone;
  int every_layers = 1;  // >= 1; full only: layers per recomputed group
};

// `latchkey.data.format`: a flat token file (or the synthetic source), or Megatron's indexed
// dataset (P.idx + P.bin, docs/data.md "Megatron indexed datasets").
enum class DataFormat { kTokens, kMegatron };

// One entry of `latchkey.data.blend`.
struct MegatronBlendEntry {
  double weight = 1.0;      // > 0 as given; normalised over the blend by the sampler
  std::string path_prefix;  // absolute after parsing
};

struct DataConfig {
  DataFormat format = DataFormat::kTokens;
  // kTokens: exactly one of tokens_file / synthetic_seed is set.
  std::string tokens_file;  // absolute after parsing (resolved against the spec's folder)
  TokenDtype dtype = TokenDtype::kUint16;
  std::optional<uint64_t> synthetic_seed;
  // kMegatron: exactly one of path_prefix / blend is set.
  std::string path_prefix;                // absolute after parsing
  std::vector<MegatronBlendEntry> blend;  // >= 1 entries
  std::string split = "100,0,0";          // Megatron's --split, as given ("90,5,5")
  uint64_t megatron_seed = 0;             // `seed` (< 2^32); default latchkey.seed
  std::string cache_dir;                  // absolute; empty: next to the data (docs/data.md)
  // `num_samples`: the training samples the indices are built for; default (resolved at
  // parsing, so a later change of accumulation steps does not reshuffle) steps * the
  // micro-batches per rank of those steps * DP * MB.
  int64_t num_samples = 0;
};

// Megatron's split string ("90,5,5", "949/50/1", "1"): 1 to 3 non-negative numbers separated
// by ',' or '/', missing ones 0, normalised by their sum (> 0). INVALID_ARGUMENT naming `field`.
absl::StatusOr<std::array<double, 3>> ParseMegatronSplit(const std::string& field,
                                                         absl::string_view split);

struct JobSpec {
  ModelConfig model;
  int micro_batch_size = 1;             // train_micro_batch_size_per_gpu
  int gradient_accumulation_steps = 1;  // managed windows: n_s
  double gradient_clipping = 0.0;       // 0 = off
  int zero_stage = 0;                   // zero_optimization.stage: 0, 1 or 2
  bool bf16 = false;                    // bf16.enabled
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;          // top-level `scheduler`
  int tp = 1;                         // tensor_parallel.autotp_size
  bool has_partition_config = false;  // tensor_parallel.partition_config present
  // tensor_parallel.sequence_parallel (Megatron's --sequence-parallel): LayerNorm, dropout and
  // residual activations sharded along the sequence over TP. Only with tp > 1 (with tp 1 the
  // key is accepted, warned about and off).
  bool sequence_parallel = false;
  bool managed_gradient_accumulation = true;  // false: windows from window_schedule
  std::vector<int> window_schedule;           // latchkey.window_schedule (last one repeats)
  // latchkey.no_sync: the no_sync mask of every window (managed windows; one entry per
  // micro-batch, the last false). Empty = default (all but the boundary micro-batch no_sync).
  std::vector<bool> no_sync;

  // latchkey.* keys
  int seq_len = 64;
  int64_t steps = 1;
  uint64_t seed = 1;
  int world_size = 1;  // default: tp
  KvReducePolicy kv_reduce = KvReducePolicy::kAuto;
  DataConfig data;
  EvalConfig eval;                   // latchkey.eval
  std::string init_from;             // absolute after parsing; empty = init from seed
  CheckpointConfig checkpoint;       // latchkey.checkpoint
  TensorboardConfig tensorboard;     // latchkey.tensorboard
  int max_restarts = 3;              // latchkey.max_restarts: recoveries before the job fails
  double hang_timeout_seconds = 20;  // latchkey.hang_timeout_seconds: no progress -> stalled
  ElasticConfig elastic;             // latchkey.elastic
  // latchkey.rejoin_timeout_seconds: how long a recovery waits for every rank to join the new
  // attempt. 0 (absent): the coordinator's liveness timeout.
  double rejoin_timeout_seconds = 0;
  // latchkey.partition_timeout_seconds: how long the job waits for a cut link between its ranks
  // (no restart spent while it waits) before it fails naming the link.
  double partition_timeout_seconds = 600;
  // latchkey.preemption.grace_seconds: how long a worker that got SIGTERM or SIGINT may take
  // to finish the windows already decided, save with the others and exit; past it, it exits
  // without the save (the previous checkpoint stays the newest) and the job is recovered from
  // as after a crash. Inside Kubernetes' default terminationGracePeriodSeconds (30).
  double preemption_grace_seconds = 25;
  StragglerConfig stragglers;                              // latchkey.stragglers
  CommBackend backend = CommBackend::kAuto;                // latchkey.backend
  DeviceKind device = DeviceKind::kCpu;                    // latchkey.device
  bool tf32 = false;                                       // latchkey.tf32: TF32 matmuls on cuda
  ActivationCheckpointingConfig activation_checkpointing;  // latchkey.activation_checkpointing
  // latchkey.overlap_dp_reduction: ZeRO-1's boundary DP reduction bucketed and issued during the
  // last micro-batch's backward (docs/memory.md). ZeRO-2 always reduces during the backward.
  bool overlap_dp_reduction = false;

  // Unknown DeepSpeed top-level keys: listed here, ignored otherwise.
  std::vector<std::string> warnings;

  int dp() const { return world_size / tp; }
  // n_s: micro-batches in window s (managed: GAS; unmanaged: the schedule, last one repeating).
  int WindowLength(int64_t s) const;
  // M_s: micro-batches in all windows before s.
  int64_t FirstMicroBatch(int64_t s) const;
};

// Elastic recovery's choice of DP (docs/fault-tolerance.md "Elastic recovery"): the largest dp'
// with min_dp <= dp' <= max_dp, dp' * tp <= workers (whole TP groups) and
// global_micro_batches % dp' == 0 (global_micro_batches = GAS * dp of the layout it leaves, so
// GAS' = global_micro_batches / dp' keeps the global batch). 0 when there is none.
int ElasticDp(int min_dp, int max_dp, int tp, int workers, int64_t global_micro_batches);

// Parses and validates a job spec. `base_dir` resolves relative paths (token files, init_from);
// files are NOT opened here (the coordinator may not see them; workers check them).
// Errors: INVALID_ARGUMENT with "<field.path>: <reason>", e.g.
//   "tensor_parallel.autotp_size: 3 does not divide model.n_head (8)".
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view json_text, const std::string& base_dir);
// Reads the file and calls ParseJobSpec with its folder as base_dir.
absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path);

// The canonical JSON of a spec: every field explicit, keys sorted, paths as stored (absolute after
// parsing). ParseJobSpec accepts it back to an equal spec, whatever base_dir it is given.
// `warnings` are not carried (they describe the submitted text, not the job).
std::string JobSpecToJson(const JobSpec& spec);

// Field-wise equality (JobSpec's includes `warnings`; ModelConfig's is in model_config.h).
bool operator==(const OptimizerConfig& a, const OptimizerConfig& b);
bool operator==(const MegatronBlendEntry& a, const MegatronBlendEntry& b);
bool operator==(const DataConfig& a, const DataConfig& b);
bool operator==(const SchedulerConfig& a, const SchedulerConfig& b);
bool operator==(const EvalConfig& a, const EvalConfig& b);
bool operator==(const CheckpointConfig& a, const CheckpointConfig& b);
bool operator==(const ElasticConfig& a, const ElasticConfig& b);
bool operator==(const TensorboardConfig& a, const TensorboardConfig& b);
bool operator==(const StragglerConfig& a, const StragglerConfig& b);
bool operator==(const ActivationCheckpointingConfig& a, const ActivationCheckpointingConfig& b);
bool operator==(const JobSpec& a, const JobSpec& b);
inline bool operator!=(const OptimizerConfig& a, const OptimizerConfig& b) { return !(a == b); }
inline bool operator!=(const DataConfig& a, const DataConfig& b) { return !(a == b); }
inline bool operator!=(const SchedulerConfig& a, const SchedulerConfig& b) { return !(a == b); }
inline bool operator!=(const EvalConfig& a, const EvalConfig& b) { return !(a == b); }
inline bool operator!=(const CheckpointConfig& a, const CheckpointConfig& b) { return !(a == b); }
inline bool operator!=(const ElasticConfig& a, const ElasticConfig& b) { return !(a == b); }
inline bool operator!=(const JobSpec& a, const JobSpec& b) { return !(a == b); }

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_JOB_SPEC_H_
