// GradSync: the data-parallel gradient synchronisation of one accumulation window, one strategy
// per ZeRO stage, after Megatron-Core's DistributedDataParallel (no_sync / start_grad_sync /
// finish_grad_sync, its bucket groups choosing all-reduce or reduce-scatter). The engine
// (engine.h) runs a window as three stages and nothing else: the micro-batches (each backward
// between BeforeBackward and AfterBackward), the boundary reduction (Finish), the optimizer
// step on partition(). Every strategy owns the replicated rows' TP sum (KvReducer, kv_reducer.h)
// and runs it the same way: after each backward (latch kv_mode per_micro_batch), or once at the
// boundary before the global norm (deferred / coalesced).
//
// Strategies and their collectives per window of n micro-batches (k of them synchronised: the
// last, and those the latch's no_sync mask leaves false; the K/V collectives are KvReducer's):
//  - MeanAllReduce (ZeRO-0, and every stage over DP 1): an all_reduce/dp of the accumulated
//    gradient, then scaled by 1/dp, after each synchronised micro-batch but the last (DDP
//    semantics, idempotent); at the boundary one all_reduce/dp of the gradient with this rank's
//    mean loss in the spare slot, and under TP > 1 one all_reduce/tp of {norm^2, loss flag}.
//  - ReduceScatter (ZeRO-1 over DP > 1): the same mean all-reduces before the last micro-batch;
//    at the boundary one reduce_scatter/dp of the whole buffer in place into this rank's
//    partition, or with `overlap` one per bucket (grad_buckets.h) issued during the last
//    backward, the K/V bucket after the boundary K/V sum; then one all_reduce/world of
//    {norm^2, loss}.
//  - Partition (ZeRO-2 over DP > 1): per synchronised micro-batch one reduce_scatter/dp per
//    bucket issued during its backward, summed into this rank's gradient partition (no_sync
//    micro-batches accumulate into the local full gradient, attached for them and folded into
//    the next synchronised reduce-scatter); at the boundary one all_reduce/world of
//    {norm^2, loss}, the deferred / coalesced K/V sum on the partition.
//
// Micro-batch counts: every count comes from the window (BeginWindow's latch: n and no_sync);
// nothing is cached across windows or shared between replicas. What the collectives need is
// that every DP replica issues the same collectives in the same order: under ZeRO-0 and 1 the
// same number of synchronised micro-batches before the last, under ZeRO-2 the same number of
// synchronised micro-batches (the same bucket plan each), and one boundary per window. The 1/dp
// mean and the loss mean over DP weigh every replica alike, which is exact while each replica
// scales its backward by its own 1/n (the engine's loss / n) and all replicas run the same n; a
// window whose replicas run different counts must weigh them by their shares of the samples.
//
// Thread contract: one thread, the engine's. GradBuckets' hooks (Partition, overlapped
// ReduceScatter) run on the autograd thread of a backward the engine's thread waits on, between
// BeforeBackward and AfterBackward; nothing else touches the object meanwhile.
// Errors: a collective failing outside autograd comes back as a Status; inside a hook it throws
// comm::CollectiveError (grad_buckets.h). Lifetime: everything GradSyncEnv points at outlives
// the object.
#ifndef LATCHKEY_WORKER_TRAIN_GRAD_SYNC_H_
#define LATCHKEY_WORKER_TRAIN_GRAD_SYNC_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "worker/comm/process_groups.h"
#include "worker/train/flat_ops.h"
#include "worker/train/kv_reducer.h"

namespace latchkey {

class ParamStore;
struct TrainingState;

enum class GradSyncKind { kMeanAllReduce, kReduceScatter, kPartition };

// The one place a job's strategy is chosen: ZeRO-1 and 2 only over a parallel DP group.
// `overlap` (ZeRO-1's bucketed reduce-scatter) is true only for kReduceScatter.
struct GradSyncPlan {
  GradSyncKind kind = GradSyncKind::kMeanAllReduce;
  bool overlap = false;
  // The optimizer state (and, for kPartition, the gradient) is partitioned over DP.
  bool partitioned() const { return kind != GradSyncKind::kMeanAllReduce; }
};
GradSyncPlan PlanGradSync(const JobSpec& spec, const comm::ProcessGroups& groups,
                          bool overlap_option);

// What a strategy works on; the engine owns all of it.
struct GradSyncEnv {
  const JobSpec* spec = nullptr;
  comm::ProcessGroups* groups = nullptr;
  ParamStore* store = nullptr;  // after EnableBf16Compute and TakeMaster
  const FlatOps* ops = nullptr;
  TrainingState* state = nullptr;  // its partition [part_begin, part_end) set
  c10::Device device = c10::Device(c10::kCPU);
  bool skip_kv_reduction_for_testing = false;
};

class GradSync {
 public:
  using Clock = std::chrono::steady_clock;
  // The boundary's outcome: this rank's share summed into the global squared gradient norm (the
  // same on every rank) and the window's loss, the mean over DP of the ranks' mean losses.
  struct Result {
    double norm_sq = 0.0;
    double loss = 0.0;
  };

