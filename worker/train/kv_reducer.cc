#include "worker/train/kv_reducer.h"

#include <algorithm>
#include <cstring>

namespace latchkey {

KvReducer::KvReducer(const std::vector<FlatSegment>& segments, comm::Group* tp) : tp_(tp) {
  for (const FlatSegment& s : segments) {
    if (!s.kv) continue;
    kv_.push_back(s);
    total_ += s.length;
  }
  active_ = !kv_.empty() && comm::is_parallel(tp_);
  if (active_) {
    snapshot_.assign(total_, 0.0f);
    stage_.assign(total_, 0.0f);
  }
}

void KvReducer::BeginWindow() {
  pending_backwards_ = 0;
  reduced_in_window_ = false;
  std::fill(snapshot_.begin(), snapshot_.end(), 0.0f);
}

absl::Status KvReducer::ReducePending(float* grads, bool coalesced) {
  if (!active_ || !enabled_ || pending_backwards_ == 0) return absl::OkStatus();
  // Stage what was added since the previous reduction.
  int64_t at = 0;
  for (const FlatSegment& s : kv_) {
    const float* g = grads + s.offset;
    const float* snap = snapshot_.data() + at;
    float* st = stage_.data() + at;
    for (int64_t i = 0; i < s.length; ++i) st[i] = g[i] - snap[i];
    at += s.length;
  }
  comm::CollectiveOptions opts;
  opts.tag = comm::kKvTag;
  if (coalesced) {
    if (absl::Status st = tp_->AllReduceSum(stage_.data(), stage_.size(), comm::DataType::kFloat32,
                                            opts);
        !st.ok()) {
      return st;
    }
  } else {
    at = 0;
    for (const FlatSegment& s : kv_) {
      if (absl::Status st = tp_->AllReduceSum(stage_.data() + at, static_cast<size_t>(s.length),
                                              comm::DataType::kFloat32, opts);
          !st.ok()) {
        return st;
      }
      at += s.length;
    }
  }
  // Write back: grad = snapshot + reduced delta, and that becomes the new snapshot. On the first
  // reduction of a window the snapshot is zero, so the grad is exactly the reduced sum.
  at = 0;
  for (const FlatSegment& s : kv_) {
    float* g = grads + s.offset;
    float* snap = snapshot_.data() + at;
    const float* st = stage_.data() + at;
    if (reduced_in_window_) {
      for (int64_t i = 0; i < s.length; ++i) g[i] = snap[i] + st[i];
    } else {
      std::memcpy(g, st, s.length * sizeof(float));
    }
    std::memcpy(snap, g, s.length * sizeof(float));
    at += s.length;
  }
  reduced_in_window_ = true;
  pending_backwards_ = 0;
  return absl::OkStatus();
}

absl::Status KvReducer::OnGradsReplaced(const float* grads) {
  if (!active_ || !reduced_in_window_) return absl::OkStatus();  // nothing reduced yet: still 0
  if (pending_backwards_ != 0) {
    return absl::FailedPreconditionError(
        "K/V rows partially reduced when the gradient buffer was replaced");
  }
  int64_t at = 0;
  for (const FlatSegment& s : kv_) {
    std::memcpy(snapshot_.data() + at, grads + s.offset, s.length * sizeof(float));
    at += s.length;
  }
  return absl::OkStatus();
}

}  // namespace latchkey
