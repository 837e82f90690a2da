#include "common/validate_job_spec.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/json_reader.h"
#include "common/status_macros.h"

namespace latchkey {
namespace {

absl::Status Err(const std::string& path, absl::string_view reason) {
  return FieldError(path, reason);
}

// latchkey.elastic against the layout: a smaller dp' must exist at all (whole replicas, the
// global batch kept by an integer GAS'), else the key could never act and is a mistake.
absl::Status CheckElastic(const JobSpec& spec) {
  if (!spec.elastic.enabled()) return absl::OkStatus();
  const int dp = spec.dp();
  if (spec.elastic.min_dp > dp) {
    return Err("latchkey.elastic.min_dp",
               absl::StrCat(spec.elastic.min_dp, " exceeds the spec's dp (", dp,
                            " = latchkey.world_size / tensor_parallel.autotp_size)"));
  }
  if (!spec.managed_gradient_accumulation) {
    return Err("latchkey.elastic",
               "needs managed windows (managed_gradient_accumulation: true): a "
               "latchkey.window_schedule cannot be rescaled to another dp");
  }
  const int64_t global = static_cast<int64_t>(spec.gradient_accumulation_steps) * dp;
  if (ElasticDp(spec.elastic.min_dp, dp - 1, spec.tp, spec.world_size, global) == 0) {
    return Err(
        "latchkey.elastic",
        absl::StrCat("min_dp ", spec.elastic.min_dp, " admits no dp' in [", spec.elastic.min_dp,
                     ", ", dp - 1, "] for which gradient_accumulation_steps * dp (",
                     spec.gradient_accumulation_steps, " * ", dp,
                     ") / dp' is an integer: the job could never shrink"));
  }
  return absl::OkStatus();
}

// latchkey.stragglers.rebalance: replicas run different numbers of micro-batches, so nothing but
// the boundary micro-batch may reduce over DP (every replica must issue the same collectives).
absl::Status CheckRebalance(const JobSpec& spec) {
  if (!spec.stragglers.rebalance) return absl::OkStatus();
  for (size_t i = 0; i + 1 < spec.no_sync.size(); ++i) {
    if (!spec.no_sync[i]) {
      return Err("latchkey.stragglers.rebalance",
                 absl::StrCat("latchkey.no_sync[", i,
                              "] is false: a mid-window DP reduction cannot be kept when replicas "
                              "run different numbers of micro-batches (leave no_sync out, or "
                              "rebalance off)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  LK_RETURN_IF_ERROR(ValidateModelForTp(spec.model, spec.tp, spec.has_partition_config));
  if (spec.seq_len > spec.model.n_positions) {
    return Err("latchkey.seq_len", absl::StrCat(spec.seq_len, " exceeds model.n_positions (",
                                                spec.model.n_positions, ")"));
  }
  if (spec.overlap_dp_reduction && spec.zero_stage == 0) {
    return Err("latchkey.overlap_dp_reduction",
               "needs zero_optimization.stage 1 (stage 2 always overlaps its reduction with the "
               "backward; stage 0's mean all-reduce is not bucketed)");
  }
  if (spec.sequence_parallel && spec.seq_len % spec.tp != 0) {
    return Err("tensor_parallel.sequence_parallel",
               absl::StrCat("latchkey.seq_len (", spec.seq_len,
                            ") must be divisible by tensor_parallel.autotp_size (", spec.tp, ")"));
  }
  if (spec.world_size % spec.tp != 0) {
    return Err("latchkey.world_size",
               absl::StrCat(spec.world_size, " is not divisible by tensor_parallel.autotp_size (",
                            spec.tp, ")"));
  }
  if (!spec.no_sync.empty()) {
    if (!spec.managed_gradient_accumulation) {
      return Err("latchkey.no_sync", "only valid with managed windows (one mask for every window)");
    }
    if (static_cast<int>(spec.no_sync.size()) != spec.gradient_accumulation_steps) {
      return Err("latchkey.no_sync", absl::StrCat("has ", spec.no_sync.size(),
                                                  " entries; gradient_accumulation_steps is ",
                                                  spec.gradient_accumulation_steps));
    }
    if (spec.no_sync.back()) {
      return Err(absl::StrCat("latchkey.no_sync[", spec.no_sync.size() - 1, "]"),
                 "the boundary micro-batch always synchronizes and cannot be no_sync");
    }
  }
  if (!spec.managed_gradient_accumulation && spec.window_schedule.empty()) {
    return Err("latchkey.window_schedule",
               "a non-empty schedule is required when managed_gradient_accumulation is false");
  }
  LK_RETURN_IF_ERROR(CheckRebalance(spec));
  return CheckElastic(spec);
}

absl::Status ValidateModelForTp(const ModelConfig& model, int tp, bool has_partition_config) {
  if (tp < 1) return Err("tensor_parallel.autotp_size", absl::StrCat("must be >= 1, got ", tp));
  if (model.n_head < 1)
    return Err("model.n_head", absl::StrCat("must be >= 1, got ", model.n_head));
  if (model.n_embd < 1)
    return Err("model.n_embd", absl::StrCat("must be >= 1, got ", model.n_embd));
  if (model.n_embd % model.n_head != 0) {
    return Err("model.n_embd", absl::StrCat(model.n_embd, " is not divisible by model.n_head (",
                                            model.n_head, ")"));
  }
  if (tp > model.n_head) {
    return Err("tensor_parallel.autotp_size",
               absl::StrCat(tp, " exceeds model.n_head (", model.n_head, ")"));
  }
  if (model.n_head % tp != 0) {
    return Err("tensor_parallel.autotp_size",
               absl::StrCat(tp, " does not divide model.n_head (", model.n_head, ")"));
  }
  if (model.inner() % tp != 0) {
    return Err("tensor_parallel.autotp_size",
               absl::StrCat(tp, " does not divide model.n_inner (", model.inner(), ")"));
  }
  if (has_partition_config && model.multi_query) {
    return Err("tensor_parallel.partition_config",
               "not supported for a multi_query model (its single K/V head is replicated; "
               "latchkey shards MQA itself)");
  }
  return absl::OkStatus();
}

}  // namespace latchkey