  virtual ~GradSync() = default;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Starts window `latch` (n micro-batches, its no_sync mask and K/V mode): zeroes the gradient
  // and the window's measurements. REQUIRES: a valid latch (n >= 1, n mask entries; the engine
  // checks it).
  void BeginWindow(const Latch& latch);
  // Around the backward of micro-batch m (0 <= m < n, in order).
  virtual void BeforeBackward(int m) = 0;
  virtual absl::Status AfterBackward(int m) = 0;
  // The boundary reduction after the last micro-batch, after Megatron-Core's
  // finalize_model_grads: the deferred K/V sum over TP -> the DP reduction -> the global norm.
  // `loss` is this rank's mean loss. Non-finite values come back alike on every rank.
  virtual absl::StatusOr<Result> Finish(double loss) = 0;
  // After Finish: this rank's DP-mean gradient over [part_begin, part_end), fp32.
  virtual at::Tensor partition() const = 0;

  // Of the window running (or last run): the first boundary collective's wait (the straggler
  // measure; -1 before it), the gradient bytes' high-water mark (engine.h), the bucket issue
  // times of the last bucketed backward (empty when not bucketed).
  double boundary_wait() const { return boundary_wait_; }
  virtual int64_t peak_gradient_bytes() const { return grad_peak_; }
  virtual std::vector<Clock::time_point> bucket_issue_times() const { return {}; }

 protected:
  explicit GradSync(const GradSyncEnv& env);

  virtual void OnBeginWindow() {}
  bool last(int m) const { return m == latch_.n - 1; }
  bool synchronised(int m) const { return last(m) || !latch_.no_sync[m]; }
  bool per_micro_batch() const { return latch_.kv_mode == KvMode::kPerMicroBatch; }

  // After a backward into the attached local gradient: bf16's fold into fp32, the
  // per-micro-batch K/V sum, the high-water mark.
  absl::Status AccumulateLocal();
  // The DDP mean of the accumulated gradient after a synchronised micro-batch but the last.
  absl::Status MeanOfAccumulated();
  // The boundary K/V sum (deferred / coalesced) of `kv` on `grads`; no-op per micro-batch.
  absl::Status ReduceKvAtBoundary(KvReducer& kv, const at::Tensor& grads);
  // Sums n host doubles over `group` through a buffer on the training device.
  absl::Status SumScalars(comm::Group* group, double* values, int64_t n);
  absl::Status DpMeanAllReduce(const at::Tensor& grads);
  void NoteBoundaryWait(Clock::time_point start);
  // The gradient bytes held now (engine.h: peak_gradient_bytes) and their high-water mark.
  int64_t HeldGradBytes() const;
  void NoteGradBytes() { grad_peak_ = std::max(grad_peak_, HeldGradBytes()); }
  virtual int64_t PartitionBytes() const { return 0; }

  const JobSpec& spec_;
  comm::ProcessGroups* g_;
  ParamStore* store_;
  const FlatOps* ops_;
  TrainingState* state_;
  c10::Device device_;
  KvReducer kv_;  // on the local flat gradient
  Latch latch_;   // of the window running

 private:
  void AccumulateComputeGrads();

  int64_t grad_peak_ = 0;
  double boundary_wait_ = -1.0;
};

// The strategy `plan` names, on `env`.
std::unique_ptr<GradSync> MakeGradSync(const GradSyncPlan& plan, const GradSyncEnv& env);
std::unique_ptr<GradSync> MakeMeanAllReduceSync(const GradSyncEnv& env);
std::unique_ptr<GradSync> MakeReduceScatterSync(const GradSyncEnv& env, bool overlap);
std::unique_ptr<GradSync> MakePartitionSync(const GradSyncEnv& env);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_GRAD_SYNC_H_
