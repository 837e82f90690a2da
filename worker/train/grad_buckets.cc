#include "worker/train/grad_buckets.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "worker/comm/collective_error.h"
#include "worker/model/comm_buffer.h"
#include "worker/model/param_store.h"
#include "worker/train/kv_reducer.h"

namespace latchkey {

// libtorch 1.13 has no post-accumulate-grad hook on tensors; a post hook on the leaf's
// AccumulateGrad node (what DDP's reducer uses) runs right after the gradient is in .grad.
class GradBuckets::Hook final : public torch::autograd::FunctionPostHook {
 public:
  Hook(GradBuckets* owner, size_t param) : owner_(owner), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    owner_->OnGrad(param_);
    return outputs;
  }

 private:
  GradBuckets* owner_;
  size_t param_;
};

int64_t GradBuckets::DefaultBucketElements(int64_t numel) {
  constexpr int64_t kMax = 25 * 1024 * 1024 / 4;
  return std::clamp<int64_t>(numel / 256, 256, kMax);
}

GradBuckets::GradBuckets(ParamStore* store, comm::Group* dp, const FlatOps* ops,
                         int64_t bucket_elements, bool sequence_parallel)
    : store_(store), dp_(dp), ops_(ops), dp_size_(dp->size()), dp_rank_(dp->rank()) {
  chunk_ = store_->padded_numel() / dp_size_;
  part_begin_ = dp_rank_ * chunk_;
  const auto& layout = store_->layout();
  const size_t n = layout.size();
  pieces_.resize(n);
  // Each parameter's ranges: the K/V rows apart from the rest.
  std::vector<std::vector<FlatRange>> plain(n);
  std::vector<FlatRange> kv_ranges;
  std::vector<size_t> kv_param;
  for (const FlatSegment& s : store_->segments()) {
    size_t i = 0;
    while (i + 1 < n && store_->offset(i + 1) <= s.offset) ++i;
    if (ReducedOverTp(s, sequence_parallel)) {
      kv_ranges.push_back({s.offset, s.length});
      kv_param.push_back(i);
    } else {
      plain[i].push_back({s.offset, s.length});
    }
  }
  // Buckets from the end of the layout; a range longer than the room left is cut.
  const int64_t cap = std::max<int64_t>(bucket_elements, 1);
  std::vector<Piece> cur;
  int64_t cur_len = 0;
  std::vector<std::vector<std::pair<int, Piece>>> of_param(n);  // (bucket, piece) per parameter
  const auto close = [&] {
    if (cur.empty()) return;
    buckets_.push_back(MakeBucket(std::move(cur)));
    cur.clear();
    cur_len = 0;
  };
  // The order autograd finishes the gradients in: the layout backwards, except that the tied
  // token embedding (layout 0, also the LM head) is finished by the embedding lookup's backward
  // just before the position embedding (layout 1). Issuing stays in bucket order whatever the
  // real order is; a wrong guess only keeps staging alive longer.
  std::vector<size_t> order;
  for (size_t k = n; k-- > 2;) order.push_back(k);
  if (n > 0) order.push_back(0);
  if (n > 1) order.push_back(1);
  for (size_t k : order) {
    for (auto r = plain[k].rbegin(); r != plain[k].rend(); ++r) {
      int64_t hi = r->offset + r->length;  // cut from the end of the range downwards
      while (hi > r->offset) {
        const int64_t take = std::min(hi - r->offset, cap - cur_len);
        Piece p;
        p.flat = hi - take;
        p.len = take;
        p.src = p.flat - store_->offset(k);
        cur.push_back(p);
        cur_len += take;
        hi -= take;
        if (cur_len >= cap) close();
      }
    }
  }
  close();
  contributions_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<bool> seen(n, false);
    for (const Piece& p : buckets_[b].pieces) {
      size_t i = 0;
      while (i + 1 < n && store_->offset(i + 1) <= p.flat) ++i;
      pieces_[i].push_back({static_cast<int>(b), p.src, p.len, p.dst});
      if (!seen[i]) ++contributions_[b];
      seen[i] = true;
    }
  }
  // The K/V bucket; its staging (kv_stage_) is what the hooks write the K/V rows into, and
  // each K/V tensor spans one stretch of it (its pieces in slot order, with any slot padding
  // between them), which the per-micro-batch TP sum reduces as one collective.
  std::vector<Piece> kv;
  for (size_t j = 0; j < kv_ranges.size(); ++j) {
    Piece p;
    p.flat = kv_ranges[j].offset;
    p.len = kv_ranges[j].length;
    p.src = static_cast<int64_t>(j);  // the tensor, until cut
    kv.push_back(p);
  }
  if (!kv.empty()) kv_ = MakeBucket(std::move(kv));
  kv_spans_.assign(kv_ranges.size(), FlatRange{-1, 0});
  for (const Piece& q : kv_.pieces) {
    size_t j = 0;
    while (j + 1 < kv_ranges.size() && kv_ranges[j + 1].offset <= q.flat) ++j;
    FlatRange& span = kv_spans_[j];
    if (span.offset < 0) {
      span = {q.dst, q.len};
    } else {
      const int64_t lo = std::min(span.offset, q.dst);
      const int64_t hi = std::max(span.offset + span.length, q.dst + q.len);
      span = {lo, hi - lo};
    }
    pieces_[kv_param[j]].push_back({-1, q.flat - store_->offset(kv_param[j]), q.len, q.dst});
  }
  for (auto& list : pieces_) {
    std::stable_sort(list.begin(), list.end(), [](const ParamPiece& a, const ParamPiece& b) {
      return static_cast<unsigned>(a.bucket) < static_cast<unsigned>(b.bucket);  // K/V last
    });
  }
  staging_.resize(buckets_.size());
  remaining_ = contributions_;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& leaf = store_->param(layout[i].name);
    leaves_.push_back(leaf);
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(leaf);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<Hook>(this, i)));
    accumulators_.push_back(acc);
  }
}

