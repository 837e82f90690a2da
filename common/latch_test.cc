#include "common/latch.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace latchkey {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Specs are built directly (not parsed): the gate's table also covers ZeRO 3, which the parser
// refuses.
JobSpec Spec(int zero_stage, int tp, bool multi_query, int gas) {
  JobSpec spec;
  spec.zero_stage = zero_stage;
  spec.tp = tp;
  spec.world_size = tp;
  spec.model.multi_query = multi_query;
  spec.gradient_accumulation_steps = gas;
  return spec;
}

LatchPolicy Policy(KvReducePolicy p) {
  LatchPolicy policy;
  policy.kv_reduce = p;
  return policy;
}

const KvReducePolicy kPolicies[] = {KvReducePolicy::kAuto, KvReducePolicy::kPerMicroBatch,
                                    KvReducePolicy::kDeferred, KvReducePolicy::kCoalesced};

// The expected answer, written out by hand per (policy, situation) instead of re-deriving it.
struct Expected {
  KvMode no_collective;  // tp == 1 or MHA: the policy's own mode (auto → coalesced)
  KvMode allowed;        // MQA, tp > 1, ZeRO 0/1/2
  KvMode not_allowed;    // MQA, tp > 1, ZeRO 3
};
Expected ExpectedFor(KvReducePolicy p) {
  switch (p) {
    case KvReducePolicy::kAuto:
      return {KvMode::kCoalesced, KvMode::kCoalesced, KvMode::kPerMicroBatch};
    case KvReducePolicy::kPerMicroBatch:
      return {KvMode::kPerMicroBatch, KvMode::kPerMicroBatch, KvMode::kPerMicroBatch};
    case KvReducePolicy::kDeferred:
      return {KvMode::kDeferred, KvMode::kDeferred, KvMode::kPerMicroBatch};
    case KvReducePolicy::kCoalesced:
      return {KvMode::kCoalesced, KvMode::kCoalesced, KvMode::kPerMicroBatch};
  }
  return {};
}

