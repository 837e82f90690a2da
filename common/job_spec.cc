#include "common/job_spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec_data.h"
#include "common/json_reader.h"
#include "common/status_macros.h"
#include "common/validate_job_spec.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using json = nlohmann::json;

absl::Status Err(const std::string& path, absl::string_view reason) {
  return FieldError(path, reason);
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr DoubleRange kUnitInterval{0.0, false, 1.0, true};  // [0, 1)
constexpr DoubleRange kPositive{0.0, true, kInf, true};      // (0, inf)
constexpr DoubleRange kNonNegative{0.0, false, kInf, true};  // [0, inf)
constexpr IntBounds AtLeast(int64_t min) { return IntBounds{min}; }

absl::Status ResolvePath(const std::string& field, const std::string& base_dir,
                         std::string* value) {
  return ResolveSpecPath(field, base_dir, value);
}

absl::Status ParseOptimizer(JsonObjectReader s, OptimizerConfig* o,
                            std::vector<std::string>* warn) {
  std::string type;
  LK_RETURN_IF_ERROR(s.Require("type"));
  LK_RETURN_IF_ERROR(s.String("type", &type));
  const std::string lower = absl::AsciiStrToLower(type);
  if (lower == "adamw") {
    o->type = OptimizerType::kAdamW;
  } else if (lower == "sgd") {
    o->type = OptimizerType::kSgd;
    o->weight_decay = 0.0;  // torch.optim.SGD's default
  } else {
    return s.Error("type", absl::StrCat("'", type, "' is not supported (SGD or AdamW)"));
  }
  const json* params = nullptr;
  LK_RETURN_IF_ERROR(s.Object("params", &params));
  s.WarnUnknown(warn);
  if (params == nullptr) return absl::OkStatus();

  JsonObjectReader p = s.Child("params", *params);
  LK_RETURN_IF_ERROR(p.Double("lr", &o->lr, kPositive));
  if (o->type == OptimizerType::kSgd) {
    LK_RETURN_IF_ERROR(p.Double("momentum", &o->momentum));
    if (o->momentum != 0.0) {
      return p.Error("momentum",
                     absl::StrCat("SGD momentum ", o->momentum, " is not supported yet (only 0)"));
    }
    LK_RETURN_IF_ERROR(p.Double("weight_decay", &o->weight_decay));
    if (o->weight_decay != 0.0) {
      return p.Error("weight_decay", "SGD weight decay is not supported yet (only 0)");
    }
  } else {
    std::vector<double> betas(o->betas.begin(), o->betas.end());
    LK_RETURN_IF_ERROR(p.DoubleArray("betas", &betas, kUnitInterval));
    std::copy(betas.begin(), betas.end(), o->betas.begin());
    LK_RETURN_IF_ERROR(p.Double("eps", &o->eps, kPositive));
    LK_RETURN_IF_ERROR(p.Double("weight_decay", &o->weight_decay, kNonNegative));
  }
  std::vector<std::string> unknown = p.UnknownKeys();
  if (!unknown.empty()) {
    return p.Error(unknown.front(), absl::StrCat("unknown or unsupported parameter for ",
                                                 o->type == OptimizerType::kSgd ? "SGD" : "AdamW"));
  }
  return absl::OkStatus();
}

// The top-level `scheduler` (DeepSpeed's block). `optimizer_lr` is WarmupLR's default
// warmup_max_lr. Unknown types, params and warmup types are refused; other keys of the block
// are warnings, as in every DeepSpeed section.
absl::Status ParseScheduler(JsonObjectReader s, double optimizer_lr, SchedulerConfig* c,
                            std::vector<std::string>* warn) {
  std::string type;
  LK_RETURN_IF_ERROR(s.Require("type"));
  LK_RETURN_IF_ERROR(s.String("type", &type));
  if (type == "WarmupLR") {
    c->type = SchedulerType::kWarmupLR;
  } else if (type == "WarmupDecayLR") {
    c->type = SchedulerType::kWarmupDecayLR;
  } else if (type == "WarmupCosineLR") {
    c->type = SchedulerType::kWarmupCosineLR;
  } else {
    return s.Error("type", absl::StrCat("unknown scheduler '", type,
                                        "' (WarmupLR, WarmupDecayLR, WarmupCosineLR)"));
  }
  const json* params = nullptr;
  LK_RETURN_IF_ERROR(s.Object("params", &params));
  s.WarnUnknown(warn);
  const json none = json::object();
  JsonObjectReader p = s.Child("params", params != nullptr ? *params : none);
  if (c->type != SchedulerType::kWarmupLR) {
    LK_RETURN_IF_ERROR(p.Require("total_num_steps"));
    LK_RETURN_IF_ERROR(p.Int64("total_num_steps", &c->total_num_steps, AtLeast(1)));
  }
  LK_RETURN_IF_ERROR(
      p.Int64("warmup_num_steps", &c->warmup_num_steps,
              IntBounds{1, std::numeric_limits<int64_t>::max(), "a positive integer"}));
  std::string warmup_type = "log";
  LK_RETURN_IF_ERROR(p.String("warmup_type", &warmup_type));
  if (warmup_type == "log") {
    c->warmup_type = WarmupType::kLog;
  } else if (warmup_type == "linear") {
    c->warmup_type = WarmupType::kLinear;
  } else {
    return p.Error("warmup_type",
                   absl::StrCat("unknown warmup_type '", warmup_type, "' (log, linear)"));
  }
  if (c->type == SchedulerType::kWarmupCosineLR) {
    LK_RETURN_IF_ERROR(p.Double("warmup_min_ratio", &c->warmup_min_ratio, kNonNegative));
    LK_RETURN_IF_ERROR(p.Double("cos_min_ratio", &c->cos_min_ratio, kNonNegative));
  } else {
    c->warmup_max_lr = c->type == SchedulerType::kWarmupLR ? optimizer_lr : 0.001;
    LK_RETURN_IF_ERROR(p.Double("warmup_min_lr", &c->warmup_min_lr, kNonNegative));
    LK_RETURN_IF_ERROR(p.Double("warmup_max_lr", &c->warmup_max_lr, kNonNegative));
  }
  std::vector<std::string> unknown = p.UnknownKeys();
  if (!unknown.empty()) {
    return p.Error(unknown.front(), absl::StrCat("unknown or unsupported parameter for ", type));
  }
  // DeepSpeed compares against the raised warmup length, and only warns.
  const int64_t warmup = std::max<int64_t>(2, c->warmup_num_steps);
  if (c->type != SchedulerType::kWarmupLR && c->total_num_steps < warmup) {
    warn->push_back(absl::StrCat("scheduler.params.total_num_steps: ", c->total_num_steps,
                                 " is less than warmup_num_steps (", warmup, ")"));
  }
  return absl::OkStatus();
}

// `dtype` of a token file: uint16 (the default) or uint32.
absl::Status ParseDtype(JsonObjectReader& s, TokenDtype* out) {
  std::string dtype = "uint16";
  LK_RETURN_IF_ERROR(s.String("dtype", &dtype));
  if (dtype == "uint16") {
    *out = TokenDtype::kUint16;
  } else if (dtype == "uint32") {
    *out = TokenDtype::kUint32;
  } else {
    return s.Error("dtype", absl::StrCat("unknown dtype '", dtype, "' (uint16, uint32)"));
  }
  return absl::OkStatus();
}

absl::Status ParseData(JsonObjectReader s, const std::string& base_dir, uint64_t default_seed,
                       DataConfig* d) {
  if (s.Get("format") != nullptr) {
    std::string format;
    LK_RETURN_IF_ERROR(s.String("format", &format));
    if (format == "megatron") return ParseMegatronData(s, base_dir, default_seed, d);
    if (format != "tokens") {
      return s.Error("format", absl::StrCat("unknown format '", format, "' (tokens, megatron)"));
    }
  }
  const json* synthetic = nullptr;
  LK_RETURN_IF_ERROR(s.Object("synthetic", &synthetic));
  const bool has_file = s.Get("tokens_file") != nullptr;
  if (has_file == (synthetic != nullptr)) {
    absl::Status refused =
        Err("latchkey.data", "exactly one of tokens_file or synthetic is required");
    if (has_file) return refused;
    return s.WithMisspelling(std::move(refused), {"tokens_file", "synthetic", "format"});
  }
  if (has_file) {
    LK_RETURN_IF_ERROR(s.String("tokens_file", &d->tokens_file));
    LK_RETURN_IF_ERROR(ResolvePath(s.Path("tokens_file"), base_dir, &d->tokens_file));
  } else {
    JsonObjectReader syn = s.Child("synthetic", *synthetic);
    uint64_t seed = 1;
    LK_RETURN_IF_ERROR(syn.Uint64("seed", &seed));
    LK_RETURN_IF_ERROR(syn.RefuseUnknown());
    d->synthetic_seed = seed;
  }
  LK_RETURN_IF_ERROR(ParseDtype(s, &d->dtype));
  return s.RefuseUnknown();
}

// latchkey.eval: {tokens_file, dtype | split, every_steps, samples}; the file is checked by the
// workers, a split against latchkey.data in ResolveMegatronData.
absl::Status ParseEval(JsonObjectReader s, const std::string& base_dir, EvalConfig* e) {
  if (s.Get("split") != nullptr) {
    LK_RETURN_IF_ERROR(s.String("split", &e->split));
    if (e->split != "validation" && e->split != "test") {
      return s.Error("split", absl::StrCat("unknown split '", e->split, "' (validation, test)"));
    }
    if (s.Get("tokens_file") != nullptr || s.Get("dtype") != nullptr) {
      return s.Error("split", "exactly one of tokens_file or split is allowed");
    }
  } else {
    if (s.Get("tokens_file") == nullptr) {
      return s.WithMisspelling(s.Error("tokens_file", "required (or split)"),
                               {"tokens_file", "split"});
    }
    LK_RETURN_IF_ERROR(s.String("tokens_file", &e->tokens_file));
    LK_RETURN_IF_ERROR(ResolvePath(s.Path("tokens_file"), base_dir, &e->tokens_file));
    LK_RETURN_IF_ERROR(ParseDtype(s, &e->dtype));
  }
  LK_RETURN_IF_ERROR(s.Require("every_steps"));
  LK_RETURN_IF_ERROR(s.Int64("every_steps", &e->every_steps, AtLeast(1)));
  LK_RETURN_IF_ERROR(s.Require("samples"));
  LK_RETURN_IF_ERROR(s.Int64("samples", &e->samples, AtLeast(1)));
  return s.RefuseUnknown();
}

// latchkey.checkpoint: {dir, every_steps, keep, async}; the folder is created by the workers.
absl::Status ParseCheckpoint(JsonObjectReader s, const std::string& base_dir, CheckpointConfig* c) {
  LK_RETURN_IF_ERROR(s.Require("dir"));
  LK_RETURN_IF_ERROR(s.String("dir", &c->dir));
  if (c->dir.empty()) return s.Error("dir", "must not be empty");
  LK_RETURN_IF_ERROR(ResolvePath(s.Path("dir"), base_dir, &c->dir));
  LK_RETURN_IF_ERROR(s.Require("every_steps"));
  LK_RETURN_IF_ERROR(s.Int64("every_steps", &c->every_steps, AtLeast(1)));
  LK_RETURN_IF_ERROR(s.Int("keep", &c->keep, AtLeast(1)));
  LK_RETURN_IF_ERROR(s.Bool("async", &c->async));
  return s.RefuseUnknown();
}

// latchkey.tensorboard: {dir}; the folder is created by rank 0.
absl::Status ParseTensorboard(JsonObjectReader s, const std::string& base_dir,
                              TensorboardConfig* t) {
  LK_RETURN_IF_ERROR(s.Require("dir"));
  LK_RETURN_IF_ERROR(s.String("dir", &t->dir));
  if (t->dir.empty()) return s.Error("dir", "must not be empty");
  LK_RETURN_IF_ERROR(ResolvePath(s.Path("dir"), base_dir, &t->dir));
  return s.RefuseUnknown();
}

// latchkey.activation_checkpointing: {mode, every_layers}.
absl::Status ParseActivationCheckpointing(JsonObjectReader s, ActivationCheckpointingConfig* c) {
  if (s.Get("mode") != nullptr) {
    std::string name;
    LK_RETURN_IF_ERROR(s.String("mode", &name));
    std::optional<RecomputeMode> m = ParseRecomputeMode(name);
    if (!m)
      return s.Error("mode", absl::StrCat("unknown mode '", name, "' (none, selective, full)"));
    c->mode = *m;
  }
  const bool has_every = s.Get("every_layers") != nullptr;
  LK_RETURN_IF_ERROR(s.Int("every_layers", &c->every_layers, AtLeast(1)));
  if (has_every && c->mode != RecomputeMode::kFull && c->every_layers != 1) {
    return s.Error("every_layers", "applies to mode \"full\" only");
  }
  return s.RefuseUnknown();
}

// latchkey.elastic: {min_dp}; checked against the layout in ParseTop.
absl::Status ParseElastic(JsonObjectReader s, ElasticConfig* e) {
  LK_RETURN_IF_ERROR(s.Require("min_dp"));
  LK_RETURN_IF_ERROR(s.Int("min_dp", &e->min_dp, AtLeast(1)));
  return s.RefuseUnknown();
}

absl::Status ParsePreemption(JsonObjectReader s, JobSpec* spec) {
  LK_RETURN_IF_ERROR(s.Double("grace_seconds", &spec->preemption_grace_seconds, kPositive));
  return s.RefuseUnknown();
}

// latchkey.stragglers: {rebalance, threshold, windows, sample_steps}; rebalance is checked
// against the rest of the spec in ValidateJobSpec.
absl::Status ParseStragglers(JsonObjectReader s, StragglerConfig* c) {
  LK_RETURN_IF_ERROR(s.Bool("rebalance", &c->rebalance));
  LK_RETURN_IF_ERROR(s.Double("threshold", &c->threshold, DoubleRange{1.0, true, kInf, true}));
  LK_RETURN_IF_ERROR(s.Int("windows", &c->windows, AtLeast(1)));
  LK_RETURN_IF_ERROR(s.Int("sample_steps", &c->sample_steps, AtLeast(1)));
  return s.RefuseUnknown();
}

absl::Status ParseLatchkey(JsonObjectReader s, const std::string& base_dir, JobSpec* spec,
                           bool* has_world_size, bool* has_schedule) {
  LK_RETURN_IF_ERROR(s.Require("seq_len"));
  LK_RETURN_IF_ERROR(s.Int("seq_len", &spec->seq_len, AtLeast(1)));
  LK_RETURN_IF_ERROR(s.Require("steps"));
  LK_RETURN_IF_ERROR(s.Int64("steps", &spec->steps, AtLeast(1)));
  LK_RETURN_IF_ERROR(s.Uint64("seed", &spec->seed));
  *has_world_size = s.Get("world_size") != nullptr;
  LK_RETURN_IF_ERROR(s.Int("world_size", &spec->world_size, AtLeast(1)));
  if (s.Get("kv_reduce") != nullptr) {
    std::string kv;
    LK_RETURN_IF_ERROR(s.String("kv_reduce", &kv));
    std::optional<KvReducePolicy> p = ParseKvReducePolicy(kv);
    if (!p) {
      return s.Error("kv_reduce", absl::StrCat("unknown policy '", kv,
                                               "' (auto, per_micro_batch, deferred, coalesced)"));
    }
    spec->kv_reduce = *p;
  }
  *has_schedule = s.Get("window_schedule") != nullptr;
  LK_RETURN_IF_ERROR(s.IntArray("window_schedule", &spec->window_schedule, AtLeast(1)));
  LK_RETURN_IF_ERROR(s.BoolArray("no_sync", &spec->no_sync));
  LK_RETURN_IF_ERROR(s.String("init_from", &spec->init_from));
  if (s.Get("init_from") != nullptr) {
    LK_RETURN_IF_ERROR(ResolvePath(s.Path("init_from"), base_dir, &spec->init_from));
  }
  const json* data = nullptr;
  LK_RETURN_IF_ERROR(s.Require("data"));
  LK_RETURN_IF_ERROR(s.Object("data", &data));
  LK_RETURN_IF_ERROR(ParseData(s.Child("data", *data), base_dir, spec->seed, &spec->data));
  const json* eval = nullptr;
  LK_RETURN_IF_ERROR(s.Object("eval", &eval));
  if (eval != nullptr) LK_RETURN_IF_ERROR(ParseEval(s.Child("eval", *eval), base_dir, &spec->eval));
  const json* checkpoint = nullptr;
  LK_RETURN_IF_ERROR(s.Object("checkpoint", &checkpoint));
  if (checkpoint != nullptr) {
    LK_RETURN_IF_ERROR(
        ParseCheckpoint(s.Child("checkpoint", *checkpoint), base_dir, &spec->checkpoint));
  }
  const json* tensorboard = nullptr;
  LK_RETURN_IF_ERROR(s.Object("tensorboard", &tensorboard));
  if (tensorboard != nullptr) {
    LK_RETURN_IF_ERROR(
        ParseTensorboard(s.Child("tensorboard", *tensorboard), base_dir, &spec->tensorboard));
  }
  LK_RETURN_IF_ERROR(s.Int("max_restarts", &spec->max_restarts, AtLeast(0)));
  LK_RETURN_IF_ERROR(s.Double("hang_timeout_seconds", &spec->hang_timeout_seconds, kPositive));
  const json* elastic = nullptr;
  LK_RETURN_IF_ERROR(s.Object("elastic", &elastic));
  if (elastic != nullptr) {
    LK_RETURN_IF_ERROR(ParseElastic(s.Child("elastic", *elastic), &spec->elastic));
  }
  LK_RETURN_IF_ERROR(s.Double("rejoin_timeout_seconds", &spec->rejoin_timeout_seconds, kPositive));
  LK_RETURN_IF_ERROR(
      s.Double("partition_timeout_seconds", &spec->partition_timeout_seconds, kPositive));
  const json* preemption = nullptr;
  LK_RETURN_IF_ERROR(s.Object("preemption", &preemption));
  if (preemption != nullptr) {
    LK_RETURN_IF_ERROR(ParsePreemption(s.Child("preemption", *preemption), spec));
  }
  const json* stragglers = nullptr;
  LK_RETURN_IF_ERROR(s.Object("stragglers", &stragglers));
  if (stragglers != nullptr) {
    LK_RETURN_IF_ERROR(ParseStragglers(s.Child("stragglers", *stragglers), &spec->stragglers));
  }
  if (s.Get("backend") != nullptr) {
    std::string name;
    LK_RETURN_IF_ERROR(s.String("backend", &name));
    std::optional<CommBackend> b = ParseCommBackend(name);
    if (!b)
      return s.Error("backend",
                     absl::StrCat("unknown backend '", name, "' (auto, gloo, shm, nccl)"));
    spec->backend = *b;
  }
  if (s.Get("device") != nullptr) {
    std::string name;
    LK_RETURN_IF_ERROR(s.String("device", &name));
    std::optional<DeviceKind> d = ParseDeviceKind(name);
    if (!d) return s.Error("device", absl::StrCat("unknown device '", name, "' (cpu, cuda)"));
    spec->device = *d;
  }
  LK_RETURN_IF_ERROR(s.Bool("tf32", &spec->tf32));
  LK_RETURN_IF_ERROR(s.Bool("overlap_dp_reduction", &spec->overlap_dp_reduction));
  const json* recompute = nullptr;
  LK_RETURN_IF_ERROR(s.Object("activation_checkpointing", &recompute));
  if (recompute != nullptr) {
    LK_RETURN_IF_ERROR(ParseActivationCheckpointing(s.Child("activation_checkpointing", *recompute),
                                                    &spec->activation_checkpointing));
  }
  if (spec->backend == CommBackend::kNccl && spec->device != DeviceKind::kCuda) {
    return s.Error("backend", "nccl needs latchkey.device \"cuda\" (this job runs on cpu)");
  }
  if (spec->device == DeviceKind::kCuda &&
      (spec->backend == CommBackend::kGloo || spec->backend == CommBackend::kShm)) {
    return s.Error("backend", absl::StrCat(CommBackendName(spec->backend),
                                           " takes cpu buffers only; latchkey.device \"cuda\" "
                                           "needs nccl (or auto)"));
  }
  return s.RefuseUnknown();
}

// The DeepSpeed keys (top level), then the cross-field rules (common/validate_job_spec.h).
absl::Status ParseTop(const json& root, const std::string& base_dir, JobSpec* spec) {
  JsonObjectReader top(root, "");
  const json* obj = nullptr;

  LK_RETURN_IF_ERROR(top.Require("model"));
  LK_RETURN_IF_ERROR(top.Object("model", &obj));
  LK_ASSIGN_OR_RETURN(spec->model, ModelConfigFromJson(*obj, ModelJsonFormat::kJobSpec));

  LK_RETURN_IF_ERROR(
      top.Int("train_micro_batch_size_per_gpu", &spec->micro_batch_size, AtLeast(1)));
  LK_RETURN_IF_ERROR(
      top.Int("gradient_accumulation_steps", &spec->gradient_accumulation_steps, AtLeast(1)));
  LK_RETURN_IF_ERROR(top.Double("gradient_clipping", &spec->gradient_clipping, kNonNegative));
  LK_RETURN_IF_ERROR(
      top.Bool("managed_gradient_accumulation", &spec->managed_gradient_accumulation));

  LK_RETURN_IF_ERROR(top.Object("zero_optimization", &obj));
  if (obj != nullptr) {
    JsonObjectReader z = top.Child("zero_optimization", *obj);
    LK_RETURN_IF_ERROR(z.Int("stage", &spec->zero_stage, AtLeast(0)));
    if (spec->zero_stage == 3) {
      return z.Error("stage", "ZeRO 3 is not supported (use 0, 1 or 2)");
    }
    if (spec->zero_stage > 3) {
      return z.Error("stage", absl::StrCat("unknown stage ", spec->zero_stage));
    }
    z.WarnUnknown(&spec->warnings);
  }
  LK_RETURN_IF_ERROR(top.Object("bf16", &obj));
  if (obj != nullptr) {
    JsonObjectReader b = top.Child("bf16", *obj);
    LK_RETURN_IF_ERROR(b.Bool("enabled", &spec->bf16));
    b.WarnUnknown(&spec->warnings);
  }
  LK_RETURN_IF_ERROR(top.Object("fp16", &obj));
  if (obj != nullptr) {
    JsonObjectReader f = top.Child("fp16", *obj);
    bool fp16 = false;
    LK_RETURN_IF_ERROR(f.Bool("enabled", &fp16));
    if (fp16) return f.Error("enabled", "fp16 is not supported (use bf16)");
    f.WarnUnknown(&spec->warnings);
  }
  LK_RETURN_IF_ERROR(top.Object("optimizer", &obj));
  if (obj != nullptr) {
    LK_RETURN_IF_ERROR(
        ParseOptimizer(top.Child("optimizer", *obj), &spec->optimizer, &spec->warnings));
  }
  LK_RETURN_IF_ERROR(top.Object("scheduler", &obj));
  if (obj != nullptr) {
    LK_RETURN_IF_ERROR(ParseScheduler(top.Child("scheduler", *obj), spec->optimizer.lr,
                                      &spec->scheduler, &spec->warnings));
  }
  LK_RETURN_IF_ERROR(top.Object("tensor_parallel", &obj));
  if (obj != nullptr) {
    JsonObjectReader t = top.Child("tensor_parallel", *obj);
    LK_RETURN_IF_ERROR(t.Int("autotp_size", &spec->tp, AtLeast(1)));
    const json* pc = t.Get("partition_config");
    spec->has_partition_config = pc != nullptr && !pc->is_null();
    LK_RETURN_IF_ERROR(t.Bool("sequence_parallel", &spec->sequence_parallel));
    t.WarnUnknown(&spec->warnings);
  }

  bool has_world_size = false;
  bool has_schedule = false;
  LK_RETURN_IF_ERROR(top.Require("latchkey"));
  LK_RETURN_IF_ERROR(top.Object("latchkey", &obj));
  LK_RETURN_IF_ERROR(
      ParseLatchkey(top.Child("latchkey", *obj), base_dir, spec, &has_world_size, &has_schedule));
  top.WarnUnknown(&spec->warnings);

  // Defaults that depend on other keys, and what a key means next to another.
  if (!has_world_size) spec->world_size = spec->tp;
  if (spec->managed_gradient_accumulation && has_schedule) {
    return Err("latchkey.window_schedule",
               "only valid with managed_gradient_accumulation: false (managed windows use "
               "gradient_accumulation_steps)");
  }
  if (spec->sequence_parallel && spec->tp == 1) {
    spec->warnings.push_back(
        "tensor_parallel.sequence_parallel: ignored with autotp_size 1 (nothing to shard over)");
    spec->sequence_parallel = false;
  }
  LK_RETURN_IF_ERROR(ValidateJobSpec(*spec));
  return ResolveMegatronData(spec);
}

}  // namespace