GradBuckets::~GradBuckets() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    std::static_pointer_cast<torch::autograd::Node>(accumulators_[i])->del_post_hook(hook_keys_[i]);
  }
}

GradBuckets::Bucket GradBuckets::MakeBucket(std::vector<Piece> pieces) const {
  // Cut at the partition chunks' boundaries, then place each slot's pieces back to back.
  std::vector<Piece> cut;
  for (const Piece& p : pieces) {
    int64_t at = p.flat;
    while (at < p.flat + p.len) {
      const int slot = static_cast<int>(std::min<int64_t>(at / chunk_, dp_size_ - 1));
      const int64_t end = std::min(p.flat + p.len, (slot + 1) * chunk_);
      Piece q = p;
      q.flat = at;
      q.len = end - at;
      q.src = p.src + (at - p.flat);
      q.slot = slot;
      cut.push_back(q);
      at = end;
    }
  }
  std::vector<int64_t> fill(dp_size_, 0);
  for (Piece& p : cut) {
    p.dst = fill[p.slot];
    fill[p.slot] += p.len;
  }
  Bucket b;
  b.slot = *std::max_element(fill.begin(), fill.end());
  for (Piece& p : cut) p.dst += p.slot * b.slot;
  b.pieces = std::move(cut);
  return b;
}

void GradBuckets::Arm(const at::Tensor& part, bool replace, int64_t held_bytes) {
  part_ = part;
  replace_ = replace;
  held_ = held_bytes;
  armed_ = true;
  next_ = 0;
  remaining_ = contributions_;
  issue_times_.clear();
  Note();
}

const at::Tensor& GradBuckets::kv_stage() {
  if (!kv_stage_.defined() && has_kv_bucket()) {
    // First written by the backward's first K/V rows (the last layer's c_attn, after its MLP):
    // not held through the forward and the start of the backward, where the peak is.
    kv_stage_ = at::zeros({kv_.slot * dp_size_},
                          at::TensorOptions().dtype(at::kFloat).device(store_->device()));
    live_ += kv_stage_.numel() * 4;
    Note();
  }
  return kv_stage_;
}

at::Tensor& GradBuckets::Staging(int b) {
  at::Tensor& s = staging_[b];
  if (!s.defined()) {
    s = at::zeros({buckets_[b].slot * dp_size_},
                  at::TensorOptions().dtype(at::kFloat).device(store_->device()));
    live_ += s.numel() * 4;
    Note();
  }
  return s;
}

