// The JSON-facing side of the job spec: policy/mode names, the canonical serialization that the
// coordinator stores and serves, and field-wise equality.
#include <tuple>

#include "common/job_spec.h"
#include "common/job_spec_data.h"
#include "nlohmann/json.hpp"

namespace latchkey {

const char* KvReducePolicyName(KvReducePolicy p) {
  switch (p) {
    case KvReducePolicy::kAuto:
      return "auto";
    case KvReducePolicy::kPerMicroBatch:
      return "per_micro_batch";
    case KvReducePolicy::kDeferred:
      return "deferred";
    case KvReducePolicy::kCoalesced:
      return "coalesced";
  }
  return "unknown";
}

const char* KvModeName(KvMode m) {
  switch (m) {
    case KvMode::kPerMicroBatch:
      return "per_micro_batch";
    case KvMode::kDeferred:
      return "deferred";
    case KvMode::kCoalesced:
      return "coalesced";
  }
  return "unknown";
}

std::optional<KvReducePolicy> ParseKvReducePolicy(absl::string_view name) {
  for (KvReducePolicy p : {KvReducePolicy::kAuto, KvReducePolicy::kPerMicroBatch,
                           KvReducePolicy::kDeferred, KvReducePolicy::kCoalesced}) {
    if (name == KvReducePolicyName(p)) return p;
  }
  return std::nullopt;
}

const char* RecomputeModeName(RecomputeMode m) {
  switch (m) {
    case RecomputeMode::kNone:
      return "none";
    case RecomputeMode::kSelective:
      return "selective";
    case RecomputeMode::kFull:
      return "full";
  }
  return "unknown";
}

std::optional<RecomputeMode> ParseRecomputeMode(absl::string_view name) {
  for (RecomputeMode m : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    if (name == RecomputeModeName(m)) return m;
  }
  return std::nullopt;
}

std::optional<KvMode> ParseKvMode(absl::string_view name) {
  for (KvMode m : {KvMode::kPerMicroBatch, KvMode::kDeferred, KvMode::kCoalesced}) {
    if (name == KvModeName(m)) return m;
  }
  return std::nullopt;
}

const char* SchedulerTypeName(SchedulerType t) {
  switch (t) {
    case SchedulerType::kNone:
      return "none";
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "unknown";
}

const char* WarmupTypeName(WarmupType t) { return t == WarmupType::kLinear ? "linear" : "log"; }

namespace {

const char* DtypeName(TokenDtype d) { return d == TokenDtype::kUint32 ? "uint32" : "uint16"; }

// The `scheduler` block with every parameter of its type explicit.
nlohmann::json SchedulerJson(const SchedulerConfig& c) {
  nlohmann::json params = {{"warmup_num_steps", c.warmup_num_steps},
                           {"warmup_type", WarmupTypeName(c.warmup_type)}};
  if (c.type == SchedulerType::kWarmupCosineLR) {
    params["warmup_min_ratio"] = c.warmup_min_ratio;
    params["cos_min_ratio"] = c.cos_min_ratio;
  } else {
    params["warmup_min_lr"] = c.warmup_min_lr;
    params["warmup_max_lr"] = c.warmup_max_lr;
  }
  if (c.type != SchedulerType::kWarmupLR) params["total_num_steps"] = c.total_num_steps;
  return {{"type", SchedulerTypeName(c.type)}, {"params", params}};
}

}  // namespace

std::string JobSpecToJson(const JobSpec& spec) {
  using json = nlohmann::json;
  const json model = ModelConfigToJson(spec.model, ModelJsonFormat::kJobSpec);

  const OptimizerConfig& o = spec.optimizer;
  json optimizer;
  if (o.type == OptimizerType::kSgd) {
    optimizer = {{"type", "SGD"}, {"params", {{"lr", o.lr}, {"momentum", o.momentum}}}};
  } else {
    optimizer = {{"type", "AdamW"},
                 {"params",
                  {{"lr", o.lr},
                   {"betas", {o.betas[0], o.betas[1]}},
                   {"eps", o.eps},
                   {"weight_decay", o.weight_decay}}}};
  }

  json tensor_parallel = {{"autotp_size", spec.tp}};
  if (spec.has_partition_config) tensor_parallel["partition_config"] = json::object();
  tensor_parallel["sequence_parallel"] = spec.sequence_parallel;

  json data = {{"dtype", DtypeName(spec.data.dtype)}};
  if (spec.data.format == DataFormat::kMegatron) {
    data = MegatronDataToJson(spec.data);
  } else if (spec.data.synthetic_seed) {
    data["synthetic"] = {{"seed", *spec.data.synthetic_seed}};
  } else {
    data["tokens_file"] = spec.data.tokens_file;
  }
  json latchkey = {{"seq_len", spec.seq_len},
                   {"steps", spec.steps},
                   {"seed", spec.seed},
                   {"world_size", spec.world_size},
                   {"kv_reduce", KvReducePolicyName(spec.kv_reduce)},
                   {"data", data}};
  // A schedule is only accepted for unmanaged windows.
  if (!spec.managed_gradient_accumulation) latchkey["window_schedule"] = spec.window_schedule;
  if (!spec.init_from.empty()) latchkey["init_from"] = spec.init_from;
  if (!spec.no_sync.empty()) latchkey["no_sync"] = spec.no_sync;
  if (spec.eval.enabled()) {
    latchkey["eval"] = {{"every_steps", spec.eval.every_steps}, {"samples", spec.eval.samples}};
    if (!spec.eval.split.empty()) {
      latchkey["eval"]["split"] = spec.eval.split;
    } else {
      latchkey["eval"]["tokens_file"] = spec.eval.tokens_file;
      latchkey["eval"]["dtype"] = DtypeName(spec.eval.dtype);
    }
  }
  if (spec.checkpoint.enabled()) {
    latchkey["checkpoint"] = {{"dir", spec.checkpoint.dir},
                              {"every_steps", spec.checkpoint.every_steps},
                              {"keep", spec.checkpoint.keep},
                              {"async", spec.checkpoint.async}};
  }
  if (spec.tensorboard.enabled()) latchkey["tensorboard"] = {{"dir", spec.tensorboard.dir}};
  latchkey["max_restarts"] = spec.max_restarts;
  latchkey["hang_timeout_seconds"] = spec.hang_timeout_seconds;
  if (spec.elastic.enabled()) latchkey["elastic"] = {{"min_dp", spec.elastic.min_dp}};
  if (spec.rejoin_timeout_seconds > 0) {
    latchkey["rejoin_timeout_seconds"] = spec.rejoin_timeout_seconds;
  }
  if (spec.partition_timeout_seconds != JobSpec().partition_timeout_seconds) {
    latchkey["partition_timeout_seconds"] = spec.partition_timeout_seconds;
  }
  if (spec.preemption_grace_seconds != JobSpec().preemption_grace_seconds) {
    latchkey["preemption"] = {{"grace_seconds", spec.preemption_grace_seconds}};
  }
  latchkey["stragglers"] = {{"rebalance", spec.stragglers.rebalance},
                            {"threshold", spec.stragglers.threshold},
                            {"windows", spec.stragglers.windows},
                            {"sample_steps", spec.stragglers.sample_steps}};
  latchkey["backend"] = CommBackendName(spec.backend);
  latchkey["device"] = DeviceKindName(spec.device);
  latchkey["tf32"] = spec.tf32;
  latchkey["overlap_dp_reduction"] = spec.overlap_dp_reduction;
  latchkey["activation_checkpointing"] = {
      {"mode", RecomputeModeName(spec.activation_checkpointing.mode)},
      {"every_layers", spec.activation_checkpointing.every_layers}};

  json root = {{"model", model},
               {"train_micro_batch_size_per_gpu", spec.micro_batch_size},
               {"gradient_accumulation_steps", spec.gradient_accumulation_steps},
               {"gradient_clipping", spec.gradient_clipping},
               {"zero_optimization", {{"stage", spec.zero_stage}}},
               {"bf16", {{"enabled", spec.bf16}}},
               {"optimizer", optimizer},
               {"tensor_parallel", tensor_parallel},
               {"managed_gradient_accumulation", spec.managed_gradient_accumulation},
               {"latchkey", latchkey}};
  if (spec.scheduler.type != SchedulerType::kNone)
    root["scheduler"] = SchedulerJson(spec.scheduler);
  return root.dump();
}

bool operator==(const OptimizerConfig& a, const OptimizerConfig& b) {
  auto t = [](const OptimizerConfig& o) {
    return std::tie(o.type, o.lr, o.momentum, o.betas, o.eps, o.weight_decay);
  };
  return t(a) == t(b);
}

bool operator==(const MegatronBlendEntry& a, const MegatronBlendEntry& b) {
  return a.weight == b.weight && a.path_prefix == b.path_prefix;
}

bool operator==(const DataConfig& a, const DataConfig& b) {
  auto t = [](const DataConfig& d) {
    return std::tie(d.format, d.tokens_file, d.dtype, d.synthetic_seed, d.path_prefix, d.blend,
                    d.split, d.megatron_seed, d.cache_dir, d.num_samples);
  };
  return t(a) == t(b);
}

bool operator==(const SchedulerConfig& a, const SchedulerConfig& b) {
  auto t = [](const SchedulerConfig& c) {
    return std::tie(c.type, c.warmup_type, c.warmup_num_steps, c.warmup_min_lr, c.warmup_max_lr,
                    c.total_num_steps, c.warmup_min_ratio, c.cos_min_ratio);
  };
  return t(a) == t(b);
}

bool operator==(const EvalConfig& a, const EvalConfig& b) {
  auto t = [](const EvalConfig& e) {
    return std::tie(e.tokens_file, e.dtype, e.split, e.every_steps, e.samples);
  };
  return t(a) == t(b);
}

bool operator==(const CheckpointConfig& a, const CheckpointConfig& b) {
  return std::tie(a.dir, a.every_steps, a.keep, a.async) ==
         std::tie(b.dir, b.every_steps, b.keep, b.async);
}

bool operator==(const ElasticConfig& a, const ElasticConfig& b) { return a.min_dp == b.min_dp; }

bool operator==(const TensorboardConfig& a, const TensorboardConfig& b) { return a.dir == b.dir; }

bool operator==(const StragglerConfig& a, const StragglerConfig& b) {
  return std::tie(a.rebalance, a.threshold, a.windows, a.sample_steps) ==
         std::tie(b.rebalance, b.threshold, b.windows, b.sample_steps);
}

bool operator==(const ActivationCheckpointingConfig& a, const ActivationCheckpointingConfig& b) {
  return a.mode == b.mode && a.every_layers == b.every_layers;
}

bool operator==(const JobSpec& a, const JobSpec& b) {
  auto t = [](const JobSpec& s) {
    return std::tie(s.model, s.micro_batch_size, s.gradient_accumulation_steps, s.gradient_clipping,
                    s.zero_stage, s.bf16, s.optimizer, s.scheduler, s.tp, s.has_partition_config,
                    s.sequence_parallel, s.managed_gradient_accumulation, s.window_schedule,
                    s.no_sync, s.seq_len, s.steps, s.seed, s.world_size, s.kv_reduce, s.data,
                    s.eval, s.init_from, s.checkpoint, s.tensorboard, s.max_restarts,
                    s.hang_timeout_seconds, s.elastic, s.rejoin_timeout_seconds,
                    s.partition_timeout_seconds, s.preemption_grace_seconds, s.stragglers,
                    s.backend, s.device, s.tf32, s.activation_checkpointing, s.overlap_dp_reduction,
                    s.warnings);
  };
  return t(a) == t(b);
}

}  // namespace latchkey