int ElasticDp(int min_dp, int max_dp, int tp, int workers, int64_t global_micro_batches) {
  if (tp < 1 || min_dp < 1) return 0;
  for (int dp = std::min(max_dp, workers / tp); dp >= min_dp; --dp) {
    if (global_micro_batches % dp == 0) return dp;
  }
  return 0;
}

int JobSpec::WindowLength(int64_t s) const {
  if (managed_gradient_accumulation || window_schedule.empty()) {
    return gradient_accumulation_steps;
  }
  const int64_t last = static_cast<int64_t>(window_schedule.size()) - 1;
  return window_schedule[static_cast<size_t>(std::min(std::max<int64_t>(s, 0), last))];
}

int64_t JobSpec::FirstMicroBatch(int64_t s) const {
  if (s <= 0) return 0;
  if (managed_gradient_accumulation || window_schedule.empty()) {
    return s * gradient_accumulation_steps;
  }
  const int64_t listed = static_cast<int64_t>(window_schedule.size());
  int64_t m = 0;
  for (int64_t i = 0; i < std::min(s, listed); ++i) m += window_schedule[i];
  if (s > listed) m += (s - listed) * window_schedule.back();  // the last length repeats
  return m;
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view json_text, const std::string& base_dir) {
  LK_ASSIGN_OR_RETURN(const json root, ParseJsonObject(json_text, "spec"));
  JobSpec spec;
  try {
    LK_RETURN_IF_ERROR(ParseTop(root, base_dir, &spec));
  } catch (const json::exception& e) {
    // The readers check types before every get<>(); this is a backstop, never a crash.
    return Err("spec", e.what());
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the job spec"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  return ParseJobSpec(text.str(), abs.parent_path().string());
}

}  // namespace latchkey
