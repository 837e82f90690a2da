// GradBuckets: ZeRO-2's gradient reduce-scatter, bucketed and issued during the backward.
//
// The flat gradient layout (param_store.h) is cut into buckets of whole-element ranges, built
// in the order the backward finishes the parameters (the layout backwards, the token embedding
// before the position embedding), each at most
// bucket_elements long, a big parameter spanning several; the K/V rows of an MQA c_attn (and,
// under sequence parallelism, the LayerNorm and row-parallel bias rows, partial per TP rank as
// well: ReducedOverTp, kv_reducer.h) are left out of them and form one bucket of their own,
// issued last, after the backward (their TP sum must come before their DP reduction in
// per_micro_batch mode, docs/model.md). "K/V" below means those rows. A post
// hook on every compute parameter's gradient accumulator copies the parameter's finished
// gradient into the staging buffers of its buckets; a bucket whose parameters have all arrived
// is reduce-scattered over DP in bucket order (a later bucket that completes first waits, so the
// order of the collectives is fixed and the same on every rank), its part of this rank's ZeRO
// partition added into the fp32 gradient partition, and its staging freed.
//
// A bucket's staging has one slot per DP rank, each as long as the bucket's longest
// intersection with one rank's partition chunk (zeros elsewhere), so one equal-chunk
// reduce-scatter hands every rank the sum of its own part. Per element that is the sum over DP
// in rank order on shm, exactly what ZeRO-1's whole-buffer reduce-scatter computes.
//
// Two sources (the store's state when a synchronised backward runs):
//  - the full local gradient attached (earlier no_sync micro-batches accumulated into it):
//    autograd accumulates into it as usual and the hook copies the accumulated values (bf16:
//    folds the bf16 gradient into it first, as ZeRO-1 does); the K/V rows stay there for the
//    engine's per-micro-batch TP sum and are staged by Finish;
//  - released (the usual ZeRO-2 case): the hook adds the new gradient into zeroed staging (the
//    same fp32 add ZeRO-1's accumulation does into its zeroed buffer), the K/V rows into the K/V
//    bucket's staging (kv_stage()), then drops the parameter's .grad, so no full gradient exists
//    at any time.
// Errors: a collective failing inside a hook throws comm::CollectiveError (the TP layers'
// convention); Finish returns a Status. Thread-safety: the hooks run on the autograd thread of
// the backward the engine's thread waits on; nothing else touches the object meanwhile.
// Lifetime: store, dp and ops outlive the object; it removes its hooks when destroyed.
#ifndef LATCHKEY_WORKER_TRAIN_GRAD_BUCKETS_H_
#define LATCHKEY_WORKER_TRAIN_GRAD_BUCKETS_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/comm.h"
#include "worker/train/flat_ops.h"

namespace latchkey {

class ParamStore;

class GradBuckets {
 public:
  using Clock = std::chrono::steady_clock;

  // The bucket size for a flat buffer of `numel` elements: numel / 256, at least 256 and at
  // most 25 MiB of fp32 (DDP's bucket_cap_mb), so that a small model still has many buckets.
  static int64_t DefaultBucketElements(int64_t numel);

  // The partition is [dp_rank * chunk, (dp_rank + 1) * chunk) with chunk = padded_numel / dp.
  // Registers the hooks on the store's compute parameters (call after EnableBf16Compute).
  GradBuckets(ParamStore* store, comm::Group* dp, const FlatOps* ops, int64_t bucket_elements,
              bool sequence_parallel = false);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Before a synchronised backward: the hooks feed `part` (this rank's fp32 gradient partition,
  // chunk elements), adding into it, or with `replace` overwriting it (the partition is then the
  // attached local gradient's own chunk, as ZeRO-1's in-place reduce-scatter: each element is
  // copied into its bucket before its sum comes back). `held_bytes`: the gradient bytes held
  // besides the staging (for the high-water mark).
  void Arm(const at::Tensor& part, bool replace, int64_t held_bytes);
  // After it: issues, in order, the buckets the hooks have not (a parameter without gradient
  // counts as zeros), then the K/V bucket, from the attached local gradient or else from
  // kv_stage() (the engine's per-micro-batch TP sum already applied to either). Disarms.
  absl::Status Finish();

  // The K/V bucket's staging, which the hooks fill with the K/V rows when the local gradient is
  // released (allocated zeroed on first use, by the first K/V hook of the backward or by this
  // call, and freed when Finish issues it), and the stretch of it each K/V tensor spans (segment
  // order; one collective each for the per-micro-batch TP sum).
  const at::Tensor& kv_stage();
  const std::vector<FlatRange>& kv_spans() const { return kv_spans_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }  // without the K/V one
  bool has_kv_bucket() const { return kv_.slot > 0; }
  // Of the last armed backward: when each bucket was issued, in bucket order (the K/V one last).
  const std::vector<Clock::time_point>& issue_times() const { return issue_times_; }
  // The high-water mark of held_bytes + staging since the last reset.
  int64_t peak_bytes() const { return peak_; }
  void ResetPeak() { peak_ = 0; }

 private:
  struct Piece {
    int64_t flat = 0;  // where it starts in the flat layout
    int64_t len = 0;
    int slot = 0;     // the DP rank whose partition holds it
    int64_t dst = 0;  // where it goes in the bucket's staging (slot * slot_len + position)
    int64_t src = 0;  // where it starts in its parameter (or in the packed K/V rows)
  };
  struct Bucket {
    std::vector<Piece> pieces;
    int64_t slot = 0;  // the slot length
  };
  struct ParamPiece {
    int bucket = -1;  // -1: the K/V rows (into kv_stage_ at `dst`)
    int64_t src = 0;
    int64_t len = 0;
    int64_t dst = 0;
  };
  class Hook;

  // Lays out `pieces` (flat ranges, in order) into slots; returns the bucket.
  Bucket MakeBucket(std::vector<Piece> pieces) const;
  void OnGrad(size_t param);  // the hook
  void TryIssue();
  absl::Status Issue(Bucket& b, at::Tensor& staging);
  at::Tensor& Staging(int b);
  void Note();

  ParamStore* store_;
  comm::Group* dp_;
  const FlatOps* ops_;
  int dp_size_ = 1;
  int dp_rank_ = 0;
  int64_t part_begin_ = 0;
  int64_t chunk_ = 0;
  std::vector<Bucket> buckets_;
  Bucket kv_;
  std::vector<std::vector<ParamPiece>> pieces_;  // per parameter, buckets ascending
  std::vector<int> contributions_;               // per bucket: parameters feeding it
  std::vector<int> remaining_;
  std::vector<at::Tensor> staging_;
  std::vector<at::Tensor> leaves_;
  std::vector<std::shared_ptr<void>> accumulators_;  // kept alive: they carry the hooks
  std::vector<uintptr_t> hook_keys_;
  at::Tensor kv_stage_;
  std::vector<FlatRange> kv_spans_;
  at::Tensor part_;
  bool armed_ = false;
  bool replace_ = false;
  int next_ = 0;
  int64_t held_ = 0;
  int64_t live_ = 0;
  int64_t peak_ = 0;
  std::vector<Clock::time_point> issue_times_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_TRAIN_GRAD_BUCKETS_H_