void GradBuckets::Note() { peak_ = std::max(peak_, held_ + live_); }

void GradBuckets::OnGrad(size_t i) {
  if (!armed_) return;
  at::Tensor& grad = leaves_[i].mutable_grad();
  if (!grad.defined()) return;
  const bool attached = store_->grads_attached();
  at::Tensor src;
  if (attached) {
    // The local gradient holds the accumulated values (fp32: autograd added in place).
    src = store_->flat_grads().narrow(0, store_->offset(i), leaves_[i].numel());
    if (store_->bf16()) {
      ops_->AddTo(src, grad.reshape({-1}));
      grad.reset();
    }
  } else {
    src = grad.reshape({-1});
  }
  int pending = -1;
  for (const ParamPiece& p : pieces_[i]) {
    if (p.bucket != pending && pending >= 0) {
      --remaining_[pending];
      TryIssue();
    }
    pending = p.bucket;
    if (p.bucket < 0) {
      if (!attached) ops_->AddTo(kv_stage().narrow(0, p.dst, p.len), src.narrow(0, p.src, p.len));
      continue;
    }
    // The piece lies in one slot of the bucket (the bucket's pieces were cut by slot).
    const Bucket& b = buckets_[p.bucket];
    at::Tensor& st = Staging(p.bucket);
    const int64_t flat_lo = store_->offset(i) + p.src;
    for (const Piece& q : b.pieces) {
      if (q.flat < flat_lo || q.flat >= flat_lo + p.len) continue;
      const at::Tensor dst = st.narrow(0, q.dst, q.len);
      const at::Tensor from = src.narrow(0, q.flat - store_->offset(i), q.len);
      if (attached) {
        ops_->Copy(dst, from);
      } else {
        ops_->AddTo(dst, from);
      }
    }
  }
  if (pending >= 0) {
    --remaining_[pending];
    TryIssue();
  }
  if (!attached) grad.reset();  // the released case keeps no gradient of its own
}

void GradBuckets::TryIssue() {
  while (next_ < static_cast<int>(buckets_.size()) && remaining_[next_] == 0) {
    if (absl::Status st = Issue(buckets_[next_], staging_[next_]); !st.ok()) {
      throw comm::CollectiveError(st);
    }
    ++next_;
  }
}

absl::Status GradBuckets::Issue(Bucket& b, at::Tensor& staging) {
  if (!staging.defined()) {
    staging = at::zeros({b.slot * dp_size_},
                        at::TensorOptions().dtype(at::kFloat).device(store_->device()));
    live_ += staging.numel() * 4;
    Note();
  }
  issue_times_.push_back(Clock::now());
  const comm::Buffer whole = CommBuffer(staging);
  const comm::Buffer mine = whole.Slice(static_cast<size_t>(dp_rank_ * b.slot), b.slot);
  if (absl::Status st = dp_->ReduceScatterSum(whole, mine); !st.ok()) return st;
  for (const Piece& p : b.pieces) {
    if (p.slot != dp_rank_) continue;
    const at::Tensor to = part_.narrow(0, p.flat - part_begin_, p.len);
    const at::Tensor from = staging.narrow(0, p.dst, p.len);
    if (replace_) {
      ops_->Copy(to, from);
    } else {
      ops_->AddTo(to, from);
    }
  }
  live_ -= staging.numel() * 4;
  staging = at::Tensor();
  return absl::OkStatus();
}

absl::Status GradBuckets::Finish() {
  armed_ = false;
  for (; next_ < static_cast<int>(buckets_.size()); ++next_) {
    if (absl::Status st = Issue(buckets_[next_], staging_[next_]); !st.ok()) return st;
  }
  if (has_kv_bucket()) {
    // The K/V rows: from the local gradient where it is attached (the hooks left them there).
    if (store_->grads_attached()) {
      for (const Piece& p : kv_.pieces) {
        ops_->Copy(kv_stage().narrow(0, p.dst, p.len),
                   store_->flat_grads().narrow(0, p.flat, p.len));
      }
    }
    if (absl::Status st = Issue(kv_, kv_stage_); !st.ok()) return st;  // frees it
  }
  part_ = at::Tensor();
  return absl::OkStatus();
}

}  // namespace latchkey
