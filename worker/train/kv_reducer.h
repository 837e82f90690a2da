// KvReducer: sums the replicated K/V gradient rows of an MQA model over the TP group, and under
// sequence parallelism the other replicated gradients that are partial per TP rank (LayerNorm
// weights and biases, the row-parallel biases: FlatSegment::sequence_parallel_partial), in the
// same reduction, mode and collectives.
//
// Every TP rank holds the whole K/V block but computes its gradient only through its own query
// heads, so the K/V gradient is partial and must be summed over TP. Modes (docs/model.md):
//  - per_micro_batch: after each backward, one all-reduce per K/V tensor (2 per layer);
//  - deferred: once at the boundary, one all-reduce per K/V tensor (2 per layer per step);
//  - coalesced: once at the boundary, every K/V row staged into one buffer (1 per step).
// Under sequence parallelism "per tensor" also means one collective per partial replicated
// tensor (6 per layer and 2 for ln_f), and the coalesced buffer carries them beside the K/V rows.
// Tags: a collective that carries K/V rows is tagged comm::kKvTag; one that carries only
// sequence-parallel rows kReplicatedTag; ReplicatedCalls counts both.
// A sum is not idempotent, so every reduction sums only what was added since the previous one
// (grad - snapshot): a reentrant boundary reduces only new rows, and with nothing added
// (no NoteBackward since the last reduction) it issues no collective at all. Whether anything was
// added is decided from the backward count, identical on every rank, never from the values.
//
// On a ZeRO-2 gradient partition (ForPartition) the reducer works on the partition buffer: each
// K/V tensor becomes the piece of it the partition holds, which is the same on every TP rank
// (every TP rank's flat layout and partition are the same), so the TP sum of the pieces is the
// TP sum of the DP-reduced K/V gradient (the sums commute). The count is kept: a piece the
// partition does not hold travels as one zero element (deferred: one collective per K/V tensor;
// coalesced: one, even when the partition holds no K/V row), so every rank issues the planned
// number of K/V collectives in the same order.
//
// Usage per window: BeginWindow(); { backward; NoteBackward(); [ReducePending(per_tensor)] }*;
// ReducePending(mode) at the boundary; after a DP reduction call OnGradsReplaced().
// The staging and snapshot buffers live on the gradients' device and every arithmetic step goes
// through FlatOps (PackDelta / UnpackDelta / Pack); the collectives get device-tagged buffers.
// Thread-safety: one thread. Lifetime: `tp` and `ops` outlive the reducer.
#ifndef LATCHKEY_WORKER_TRAIN_KV_REDUCER_H_
#define LATCHKEY_WORKER_TRAIN_KV_REDUCER_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "worker/comm/comm.h"
#include "worker/model/tp_layout.h"
#include "worker/train/flat_ops.h"

namespace latchkey {

// The tag of a reduction that carries only sequence-parallel replicated rows (no K/V).
inline constexpr const char* kReplicatedTag = "replicated";

// Every TP reduction of replicated-parameter gradients `stats` has counted (K/V and SP's).
int64_t ReplicatedCalls(const comm::CollectiveStats& stats);

// Whether segment `s` holds a gradient that is partial per TP rank and summed over TP by the
// reducer: the K/V rows of an MQA model, and under sequence parallelism the LayerNorm and
// row-parallel bias rows.
inline bool ReducedOverTp(const FlatSegment& s, bool sequence_parallel) {
  return s.kv || (sequence_parallel && s.sequence_parallel_partial);
}

class KvReducer {
 public:
  // `segments`: the whole ParamStore segment list; only those with kv=true are used, and with
  // `sequence_parallel` those with sequence_parallel_partial=true as well (ReducedOverTp). The
  // gradients later passed in are on ops->device().
  KvReducer(const std::vector<FlatSegment>& segments, comm::Group* tp, const FlatOps* ops,
            bool sequence_parallel = false);
  // The reducer of the same rows inside the partition [begin, end) of the flat buffer, for a
  // buffer holding only that partition (offset 0 = flat element `begin`); keeps the count (above).
  static KvReducer ForPartition(const std::vector<FlatSegment>& segments, int64_t begin,
                                int64_t end, comm::Group* tp, const FlatOps* ops,
                                bool sequence_parallel = false);

  // True when there is anything to reduce at all (MQA model or sequence parallelism, and a
  // parallel TP group).
  bool active() const { return active_; }
  int64_t kv_elements() const { return total_; }  // every reduced row, K/V and SP's
  // The bytes of the snapshot and the staging while they exist (between the first reduction
  // and Release).
  int64_t buffer_bytes() const {
    return snapshot_.defined() ? (snapshot_.numel() + stage_.numel()) * 4 : 0;
  }

  void BeginWindow();
  // The gradient buffer this reducer sums in is gone (ZeRO-2 released it): frees the snapshot
  // and the staging, which the next reduction allocates again (zeroed), and starts over as
  // BeginWindow does. Nothing is held between reductions that need no snapshot.
  void Release();
  void NoteBackward() { ++pending_backwards_; }
  int pending_backwards() const { return pending_backwards_; }

  // Sums (grad - snapshot) of every K/V row over TP and adds it back; `coalesced` picks one
  // collective for all rows instead of one per tensor. No-op (no collective) when inactive or
  // when nothing was added since the previous reduction.
  // `grads`: the whole flat fp32 gradient buffer.
  absl::Status ReducePending(const at::Tensor& grads, bool coalesced);

  // Per-micro-batch sum of `staged`, a buffer holding only what one backward added to the K/V
  // rows (ZeRO-2's K/V staging), one collective per K/V tensor over its stretch `spans[j]` of
  // the buffer (zeros where a stretch has slot padding), in place, without a snapshot. No-op when
  // inactive or disabled. REQUIRES: one span per K/V tensor.
  absl::Status ReduceFresh(const at::Tensor& staged, const std::vector<FlatRange>& spans);

  // The gradient buffer was changed by something other than a backward (a DP mean): the K/V
  // rows must be fully reduced (nothing pending) or untouched since BeginWindow.
  // FAILED_PRECONDITION on a partially reduced window, which the engine never produces.
  absl::Status OnGradsReplaced(const at::Tensor& grads);

  // Test-only switch: when disabled, ReducePending does nothing (proves the parity tests catch
  // a missing reduction).
  void set_enabled_for_testing(bool enabled) { enabled_ = enabled; }

 private:
  KvReducer(std::vector<FlatRange> kv, std::vector<bool> carries_kv, comm::Group* tp,
            const FlatOps* ops, bool keep_count);
  void Allocate();
  void EnsureBuffers();  // the snapshot and the staging, zeroed, on first use

  // In flat order: the K/V rows, and SP's partial rows under SP; one per tensor; empty ranges
  // only when keep_count_.
  std::vector<FlatRange> kv_;
  std::vector<bool> carries_kv_;  // per entry of kv_: a K/V range (else sequence-parallel)
  comm::Group* tp_;
  bool keep_count_ = false;
  const FlatOps* ops_;
  bool active_ = false;
  bool enabled_ = true;
  int64_t total_ = 0;
  int pending_backwards_ = 0;
  bool reduced_in_window_ = false;
  // Allocated on the first reduction (EnsureBuffers), freed by Release.
  at::Tensor snapshot_;  // the K/V rows right after the previous reduction, back to back
  at::Tensor stage_;     // contiguous staging of (grad - snapshot)
  at::Tensor dummy_;     // keep_count_: the zero element an empty piece travels as
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_KV_REDUCER_H_
