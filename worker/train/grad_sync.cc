// GradSync's shared steps, the strategy choice, and the ZeRO-0 and ZeRO-1 strategies
// (grad_sync.h). ZeRO-2's is in grad_sync_partition.cc.
#include "worker/train/grad_sync.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not via ATen.h in torch 2.x)

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/status_macros.h"
#include "worker/checkpoint/training_state.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/param_store.h"
#include "worker/train/grad_buckets.h"
#include "worker/train/grad_norm.h"

namespace latchkey {

GradSyncPlan PlanGradSync(const JobSpec& spec, const comm::ProcessGroups& groups,
                          bool overlap_option) {
  GradSyncPlan plan;
  if (spec.zero_stage < 1 || !comm::is_parallel(groups.dp_group)) return plan;
  plan.kind = spec.zero_stage == 2 ? GradSyncKind::kPartition : GradSyncKind::kReduceScatter;
  plan.overlap = plan.kind == GradSyncKind::kReduceScatter &&
                 (overlap_option || spec.overlap_dp_reduction) && spec.zero_stage == 1;
  return plan;
}

std::unique_ptr<GradSync> MakeGradSync(const GradSyncPlan& plan, const GradSyncEnv& env) {
  switch (plan.kind) {
    case GradSyncKind::kMeanAllReduce:
      return MakeMeanAllReduceSync(env);
    case GradSyncKind::kReduceScatter:
      return MakeReduceScatterSync(env, plan.overlap);
    case GradSyncKind::kPartition:
      return MakePartitionSync(env);
  }
  return nullptr;
}

// --- GradSync's shared steps ---------------------------------------------------------------

GradSync::GradSync(const GradSyncEnv& env)
    : spec_(*env.spec),
      g_(env.groups),
      store_(env.store),
      ops_(env.ops),
      state_(env.state),
      device_(env.device),
      kv_(env.store->segments(), env.groups->tp_group.get(), env.ops, env.spec->sequence_parallel) {
  kv_.set_enabled_for_testing(!env.skip_kv_reduction_for_testing);
}

void GradSync::BeginWindow(const Latch& latch) {
  latch_ = latch;
  grad_peak_ = 0;
  boundary_wait_ = -1.0;
  store_->ZeroGrads();
  kv_.BeginWindow();
  OnBeginWindow();
  NoteGradBytes();
}

absl::Status GradSync::AccumulateLocal() {
  AccumulateComputeGrads();
  kv_.NoteBackward();
  if (per_micro_batch()) {
    LK_RETURN_IF_ERROR(kv_.ReducePending(store_->flat_grads(), /*coalesced=*/false));
  }
  NoteGradBytes();
  return absl::OkStatus();
}

absl::Status GradSync::MeanOfAccumulated() {
  const at::Tensor& grads = store_->flat_grads();
  LK_RETURN_IF_ERROR(DpMeanAllReduce(grads.narrow(0, 0, store_->numel())));
  return kv_.OnGradsReplaced(grads);
}

absl::Status GradSync::ReduceKvAtBoundary(KvReducer& kv, const at::Tensor& grads) {
  if (per_micro_batch()) return absl::OkStatus();
  const int64_t kv_calls = ReplicatedCalls(*g_->stats);
  const auto kv_start = Clock::now();
  LK_RETURN_IF_ERROR(kv.ReducePending(grads, latch_.kv_mode == KvMode::kCoalesced));
  if (ReplicatedCalls(*g_->stats) != kv_calls) NoteBoundaryWait(kv_start);
  NoteGradBytes();
  return absl::OkStatus();
}

absl::Status GradSync::SumScalars(comm::Group* group, double* values, int64_t n) {
  at::Tensor t = at::from_blob(values, {n}, at::kDouble).to(device_);
  if (absl::Status st = group->AllReduceSum(CommBuffer(t)); !st.ok()) return st;
  if (!t.is_cpu()) std::memcpy(values, t.cpu().data_ptr<double>(), n * sizeof(double));
  return absl::OkStatus();
}

absl::Status GradSync::DpMeanAllReduce(const at::Tensor& grads) {
  if (absl::Status st = g_->dp_group->AllReduceSum(CommBuffer(grads)); !st.ok()) return st;
  ops_->Scale(grads, 1.0f / g_->dp);
  return absl::OkStatus();
}

void GradSync::NoteBoundaryWait(Clock::time_point start) {
  if (boundary_wait_ < 0) {
    boundary_wait_ = std::chrono::duration<double>(Clock::now() - start).count();
  }
}

// The full flat buffer (while attached), ZeRO-2's partition and its reducer, the K/V reducer's
// snapshot and staging, and in bf16 mode the bf16 gradients the compute parameters keep. The
// bucket staging is GradBuckets'.
int64_t GradSync::HeldGradBytes() const {
  int64_t n = store_->grads_attached() ? store_->padded_numel() * 4 : 0;
  n += PartitionBytes() + kv_.buffer_bytes();
  if (store_->bf16()) {
    for (size_t i = 0; i < store_->layout().size(); ++i) {
      const at::Tensor& g = store_->compute_grad(i);
      if (g.defined()) n += g.numel() * 2;
    }
  }
  return n;
}

// bf16: folds the last backward's bf16 gradients into the fp32 accumulation buffer.
void GradSync::AccumulateComputeGrads() {
  if (!store_->bf16()) return;
  const auto& layout = store_->layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    at::Tensor& g = store_->compute_grad(i);
    if (!g.defined()) continue;
    ops_->AddTo(store_->flat_grads().narrow(0, store_->offset(i), layout[i].local_numel()),
                g.reshape({-1}));
    at::NoGradGuard no_grad;
    g.zero_();
  }
}

