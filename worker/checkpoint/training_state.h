// The training state of one rank, as one view: what a checkpoint saves and restores, and the
// layout that says which part of the model this rank holds. The engine (worker/train/engine.h)
// owns the state and keeps this view current; the checkpoint module (checkpointer.h) reads and
// replaces the state only through it, so the checkpoint format can change without a change to
// the engine's training code (torchtitan's Stateful objects behind components/checkpoint.py).
//
// This is the one header of worker/checkpoint/ that worker/train/ includes.
//
// Ownership: the view owns nothing but `master` (a handle sharing the engine's buffer) and
// `position`; every pointer is the engine's and lives as long as the engine. Code holding the
// view may replace the values in the buffers (in place, never reallocating them), the
// optimizer's state, the generators' states and the position.
// Thread-safety: one thread, the engine's.
#ifndef LATCHKEY_WORKER_CHECKPOINT_TRAINING_STATE_H_
#define LATCHKEY_WORKER_CHECKPOINT_TRAINING_STATE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "common/job_spec.h"

namespace latchkey {

class FlatOps;
class GptBigCode;
class Optimizer;
class ParamStore;
namespace comm {
struct ProcessGroups;
}  // namespace comm

// Where the data stream stands: the window last run (or restored) and what comes after it.
struct DataPosition {
  int64_t step = -1;                   // the window last run; -1 before the first
  int64_t latch_generation = 0;        // of latch(step)
  int64_t next_first_micro_batch = 0;  // M of window step + 1
  int64_t next_first_sample = 0;       // global stream positions consumed through window step
};

struct TrainingState {
  // The job: the model, zero_stage, bf16 and the optimizer's type.
  const JobSpec* spec = nullptr;
  // The layout: this rank's global, TP and DP ranks and sizes, and the groups collectives over
  // the state run in.
  comm::ProcessGroups* groups = nullptr;
  // Every number in the state's buffers is computed through these ops (flat_ops.h).
  const FlatOps* ops = nullptr;
  // The parameters: the flat fp32 buffer (fp32 mode) or the flat bf16 compute copy (bf16 mode),
  // the gradients, the parameter table (layout()) and the device every buffer lives on.
  ParamStore* params = nullptr;
  // The dropout generators (replicated over TP, and this rank's own).
  GptBigCode* model = nullptr;
  // The optimizer's state tensors and step count, over [part_begin, part_end).
  Optimizer* optimizer = nullptr;
  // bf16 mode: the fp32 master of [part_begin, part_end); undefined in fp32 mode.
  at::Tensor master;
  // The ZeRO partition: the range of the flat buffers this rank's optimizer (and master) holds;
  // ZeRO-1 or 2 over DP > 1: its 1/dp chunk of the padded buffer, otherwise [0, numel).
  int64_t part_begin = 0;
  int64_t part_end = 0;
  bool zero1 = false;  // the optimizer state is partitioned (ZeRO-1 or 2 over DP > 1)
  // ZeRO-2 over DP > 1: the fp32 gradient partition over [part_begin, part_end) (ParamStore keeps
  // no full gradient buffer then); undefined otherwise.
  at::Tensor grads_part;
  DataPosition position;

  bool bf16() const { return master.defined(); }
  int64_t part_numel() const { return part_end - part_begin; }
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_TRAINING_STATE_H_
