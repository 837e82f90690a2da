#include "worker/train/kv_reducer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "worker/model/comm_buffer.h"

namespace latchkey {

int64_t ReplicatedCalls(const comm::CollectiveStats& stats) {
  return stats.TaggedCalls(comm::kKvTag) + stats.TaggedCalls(kReplicatedTag);
}

KvReducer::KvReducer(const std::vector<FlatSegment>& segments, comm::Group* tp, const FlatOps* ops,
                     bool sequence_parallel)
    : tp_(tp), ops_(ops) {
  for (const FlatSegment& s : segments) {
    if (!s.kv && !(sequence_parallel && s.sequence_parallel_partial)) continue;
    kv_.push_back({s.offset, s.length});
    carries_kv_.push_back(s.kv);
    total_ += s.length;
  }
  active_ = !kv_.empty() && comm::is_parallel(tp_);
  if (active_) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(ops_->device());
    snapshot_ = at::zeros({total_}, f32);
    stage_ = at::zeros({total_}, f32);
  }
}

void KvReducer::BeginWindow() {
  pending_backwards_ = 0;
  reduced_in_window_ = false;
  if (active_) snapshot_.zero_();
}

absl::Status KvReducer::ReducePending(const at::Tensor& grads, bool coalesced) {
  if (!active_ || !enabled_ || pending_backwards_ == 0) return absl::OkStatus();
  // Stage what was added since the previous reduction.
  ops_->PackDelta(grads, kv_, snapshot_, stage_);
  comm::CollectiveOptions opts;
  const comm::Buffer stage = CommBuffer(stage_);
  if (coalesced) {
    const bool any_kv =
        std::find(carries_kv_.begin(), carries_kv_.end(), true) != carries_kv_.end();
    opts.tag = any_kv ? comm::kKvTag : kReplicatedTag;
    if (absl::Status st = tp_->AllReduceSum(stage, opts); !st.ok()) return st;
  } else {
    size_t at = 0;
    for (size_t i = 0; i < kv_.size(); ++i) {
      const size_t n = static_cast<size_t>(kv_[i].length);
      opts.tag = carries_kv_[i] ? comm::kKvTag : kReplicatedTag;
      if (absl::Status st = tp_->AllReduceSum(stage.Slice(at, n), opts); !st.ok()) return st;
      at += n;
    }
  }
  // Write back: grad = snapshot + reduced delta, and that becomes the new snapshot. On the first
  // reduction of a window the snapshot is zero, so the grad is exactly the reduced sum.
  ops_->UnpackDelta(grads, kv_, stage_, snapshot_, /*add_snapshot=*/reduced_in_window_);
  reduced_in_window_ = true;
  pending_backwards_ = 0;
  return absl::OkStatus();
}

absl::Status KvReducer::OnGradsReplaced(const at::Tensor& grads) {
  if (!active_ || !reduced_in_window_) return absl::OkStatus();  // nothing reduced yet: still 0
  if (pending_backwards_ != 0) {
    return absl::FailedPreconditionError(
        "K/V rows partially reduced when the gradient buffer was replaced");
  }
  ops_->Pack(grads, kv_, snapshot_);
  return absl::OkStatus();
}

}  // namespace latchkey
