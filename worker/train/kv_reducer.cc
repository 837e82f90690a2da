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
    if (!ReducedOverTp(s, sequence_parallel)) continue;
    kv_.push_back({s.offset, s.length});
    carries_kv_.push_back(s.kv);
  }
  Allocate();
}

KvReducer::KvReducer(std::vector<FlatRange> kv, std::vector<bool> carries_kv, comm::Group* tp,
                     const FlatOps* ops, bool keep_count)
    : kv_(std::move(kv)),
      carries_kv_(std::move(carries_kv)),
      tp_(tp),
      keep_count_(keep_count),
      ops_(ops) {
  Allocate();
}

KvReducer KvReducer::ForPartition(const std::vector<FlatSegment>& segments, int64_t begin,
                                  int64_t end, comm::Group* tp, const FlatOps* ops,
                                  bool sequence_parallel) {
  std::vector<FlatRange> kv;
  std::vector<bool> carries;
  for (const FlatSegment& s : segments) {
    if (!ReducedOverTp(s, sequence_parallel)) continue;
    const int64_t lo = std::max(begin, s.offset);
    const int64_t hi = std::min(end, s.offset + s.length);
    // A tensor the partition does not meet stays in the list (empty) so that it keeps its
    // collective.
    kv.push_back(hi > lo ? FlatRange{lo - begin, hi - lo} : FlatRange{0, 0});
    carries.push_back(s.kv);
  }
  return KvReducer(std::move(kv), std::move(carries), tp, ops, /*keep_count=*/true);
}

void KvReducer::Allocate() {
  for (const FlatRange& r : kv_) total_ += r.length;
  active_ = !kv_.empty() && comm::is_parallel(tp_);
  if (active_ && keep_count_) {
    dummy_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(ops_->device()));
  }
}

void KvReducer::EnsureBuffers() {
  if (snapshot_.defined()) return;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(ops_->device());
  snapshot_ = at::zeros({total_}, f32);
  stage_ = at::zeros({total_}, f32);
}

void KvReducer::BeginWindow() {
  pending_backwards_ = 0;
  reduced_in_window_ = false;
  if (snapshot_.defined()) snapshot_.zero_();
}

void KvReducer::Release() {
  BeginWindow();
  snapshot_ = at::Tensor();
  stage_ = at::Tensor();
}

absl::Status KvReducer::ReducePending(const at::Tensor& grads, bool coalesced) {
  if (!active_ || !enabled_ || pending_backwards_ == 0) return absl::OkStatus();
  // Stage what was added since the previous reduction.
  EnsureBuffers();
  ops_->PackDelta(grads, kv_, snapshot_, stage_);
  comm::CollectiveOptions opts;
  const comm::Buffer stage = CommBuffer(stage_);
  // An empty piece (keep_count_ only) travels as one zero element: the same count everywhere.
  const auto reduce = [&](size_t at, size_t n) {
    if (n == 0 && keep_count_) {
      ops_->Set(dummy_, 0, 0.0f);
      return tp_->AllReduceSum(CommBuffer(dummy_), opts);
    }
    return tp_->AllReduceSum(stage.Slice(at, n), opts);
  };
  if (coalesced) {
    const bool any_kv =
        std::find(carries_kv_.begin(), carries_kv_.end(), true) != carries_kv_.end();
    opts.tag = any_kv ? comm::kKvTag : kReplicatedTag;
    if (absl::Status st = reduce(0, static_cast<size_t>(total_)); !st.ok()) return st;
  } else {
    size_t at = 0;
    for (size_t i = 0; i < kv_.size(); ++i) {
      const size_t n = static_cast<size_t>(kv_[i].length);
      opts.tag = carries_kv_[i] ? comm::kKvTag : kReplicatedTag;
      if (absl::Status st = reduce(at, n); !st.ok()) return st;
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

absl::Status KvReducer::ReduceFresh(const at::Tensor& staged, const std::vector<FlatRange>& spans) {
  if (!active_ || !enabled_) return absl::OkStatus();
  if (spans.size() != kv_.size()) {
    return absl::InternalError("K/V staging has " + std::to_string(spans.size()) +
                               " tensor spans for " + std::to_string(kv_.size()) + " K/V tensors");
  }
  comm::CollectiveOptions opts;
  const comm::Buffer all = CommBuffer(staged);
  for (size_t i = 0; i < spans.size(); ++i) {
    const FlatRange& r = spans[i];
    opts.tag = carries_kv_[i] ? comm::kKvTag : kReplicatedTag;
    const comm::Buffer one =
        all.Slice(static_cast<size_t>(r.offset), static_cast<size_t>(r.length));
    if (absl::Status st = tp_->AllReduceSum(one, opts); !st.ok()) return st;
  }
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
