// The per-step JSONL record of docs/observability.md.
#ifndef LATCHKEY_WORKER_TRAIN_STEP_JSONL_H_
#define LATCHKEY_WORKER_TRAIN_STEP_JSONL_H_

#include <string>

#include "worker/train/engine.h"

namespace latchkey {

// One JSON object (no trailing newline) with the fields rank, step, micro_batches, loss,
// grad_norm, kv_mode, kv_allreduce_calls, replicated_allreduce_calls, collective_calls,
// step_seconds, tokens, tokens_per_second, collective_share, optimizer_state_bytes,
// peak_memory_bytes, activation_memory_bytes, reserved_memory_bytes on CUDA (when the caching
// allocator reserved any), latch_wait_seconds, lr, eval_loss on the steps where evaluation ran,
// checkpoint_seconds on the steps that saved a resumable checkpoint, and
// checkpoint_background_seconds on the steps at whose boundary an asynchronous save committed.
// A loss, grad_norm or eval_loss that is not finite (a diverged step, StepDiverged) is null:
// JSON has no NaN or Inf.
std::string StepReportJson(int rank, const StepReport& r);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_STEP_JSONL_H_
