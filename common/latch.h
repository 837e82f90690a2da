// The accumulation-window latch and the gate that decides it (docs/protocol.md "The gate").
//
// The gate is a pure function of (job spec, policy, window, data position). The coordinator
// publishes its answers; in standalone mode every rank computes the same latch locally. Both
// call DecideLatch, so the rule exists exactly once.
#ifndef LATCHKEY_COMMON_LATCH_H_
#define LATCHKEY_COMMON_LATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace latchkey {

// The live, user-changeable part of a job's configuration (UpdateJobPolicy). A field that is
// unset keeps the spec's value.
struct LatchPolicy {
  KvReducePolicy kv_reduce = KvReducePolicy::kAuto;
  int gradient_accumulation_steps = 0;  // 0 = from the spec
  // no_sync mask override, one entry per micro-batch of the window; empty = default
  // (every micro-batch but the last is no_sync). Ignored unless its length equals n_s.
  std::vector<bool> no_sync;
  int64_t generation = 0;  // bumps on every policy change
};

// The policy a freshly submitted job starts with.
LatchPolicy InitialPolicy(const JobSpec& spec);

struct Latch {
  std::string job_id;
  int64_t window = 0;             // s
  int64_t generation = 0;         // policy generation it was decided under
  int64_t first_micro_batch = 0;  // M_s
  // Global stream positions (samples) consumed before window s, over every DP rank: window s
  // reads [first_sample, first_sample + n * DP * MB) (docs/data.md).
  int64_t first_sample = 0;
  int n = 1;  // n_s
  KvMode kv_mode = KvMode::kPerMicroBatch;
  std::vector<bool> no_sync;  // size n; the last entry is always false
  std::string reason;         // why this kv_mode (human-readable)
  // Rebalancing (latchkey.stragglers.rebalance): the micro-batches each DP replica computes,
  // indexed by dp rank, whole, at least 1 each, summing to n * DP. Empty: n each (even).
  std::vector<int> replica_micro_batches;

  bool operator==(const Latch& o) const;
  bool operator!=(const Latch& o) const { return !(*this == o); }
};

// The gate. Pure: same inputs, same latch. `first_micro_batch` is M_s and `first_sample` the
// global stream positions consumed before the window (the caller tracks both: a policy change
// of accumulation steps moves them, and a change of DP moves M_s but not first_sample); -1 means
// the spec's fixed layout, M_s * spec.dp() * MB. n_s comes from the policy's GAS override when
// set (managed windows), else spec.WindowLength(window).
Latch DecideLatch(const JobSpec& spec, const LatchPolicy& policy, int64_t window,
                  int64_t first_micro_batch, int64_t first_sample = -1);

// The micro-batches DP replica `dp_rank` computes in the window: its entry of
// replica_micro_batches, or n when the split is even (empty).
int ReplicaMicroBatches(const Latch& latch, int dp_rank);

// The window as a replica that computes `count` micro-batches of it runs it: n = count, every
// micro-batch before its last under no_sync (an uneven split allows no other: SplitProblem).
// The latch itself when count is its n (or not positive: unknown).
Latch ReplicaLatch(const Latch& latch, int count);

// The window's micro-batch slot (0 .. n*DP-1; slot k reads the stream positions
// [first_sample + k*MB, first_sample + (k+1)*MB)) of micro-batch j of DP replica d under
// `split` (replica_micro_batches; empty = even). The slots are dealt round by round, in replica
// order, to the replicas that have a j-th micro-batch (docs/data.md "Uneven micro-batches"), so
// the even split gives slot j*DP + d, the layout's order, and every split covers the same
// slots: the window reads the same samples, each at the same stream position.
int64_t MicroBatchSlot(const std::vector<int>& split, int dp, int d, int j);

// Why `split` cannot be the latch's (empty when it can): one entry per replica, each >= 1,
// summing to n * dp, and no_sync true before the boundary (a mid-window DP reduction would be
// issued by replicas at different micro-batches).
std::string SplitProblem(const Latch& latch, int dp, const std::vector<int>& split);

// The stream positions one micro-batch of `spec`'s layout consumes over all DP ranks (DP * MB).
int64_t SamplesPerMicroBatch(const JobSpec& spec);

// Whether this ZeRO stage can run the window's K/V sum at the boundary: 0/1 (the K/V gradient
// stays in one local buffer until then) and 2 (on the gradient partition: the TP sum commutes
// with the DP reduce-scatter and every TP rank's partition has the same layout); not 3 (the
// parameters themselves are partitioned). Exposed for the gate's table test.
bool BoundaryReductionAllowed(int zero_stage);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_LATCH_H_
