#include "worker/train/step_jsonl.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace latchkey {
namespace {

// A measured value: null when it is not finite (JSON has no NaN or Inf).
nlohmann::ordered_json Measure(double v) {
  if (!std::isfinite(v)) return nullptr;
  return v;
}

}  // namespace

std::string StepReportJson(int rank, const StepReport& r) {
  nlohmann::ordered_json j;
  j["rank"] = rank;
  j["step"] = r.step;
  j["micro_batches"] = r.micro_batches;
  j["replica_micro_batches"] = r.replica_micro_batches;
  j["loss"] = Measure(r.loss);
  j["grad_norm"] = Measure(r.grad_norm);
  j["kv_mode"] = KvModeName(r.kv_mode);
  j["kv_allreduce_calls"] = r.kv_allreduce_calls;
  j["replicated_allreduce_calls"] = r.replicated_allreduce_calls;
  nlohmann::ordered_json calls = nlohmann::ordered_json::object();
  for (const auto& [key, n] : r.collective_calls) calls[key] = n;
  j["collective_calls"] = calls;
  j["step_seconds"] = r.step_seconds;
  j["compute_seconds"] = r.compute_seconds;
  j["micro_batch_seconds"] = r.micro_batch_seconds;
  j["tokens"] = r.tokens;
  j["tokens_per_second"] = TokensPerSecond(r);
  j["collective_share"] = CollectiveShare(r);
  j["optimizer_state_bytes"] = r.optimizer_state_bytes;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["activation_memory_bytes"] = r.activation_memory_bytes;
  // The CUDA caching allocator's; a CPU rank reserves nothing beyond what it allocates.
  if (r.reserved_memory_bytes > 0) j["reserved_memory_bytes"] = r.reserved_memory_bytes;
  j["latch_wait_seconds"] = r.latch_wait_seconds;
  j["lr"] = r.lr;
  if (r.eval_loss) j["eval_loss"] = Measure(*r.eval_loss);
  if (r.checkpoint_seconds) j["checkpoint_seconds"] = *r.checkpoint_seconds;
  if (r.checkpoint_background_seconds) {
    j["checkpoint_background_seconds"] = *r.checkpoint_background_seconds;
  }
  return j.dump();
}

}  // namespace latchkey
