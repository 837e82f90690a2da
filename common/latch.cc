#include "common/latch.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace latchkey {
namespace {

// The mode a policy asks for when nothing stands in its way (auto prefers the cheapest).
KvMode Requested(KvReducePolicy p) {
  switch (p) {
    case KvReducePolicy::kPerMicroBatch:
      return KvMode::kPerMicroBatch;
    case KvReducePolicy::kDeferred:
      return KvMode::kDeferred;
    case KvReducePolicy::kAuto:
    case KvReducePolicy::kCoalesced:
      return KvMode::kCoalesced;
  }
  return KvMode::kPerMicroBatch;
}

void DecideKvMode(const JobSpec& spec, KvReducePolicy policy, Latch* latch) {
  const KvMode requested = Requested(policy);
  const std::string arrow = absl::StrCat(" → ", KvModeName(requested));

  // Without a TP group or without replicated K/V rows no K/V collective is issued whatever the
  // mode, so the requested mode stands (it only labels the window).
  if (spec.tp == 1 || !spec.model.multi_query) {
    latch->kv_mode = requested;
    latch->reason = absl::StrCat(
        spec.tp == 1 ? "tp=1: no TP group, no K/V collective" : "MHA: no replicated K/V rows", "; ",
        KvReducePolicyName(policy), arrow);
    return;
  }
  if (policy == KvReducePolicy::kPerMicroBatch) {
    latch->kv_mode = KvMode::kPerMicroBatch;
    latch->reason = "policy per_micro_batch → per_micro_batch";
    return;
  }
  // ZeRO 2 keeps only the DP-reduced partition of the gradient, but every TP rank's partition
  // has the same layout and the TP sum commutes with the DP reduce-scatter: the K/V sum runs on
  // the partition at the boundary.
  const std::string zero = spec.zero_stage == 2
                               ? std::string("ZeRO 2: K/V summed on the gradient partition")
                               : absl::StrCat("ZeRO ", spec.zero_stage);
  if (BoundaryReductionAllowed(spec.zero_stage)) {
    latch->kv_mode = requested;
    latch->reason = policy == KvReducePolicy::kAuto
                        ? absl::StrCat("auto: boundary reduction allowed (", zero, ")", arrow)
                        : absl::StrCat("policy ", KvReducePolicyName(policy),
                                       ": boundary reduction allowed (", zero, ")", arrow);
    return;
  }
  latch->kv_mode = KvMode::kPerMicroBatch;
  latch->reason = absl::StrCat(
      policy == KvReducePolicy::kAuto
          ? absl::StrCat("auto: boundary reduction not allowed under ", zero)
          : absl::StrCat("policy ", KvReducePolicyName(policy), " not allowed under ", zero),
      ": K/V gradient leaves the local buffer before the boundary → per_micro_batch");
}

}  // namespace

bool BoundaryReductionAllowed(int zero_stage) { return zero_stage >= 0 && zero_stage <= 2; }

LatchPolicy InitialPolicy(const JobSpec& spec) {
  LatchPolicy policy;
  policy.kv_reduce = spec.kv_reduce;
  policy.no_sync = spec.no_sync;
  return policy;
}

int64_t SamplesPerMicroBatch(const JobSpec& spec) {
  return static_cast<int64_t>(spec.dp()) * spec.micro_batch_size;
}

Latch DecideLatch(const JobSpec& spec, const LatchPolicy& policy, int64_t window,
                  int64_t first_micro_batch, int64_t first_sample) {
  Latch latch;
  latch.window = window;
  latch.generation = policy.generation;
  latch.first_micro_batch = first_micro_batch;
  latch.first_sample =
      first_sample >= 0 ? first_sample : first_micro_batch * SamplesPerMicroBatch(spec);
  latch.n = spec.managed_gradient_accumulation && policy.gradient_accumulation_steps > 0
                ? policy.gradient_accumulation_steps
                : spec.WindowLength(window);
  if (latch.n < 1) latch.n = 1;  // a window always ends in a boundary micro-batch

  const size_t n = static_cast<size_t>(latch.n);
  if (policy.no_sync.size() == n) {
    latch.no_sync = policy.no_sync;
  } else {
    latch.no_sync.assign(n, true);
  }
  latch.no_sync.back() = false;  // the boundary micro-batch always reduces over DP

  DecideKvMode(spec, policy.kv_reduce, &latch);
  return latch;
}

int ReplicaMicroBatches(const Latch& latch, int dp_rank) {
  if (latch.replica_micro_batches.empty()) return latch.n;
  return latch.replica_micro_batches.at(static_cast<size_t>(dp_rank));
}

Latch ReplicaLatch(const Latch& latch, int count) {
  if (count <= 0 || count == latch.n) return latch;
  Latch replica = latch;
  replica.n = count;
  replica.no_sync.assign(static_cast<size_t>(count), true);
  replica.no_sync.back() = false;
  return replica;
}

int64_t MicroBatchSlot(const std::vector<int>& split, int dp, int d, int j) {
  if (split.empty()) return static_cast<int64_t>(j) * dp + d;
  // Rounds 0 .. j-1 dealt min(c_e, j) slots to each replica e; round j one to each replica
  // before d that has a j-th micro-batch.
  int64_t slot = 0;
  for (int e = 0; e < dp; ++e) {
    const int c = split[static_cast<size_t>(e)];
    slot += std::min(c, j);
    if (e < d && c > j) slot++;
  }
  return slot;
}

std::string SplitProblem(const Latch& latch, int dp, const std::vector<int>& split) {
  if (static_cast<int>(split.size()) != dp) {
    return absl::StrCat(split.size(), " entries for ", dp, " replicas");
  }
  int64_t sum = 0;
  for (int c : split) {
    if (c < 1) return absl::StrCat("a replica with ", c, " micro-batches (at least 1 each)");
    sum += c;
  }
  if (sum != static_cast<int64_t>(latch.n) * dp) {
    return absl::StrCat("the counts sum to ", sum, ", not n * DP = ", latch.n, " * ", dp);
  }
  for (size_t i = 0; i + 1 < latch.no_sync.size(); ++i) {
    if (!latch.no_sync[i]) {
      return absl::StrCat("micro-batch ", i,
                          " reduces over DP mid-window (no_sync false), which every replica "
                          "must reach alike");
    }
  }
  return "";
}

bool Latch::operator==(const Latch& o) const {
  return std::tie(job_id, window, generation, first_micro_batch, first_sample, n, kv_mode, no_sync,
                  reason, replica_micro_batches) ==
         std::tie(o.job_id, o.window, o.generation, o.first_micro_batch, o.first_sample, o.n,
                  o.kv_mode, o.no_sync, o.reason, o.replica_micro_batches);
}

}  // namespace latchkey
