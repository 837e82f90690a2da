// KvReducer over a real two-rank Gloo TP group (threads as ranks).
#include "worker/train/kv_reducer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "tests/support/rank_threads.h"

namespace latchkey {
namespace {

// A flat buffer of 10 floats: [0,3) sharded, [3,6) K/V weight rows, [6,8) sharded, [8,10) K/V
// bias rows.
std::vector<FlatSegment> Segments() {
  return {{0, 3, false, false}, {3, 3, true, true}, {6, 2, false, false}, {8, 2, true, true}};
}

const FlatOps* Cpu() {
  static const std::unique_ptr<FlatOps> ops = *MakeFlatOps(c10::Device(c10::kCPU));
  return ops.get();
}

// The test's gradient vector as the flat tensor the reducer takes (same memory).
at::Tensor Flat(std::vector<float>& grads) {
  return at::from_blob(grads.data(), {static_cast<int64_t>(grads.size())}, at::kFloat);
}

template <typename Fn>
void TwoRanks(Fn fn) {
  testing::RunRankThreads(2, 2, fn);
}

// Simulates a backward: adds contribution (rank+1)*scale to every element.
void Backward(std::vector<float>& grads, KvReducer& kv, int rank, float scale) {
  for (float& g : grads) g += (rank + 1) * scale;
  kv.NoteBackward();
}

TEST(KvReducer, CoalescedIsOneCollectiveAndSumsKvRowsOnly) {
  TwoRanks([](comm::ProcessGroups& g) {
    KvReducer kv(Segments(), g.tp_group.get(), Cpu());
    ASSERT_TRUE(kv.active());
    std::vector<float> grads(10, 0.0f);
    kv.BeginWindow();
    Backward(grads, kv, g.rank, 1.0f);
    ASSERT_TRUE(kv.ReducePending(Flat(grads), /*coalesced=*/true).ok());
    EXPECT_EQ(g.stats->TaggedCalls(comm::kKvTag), 1);
    for (int i : {3, 4, 5, 8, 9}) EXPECT_EQ(grads[i], 3.0f);           // 1 + 2
    for (int i : {0, 1, 2, 6, 7}) EXPECT_EQ(grads[i], g.rank + 1.0f);  // untouched
  });
}

TEST(KvReducer, PerTensorIssuesOneCollectivePerSegment) {
  TwoRanks([](comm::ProcessGroups& g) {
    KvReducer kv(Segments(), g.tp_group.get(), Cpu());
    std::vector<float> grads(10, 0.0f);
    kv.BeginWindow();
    Backward(grads, kv, g.rank, 1.0f);
    ASSERT_TRUE(kv.ReducePending(Flat(grads), /*coalesced=*/false).ok());
    EXPECT_EQ(g.stats->TaggedCalls(comm::kKvTag), 2);
    // Per micro-batch: a second backward adds to already-reduced rows; only the new part is
    // summed, never the whole buffer again.
    Backward(grads, kv, g.rank, 10.0f);
    ASSERT_TRUE(kv.ReducePending(Flat(grads), false).ok());
    EXPECT_EQ(g.stats->TaggedCalls(comm::kKvTag), 4);
    for (int i : {3, 4, 5, 8, 9}) EXPECT_FLOAT_EQ(grads[i], 3.0f + 30.0f);
  });
}

TEST(KvReducer, ReentrantBoundaryReducesOnlyNewRows) {
  TwoRanks([](comm::ProcessGroups& g) {
    KvReducer kv(Segments(), g.tp_group.get(), Cpu());
    std::vector<float> grads(10, 0.0f);
    kv.BeginWindow();
    Backward(grads, kv, g.rank, 1.0f);
    Backward(grads, kv, g.rank, 2.0f);
    ASSERT_TRUE(kv.ReducePending(Flat(grads), true).ok());
    const std::vector<float> after_first = grads;
    EXPECT_EQ(g.stats->TaggedCalls(comm::kKvTag), 1);
    for (int i : {3, 8}) EXPECT_FLOAT_EQ(grads[i], 9.0f);  // (1+2) * (1+2)

    // Requested again with nothing added: no collective, nothing changes.
    ASSERT_TRUE(kv.ReducePending(Flat(grads), true).ok());
    EXPECT_EQ(g.stats->TaggedCalls(comm::kKvTag), 1);
    EXPECT_EQ(grads, after_first);

    // A backward in between: exactly the added contribution is reduced.
    Backward(grads, kv, g.rank, 5.0f);
    ASSERT_TRUE(kv.ReducePending(Flat(grads), true).ok());
    EXPECT_EQ(g.stats->TaggedCalls(comm::kKvTag), 2);
    for (int i : {3, 4, 5, 8, 9}) EXPECT_FLOAT_EQ(grads[i], 9.0f + 15.0f);
    for (int i : {0, 6}) EXPECT_FLOAT_EQ(grads[i], (g.rank + 1) * 8.0f);
  });
}

TEST(KvReducer, DisabledSwitchLeavesRowsPartial) {
  TwoRanks([](comm::ProcessGroups& g) {
    KvReducer kv(Segments(), g.tp_group.get(), Cpu());
    kv.set_enabled_for_testing(false);
    std::vector<float> grads(10, 0.0f);
    kv.BeginWindow();
    Backward(grads, kv, g.rank, 1.0f);
    ASSERT_TRUE(kv.ReducePending(Flat(grads), true).ok());
    EXPECT_EQ(g.stats->TaggedCalls(comm::kKvTag), 0);
    EXPECT_EQ(grads[3], g.rank + 1.0f);
  });
}

TEST(KvReducer, InactiveWithoutParallelTpGroup) {
  comm::ProcessGroups g = comm::MakeSingleProcessGroups();
  KvReducer kv(Segments(), g.tp_group.get(), Cpu());
  EXPECT_FALSE(kv.active());
  std::vector<float> grads(10, 1.0f);
  kv.BeginWindow();
  kv.NoteBackward();
  ASSERT_TRUE(kv.ReducePending(Flat(grads), true).ok());
  EXPECT_EQ(g.stats->TotalCalls(), 0);
}

}  // namespace
}  // namespace latchkey
