// ZeRO-2's GradSync (grad_sync.h): every synchronised micro-batch reduce-scatters its gradient
// during its backward, bucket by bucket (grad_buckets.h), into this rank's fp32 gradient
// partition (TrainingState::grads_part); no_sync micro-batches accumulate into the local full
// gradient, attached for them and folded into the next synchronised micro-batch's reduce-scatter.
// The deferred / coalesced K/V sum runs on the partition at the boundary (docs/memory.md).
// Thread contract: grad_sync.h's.
#include <ATen/ATen.h>

#include <algorithm>

#include "common/status_macros.h"
#include "worker/checkpoint/training_state.h"
#include "worker/model/param_store.h"
#include "worker/train/grad_buckets.h"
#include "worker/train/grad_norm.h"
#include "worker/train/grad_sync.h"

namespace latchkey {
namespace {

class PartitionSync final : public GradSync {
 public:
  explicit PartitionSync(const GradSyncEnv& env)
      : GradSync(env),
        // The hooks go on the parameters the model uses (after EnableBf16Compute and TakeMaster).
        buckets_(store_, g_->dp_group.get(), ops_,
                 GradBuckets::DefaultBucketElements(store_->numel()), spec_.sequence_parallel),
        kv_part_(KvReducer::ForPartition(store_->segments(), state_->part_begin, state_->part_end,
                                         g_->tp_group.get(), ops_, spec_.sequence_parallel)) {
    kv_part_.set_enabled_for_testing(!env.skip_kv_reduction_for_testing);
  }

  // A synchronised micro-batch reduce-scatters its gradient during the backward; a no_sync one
  // accumulates into the local full gradient, attached for it.
  void BeforeBackward(int m) override {
    if (!synchronised(m)) {
      if (!store_->grads_attached()) {
        store_->AttachGrads();
        kv_.BeginWindow();  // a fresh local buffer: the K/V snapshot starts from zero again
      }
      return;
    }
    Arm(last(m));
  }

  absl::Status AfterBackward(int m) override {
    return synchronised(m) ? FinishSynchronised() : AccumulateLocal();
  }

  // The partition holds the DP sum of every synchronised micro-batch: the mean, the norm. The
  // TP sum of the K/V rows runs on the partition, after its DP reduction (the sums commute).
  absl::StatusOr<Result> Finish(double loss) override {
    LK_RETURN_IF_ERROR(ReduceKvAtBoundary(kv_part_, part_));
    // The partition's K/V rows are summed once per window: nothing of the reducer is needed
    // until the next boundary.
    if (!per_micro_batch()) kv_part_.Release();
    ops_->Scale(part_, 1.0f / g_->dp);
    double both[2] = {PartitionGradNormSq(*ops_, part_, store_->segments(), state_->part_begin,
                                          state_->part_end, g_->tp_rank == 0),
                      loss};
    const auto sum_start = Clock::now();
    LK_RETURN_IF_ERROR(SumScalars(g_->world.get(), both, 2));
    NoteBoundaryWait(sum_start);
    return Result{both[0], both[1] / g_->world_size};
  }

  at::Tensor partition() const override { return part_; }

  int64_t peak_gradient_bytes() const override {
    return std::max(GradSync::peak_gradient_bytes(), buckets_.peak_bytes());
  }
  std::vector<Clock::time_point> bucket_issue_times() const override {
    return buckets_.issue_times();
  }

 private:
  // The previous window's partition (it may be a view of the local gradient) goes now.
  void OnBeginWindow() override {
    buckets_.ResetPeak();
    store_->ReleaseGrads();
    kv_.Release();  // its snapshot of the released local gradient's K/V rows
    grad_part_ = at::Tensor();
    part_ = at::Tensor();
    state_->grads_part = at::Tensor();
    part_in_local_ = false;
    syncs_ = 0;
    kv_part_.BeginWindow();
  }

  int64_t PartitionBytes() const override {
    // A view of the local gradient counts there.
    return (grad_part_.defined() ? grad_part_.numel() * 4 : 0) + kv_part_.buffer_bytes();
  }

  // The partition a synchronised micro-batch reduces into. With the local gradient attached and
  // no synchronised micro-batch before it in the window (the default mask's last micro-batch),
  // that is the local gradient's own chunk, overwritten in place as ZeRO-1 does, so ZeRO-2 then
  // holds what ZeRO-1 holds; otherwise a separate partition buffer that sums the micro-batches.
  void Arm(bool last) {
    const bool in_local = store_->grads_attached() && last && syncs_ == 0;
    if (in_local) {
      part_ = store_->flat_grads().narrow(0, state_->part_begin, state_->part_numel());
      part_in_local_ = true;
    } else {
      if (!grad_part_.defined()) {
        grad_part_ = at::zeros({state_->part_numel()},
                               at::TensorOptions().dtype(at::kFloat).device(device_));
      }
      part_ = grad_part_;
    }
    state_->grads_part = part_;
    buckets_.Arm(part_, /*replace=*/in_local, HeldGradBytes());
  }

  // After a synchronised backward whose buckets the hooks issued: the per-micro-batch K/V sum
  // over TP of what this backward added (on the attached local gradient, or on the K/V bucket's
  // staging), then the rest of the buckets and the K/V bucket, then the local gradient is
  // dropped.
  absl::Status FinishSynchronised() {
    NoteGradBytes();
    if (store_->grads_attached()) {
      kv_.NoteBackward();
      if (per_micro_batch()) {
        LK_RETURN_IF_ERROR(kv_.ReducePending(store_->flat_grads(), /*coalesced=*/false));
      }
    } else if (per_micro_batch()) {
      LK_RETURN_IF_ERROR(kv_.ReduceFresh(buckets_.kv_stage(), buckets_.kv_spans()));
    }
    LK_RETURN_IF_ERROR(buckets_.Finish());
    kv_part_.NoteBackward();
    ++syncs_;
    if (!part_in_local_) {
      store_->ReleaseGrads();
      kv_.Release();
    }
    return absl::OkStatus();
  }

  GradBuckets buckets_;
  KvReducer kv_part_;     // the K/V rows of the partition (deferred / coalesced)
  at::Tensor grad_part_;  // the separate partition buffer, when one is needed
  at::Tensor part_;       // the window's partition: grad_part_ or the local gradient's chunk
  bool part_in_local_ = false;
  int syncs_ = 0;  // synchronised micro-batches so far in the window
};

}  // namespace

std::unique_ptr<GradSync> MakePartitionSync(const GradSyncEnv& env) {
  return std::make_unique<PartitionSync>(env);
}

}  // namespace latchkey