namespace {

// --- ZeRO-0: the mean all-reduce ------------------------------------------------------------

class MeanAllReduceSync final : public GradSync {
 public:
  explicit MeanAllReduceSync(const GradSyncEnv& env) : GradSync(env) {}

  void BeforeBackward(int) override {}

  absl::Status AfterBackward(int m) override {
    LK_RETURN_IF_ERROR(AccumulateLocal());
    if (!last(m) && !latch_.no_sync[m] && comm::is_parallel(g_->dp_group)) {
      return MeanOfAccumulated();
    }
    return absl::OkStatus();
  }

  // The loss rides in the all-reduce's spare slot, so it is reduced over DP only: a "loss not
  // finite" flag rides in the norm's TP sum.
  absl::StatusOr<Result> Finish(double loss) override {
    const at::Tensor& grads = store_->flat_grads();
    const int64_t numel = store_->numel();
    LK_RETURN_IF_ERROR(ReduceKvAtBoundary(kv_, grads));
    if (comm::is_parallel(g_->dp_group)) {
      ops_->Set(grads, numel, static_cast<float>(loss));  // the loss rides in the spare slot
      const auto dp_start = Clock::now();
      LK_RETURN_IF_ERROR(DpMeanAllReduce(grads.narrow(0, 0, numel + 1)));
      NoteBoundaryWait(dp_start);
      loss = ops_->Get(grads, numel);
      ops_->Set(grads, numel, 0.0f);
    }
    Result r;
    r.norm_sq = LocalGradNormSq(*ops_, grads, store_->segments(), 0, numel, g_->tp_rank == 0);
    r.loss = loss;
    if (comm::is_parallel(g_->tp_group)) {
      double both[2] = {r.norm_sq, std::isfinite(loss) ? 0.0 : 1.0};
      LK_RETURN_IF_ERROR(SumScalars(g_->tp_group.get(), both, 2));
      r.norm_sq = both[0];
      if (both[1] != 0.0 && std::isfinite(loss)) r.loss = std::nan("");
    }
    return r;
  }