// policy × ZeRO 0..3 × n 1/4 × MHA/MQA × tp 1/2: every input that changes the gate's answer.
TEST(LatchGateTest, Table) {
  int cases = 0;
  for (KvReducePolicy policy : kPolicies) {
    for (int zero = 0; zero <= 3; ++zero) {
      for (int n : {1, 4}) {
        for (bool mqa : {false, true}) {
          for (int tp : {1, 2}) {
            const JobSpec spec = Spec(zero, tp, mqa, n);
            const Latch latch = DecideLatch(spec, Policy(policy), 3, 12);
            const std::string where = std::string(KvReducePolicyName(policy)) +
                                      " zero=" + std::to_string(zero) + " n=" + std::to_string(n) +
                                      (mqa ? " mqa" : " mha") + " tp=" + std::to_string(tp);
            const Expected e = ExpectedFor(policy);
            const bool collective = mqa && tp > 1;
            const bool allowed = zero <= 2;
            const KvMode mode =
                !collective ? e.no_collective : (allowed ? e.allowed : e.not_allowed);
            EXPECT_EQ(latch.kv_mode, mode) << where;
            EXPECT_EQ(latch.n, n) << where;
            ASSERT_EQ(latch.no_sync.size(), static_cast<size_t>(n)) << where;
            for (int i = 0; i < n; ++i) EXPECT_EQ(latch.no_sync[i], i < n - 1) << where;
            EXPECT_EQ(latch.window, 3) << where;
            EXPECT_EQ(latch.first_micro_batch, 12) << where;
            EXPECT_EQ(latch.generation, 0) << where;
            EXPECT_THAT(latch.reason, HasSubstr(KvModeName(mode))) << where;
            if (tp == 1) {
              EXPECT_THAT(latch.reason, HasSubstr("tp=1: no TP group, no K/V collective")) << where;
            } else if (!mqa) {
              EXPECT_THAT(latch.reason, HasSubstr("MHA: no replicated K/V rows")) << where;
            } else if (policy != KvReducePolicy::kPerMicroBatch) {
              EXPECT_THAT(latch.reason, HasSubstr("ZeRO " + std::to_string(zero))) << where;
              EXPECT_THAT(latch.reason, HasSubstr(allowed ? "allowed" : "not allowed")) << where;
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 4 * 2 * 2 * 2);
}

TEST(LatchGateTest, Reasons) {
  EXPECT_EQ(DecideLatch(Spec(1, 2, true, 4), Policy(KvReducePolicy::kAuto), 0, 0).reason,
            "auto: boundary reduction allowed (ZeRO 1) → coalesced");
  EXPECT_EQ(DecideLatch(Spec(2, 2, true, 4), Policy(KvReducePolicy::kDeferred), 0, 0).reason,
            "policy deferred: boundary reduction allowed (ZeRO 2: K/V summed on the gradient "
            "partition) → deferred");
  EXPECT_EQ(DecideLatch(Spec(2, 2, true, 4), Policy(KvReducePolicy::kAuto), 0, 0).reason,
            "auto: boundary reduction allowed (ZeRO 2: K/V summed on the gradient partition) → "
            "coalesced");
  EXPECT_EQ(DecideLatch(Spec(3, 2, true, 4), Policy(KvReducePolicy::kAuto), 0, 0).reason,
            "auto: boundary reduction not allowed under ZeRO 3: K/V gradient leaves the local "
            "buffer before the boundary → per_micro_batch");
  EXPECT_EQ(DecideLatch(Spec(0, 2, true, 4), Policy(KvReducePolicy::kPerMicroBatch), 0, 0).reason,
            "policy per_micro_batch → per_micro_batch");
  EXPECT_EQ(DecideLatch(Spec(0, 1, true, 4), Policy(KvReducePolicy::kAuto), 0, 0).reason,
            "tp=1: no TP group, no K/V collective; auto → coalesced");
  EXPECT_EQ(DecideLatch(Spec(0, 2, false, 4), Policy(KvReducePolicy::kDeferred), 0, 0).reason,
            "MHA: no replicated K/V rows; deferred → deferred");
}

TEST(LatchGateTest, BoundaryReductionAllowed) {
  EXPECT_TRUE(BoundaryReductionAllowed(0));
  EXPECT_TRUE(BoundaryReductionAllowed(1));
  EXPECT_TRUE(BoundaryReductionAllowed(2));
  EXPECT_FALSE(BoundaryReductionAllowed(3));
}

TEST(LatchGateTest, GasOverride) {
  LatchPolicy policy = Policy(KvReducePolicy::kAuto);
  policy.gradient_accumulation_steps = 2;
  EXPECT_EQ(DecideLatch(Spec(1, 2, true, 4), policy, 0, 0).n, 2);
  EXPECT_THAT(DecideLatch(Spec(1, 2, true, 4), policy, 0, 0).no_sync, ElementsAre(true, false));
  policy.gradient_accumulation_steps = 0;  // unset: the spec's
  EXPECT_EQ(DecideLatch(Spec(1, 2, true, 4), policy, 0, 0).n, 4);
  policy.gradient_accumulation_steps = -3;  // not > 0: ignored
  EXPECT_EQ(DecideLatch(Spec(1, 2, true, 4), policy, 0, 0).n, 4);

  // Unmanaged windows take n_s from the schedule; the override does not apply.
  JobSpec spec = Spec(1, 2, true, 4);
  spec.managed_gradient_accumulation = false;
  spec.window_schedule = {1, 2, 3};
  policy.gradient_accumulation_steps = 5;
  EXPECT_EQ(DecideLatch(spec, policy, 0, 0).n, 1);
  EXPECT_EQ(DecideLatch(spec, policy, 1, 1).n, 2);
  EXPECT_EQ(DecideLatch(spec, policy, 9, 21).n, 3);
}

TEST(LatchGateTest, NoSyncMaskOverride) {
  LatchPolicy policy = Policy(KvReducePolicy::kAuto);
  policy.no_sync = {false, true, false, true};  // last entry forced false
  EXPECT_THAT(DecideLatch(Spec(0, 2, true, 4), policy, 0, 0).no_sync,
              ElementsAre(false, true, false, false));
  policy.no_sync = {false, false, false, false};  // DP mean after every micro-batch
  EXPECT_THAT(DecideLatch(Spec(0, 2, true, 4), policy, 0, 0).no_sync,
              ElementsAre(false, false, false, false));
  policy.no_sync = {false, false};  // wrong length: default
  EXPECT_THAT(DecideLatch(Spec(0, 2, true, 4), policy, 0, 0).no_sync,
              ElementsAre(true, true, true, false));
  policy.no_sync = {true};  // n = 1: the only micro-batch is the boundary
  EXPECT_THAT(DecideLatch(Spec(0, 2, true, 1), policy, 0, 0).no_sync, ElementsAre(false));
  // The mask's length is checked against the overridden n.
  policy.gradient_accumulation_steps = 2;
  policy.no_sync = {false, true};
  EXPECT_THAT(DecideLatch(Spec(0, 2, true, 4), policy, 0, 0).no_sync, ElementsAre(false, false));
}

TEST(LatchGateTest, PassesThroughGenerationAndPosition) {
  LatchPolicy policy = Policy(KvReducePolicy::kCoalesced);
  policy.generation = 7;
  const Latch latch = DecideLatch(Spec(0, 2, true, 4), policy, 41, 123456789012LL);
  EXPECT_EQ(latch.generation, 7);
  EXPECT_EQ(latch.window, 41);
  EXPECT_EQ(latch.first_micro_batch, 123456789012LL);
  EXPECT_TRUE(latch.job_id.empty());  // the caller names the job
}

TEST(LatchGateTest, Pure) {
  JobSpec spec = Spec(1, 2, true, 4);
  spec.managed_gradient_accumulation = false;
  spec.window_schedule = {2, 4};
  LatchPolicy policy = Policy(KvReducePolicy::kDeferred);
  policy.no_sync = {false, true, true, true};
  policy.generation = 3;
  for (int64_t s = 0; s < 4; ++s) {
    const int64_t m = spec.FirstMicroBatch(s);
    const Latch a = DecideLatch(spec, policy, s, m);
    const Latch b = DecideLatch(spec, policy, s, m);
    EXPECT_EQ(a, b);
    EXPECT_FALSE(a != b);
  }
}

TEST(LatchGateTest, InitialPolicy) {
  JobSpec spec = Spec(1, 2, true, 4);
  spec.kv_reduce = KvReducePolicy::kDeferred;
  const LatchPolicy policy = InitialPolicy(spec);
  EXPECT_EQ(policy.kv_reduce, KvReducePolicy::kDeferred);
  EXPECT_EQ(policy.gradient_accumulation_steps, 0);
  EXPECT_TRUE(policy.no_sync.empty());
  EXPECT_EQ(policy.generation, 0);
  EXPECT_EQ(DecideLatch(spec, policy, 0, 0).kv_mode, KvMode::kDeferred);
}

TEST(LatchTest, EqualityComparesEveryField) {
  const Latch base = DecideLatch(Spec(1, 2, true, 4), Policy(KvReducePolicy::kAuto), 2, 8);
  std::vector<Latch> changed(9, base);
  changed[0].job_id = "job-1";
  changed[1].window = 3;
  changed[2].generation = 1;
  changed[3].first_micro_batch = 9;
  changed[4].n = 5;
  changed[5].kv_mode = KvMode::kDeferred;
  changed[6].no_sync[0] = false;
  changed[7].reason = "other";
  changed[8].replica_micro_batches = {3, 1};
  EXPECT_EQ(base, base);
  for (const Latch& c : changed) EXPECT_NE(base, c);
}

// The even split's slots are the layout's order (micro-batch j of replica d reads slot
// j * DP + d), and every split deals each of the window's n * DP slots to exactly one
// (replica, micro-batch), in increasing order within a replica.
TEST(MicroBatchSlotTest, EveryValidSplitCoversTheWindowsSlotsOnce) {
  for (int dp : {1, 2, 3, 4}) {
    for (int j = 0; j < 5; ++j) {
      for (int d = 0; d < dp; ++d) EXPECT_EQ(MicroBatchSlot({}, dp, d, j), j * dp + d);
      EXPECT_EQ(MicroBatchSlot(std::vector<int>(static_cast<size_t>(dp), 5), dp, dp - 1, j),
                j * dp + dp - 1);
    }
  }
  const std::vector<std::vector<int>> splits = {{3, 1}, {1, 3}, {5, 1, 2}, {1, 1, 6}, {2, 7, 1, 2}};
  for (const std::vector<int>& split : splits) {
    const int dp = static_cast<int>(split.size());
    int total = 0;
    for (int c : split) total += c;
    std::vector<int> seen(static_cast<size_t>(total), 0);
    for (int d = 0; d < dp; ++d) {
      int64_t previous = -1;
      for (int j = 0; j < split[static_cast<size_t>(d)]; ++j) {
        const int64_t slot = MicroBatchSlot(split, dp, d, j);
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, total);
        seen[static_cast<size_t>(slot)]++;
        EXPECT_GT(slot, previous);
        previous = slot;
      }
    }
    for (int k = 0; k < total; ++k) EXPECT_EQ(seen[static_cast<size_t>(k)], 1) << "slot " << k;
  }
  // Round by round: {3, 1} deals slots 0 and 1 to replicas 0 and 1, then 2 and 3 to replica 0.
  EXPECT_EQ(MicroBatchSlot({3, 1}, 2, 0, 0), 0);
  EXPECT_EQ(MicroBatchSlot({3, 1}, 2, 1, 0), 1);
  EXPECT_EQ(MicroBatchSlot({3, 1}, 2, 0, 1), 2);
  EXPECT_EQ(MicroBatchSlot({3, 1}, 2, 0, 2), 3);
}

TEST(MicroBatchSlotTest, SplitProblemNamesWhatIsWrong) {
  const Latch l = DecideLatch(Spec(1, 2, true, 4), Policy(KvReducePolicy::kAuto), 0, 0);
  ASSERT_EQ(l.n, 4);
  EXPECT_EQ(SplitProblem(l, 2, {5, 3}), "");
  EXPECT_NE(SplitProblem(l, 2, {5, 3, 0}).find("3 entries for 2 replicas"), std::string::npos);
  EXPECT_NE(SplitProblem(l, 2, {8, 0}).find("at least 1 each"), std::string::npos);
  EXPECT_NE(SplitProblem(l, 2, {5, 4}).find("sum to 9, not n * DP = 4 * 2"), std::string::npos);
  Latch synced = l;
  synced.no_sync[1] = false;
  EXPECT_NE(SplitProblem(synced, 2, {5, 3}).find("micro-batch 1 reduces over DP mid-window"),
            std::string::npos);
}

TEST(MicroBatchSlotTest, ReplicaLatchIsTheReplicasShareWithItsLastTheBoundary) {
  const Latch l = DecideLatch(Spec(1, 2, true, 4), Policy(KvReducePolicy::kAuto), 0, 0);
  ASSERT_EQ(l.n, 4);
  const Latch more = ReplicaLatch(l, 6);
  EXPECT_EQ(more.n, 6);
  EXPECT_EQ(more.no_sync, (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_EQ(more.window, l.window);
  EXPECT_EQ(more.kv_mode, l.kv_mode);
  const Latch fewer = ReplicaLatch(l, 1);
  EXPECT_EQ(fewer.n, 1);
  EXPECT_EQ(fewer.no_sync, std::vector<bool>{false});
  EXPECT_EQ(ReplicaLatch(l, 4).no_sync, l.no_sync);  // its own n: the latch itself
  EXPECT_EQ(ReplicaLatch(l, 0).n, 4);                // unknown: the latch itself
}

}  // namespace
}  // namespace latchkey