  at::Tensor partition() const override {
    return store_->flat_grads().narrow(0, state_->part_begin, state_->part_numel());
  }
};

// --- ZeRO-1: the boundary reduce-scatter, optionally bucketed into the last backward ---------

class ReduceScatterSync final : public GradSync {
 public:
  ReduceScatterSync(const GradSyncEnv& env, bool overlap) : GradSync(env) {
    if (overlap) {
      // The hooks go on the parameters the model uses (after EnableBf16Compute and TakeMaster).
      buckets_ = std::make_unique<GradBuckets>(store_, g_->dp_group.get(), ops_,
                                               GradBuckets::DefaultBucketElements(store_->numel()),
                                               spec_.sequence_parallel);
    }
  }

  // Overlapped: the boundary reduce-scatter in place into the local buffer's chunk.
  void BeforeBackward(int m) override {
    if (buckets_ && last(m)) buckets_->Arm(partition(), /*replace=*/true, HeldGradBytes());
  }

  absl::Status AfterBackward(int m) override {
    LK_RETURN_IF_ERROR(AccumulateLocal());
    if (buckets_ && last(m)) LK_RETURN_IF_ERROR(FinishOverlapped());
    if (!last(m) && !latch_.no_sync[m]) return MeanOfAccumulated();
    return absl::OkStatus();
  }

  // In place: the grads buffer is the scratch; only this rank's partition is used after.
  absl::StatusOr<Result> Finish(double loss) override {
    const at::Tensor& grads = store_->flat_grads();
    LK_RETURN_IF_ERROR(ReduceKvAtBoundary(kv_, grads));
    const at::Tensor part = partition();
    if (!buckets_) {  // overlapped: already reduce-scattered during the last backward
      const auto dp_start = Clock::now();
      LK_RETURN_IF_ERROR(g_->dp_group->ReduceScatterSum(CommBuffer(grads), CommBuffer(part)));
      NoteBoundaryWait(dp_start);
    }
    ops_->Scale(part, 1.0f / g_->dp);
    double both[2] = {LocalGradNormSq(*ops_, grads, store_->segments(), state_->part_begin,
                                      state_->part_end, g_->tp_rank == 0),
                      loss};
    LK_RETURN_IF_ERROR(SumScalars(g_->world.get(), both, 2));
    return Result{both[0], both[1] / g_->world_size};
  }

  at::Tensor partition() const override {
    return store_->flat_grads().narrow(0, state_->part_begin, state_->part_numel());
  }

  int64_t peak_gradient_bytes() const override {
    return std::max(GradSync::peak_gradient_bytes(), buckets_ ? buckets_->peak_bytes() : 0);
  }
  std::vector<Clock::time_point> bucket_issue_times() const override {
    return buckets_ ? buckets_->issue_times() : std::vector<Clock::time_point>{};
  }

 private:
  void OnBeginWindow() override {
    if (buckets_) buckets_->ResetPeak();
  }

  // After the last backward: the boundary K/V sum (it must precede the DP reduction of the K/V
  // rows), then the buckets the hooks have not issued and the K/V bucket.
  absl::Status FinishOverlapped() {
    if (!per_micro_batch()) {
      const auto kv_start = Clock::now();
      LK_RETURN_IF_ERROR(
          kv_.ReducePending(store_->flat_grads(), latch_.kv_mode == KvMode::kCoalesced));
      if (kv_.active()) NoteBoundaryWait(kv_start);
    }
    return buckets_->Finish();
  }

  std::unique_ptr<GradBuckets> buckets_;  // overlapped only
};

}  // namespace

std::unique_ptr<GradSync> MakeMeanAllReduceSync(const GradSyncEnv& env) {
  return std::make_unique<MeanAllReduceSync>(env);
}

std::unique_ptr<GradSync> MakeReduceScatterSync(const GradSyncEnv& env, bool overlap) {
  return std::make_unique<ReduceScatterSync>(env, overlap);
}

}  // namespace latchkey
