// StragglerTracker (docs/fault-tolerance.md "Stragglers"): the split that minimises the slowest
// replica's time, naming after `windows` consecutive slow steps and clearing after as many
// fast ones, a rank that only waits (its compute time normal) never named, no names on noise,
// the hysteresis of the split and its return to even.
#include "server/stragglers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace latchkey {
namespace {

StragglerConfig Config(bool rebalance = true) {
  StragglerConfig c;
  c.rebalance = rebalance;
  return c;  // threshold 1.25, windows 3, sample_steps 5
}

// Every rank reports `step`: compute seconds per micro-batch `pace[rank]`, `counts[dp_rank]`
// micro-batches (empty: n each). Its micro-batch seconds (the replica's pace: TP waits
// included) are `wall[rank]` per micro-batch, or its replica's highest compute pace when
// `wall` is empty (the TP peers of a slow rank wait for it).
std::vector<StragglerTracker::Change> Step(StragglerTracker& t, const RankGrid& grid, int64_t step,
                                           const std::vector<double>& pace, int n,
                                           const std::vector<int>& counts = {},
                                           const std::vector<double>& wall = {}) {
  std::vector<StragglerTracker::Change> out;
  for (int r = 0; r < grid.world_size; ++r) {
    const int c = counts.empty() ? n : counts[static_cast<size_t>(grid.dp_rank(r))];
    double w = 0.0;
    if (!wall.empty()) {
      w = wall[static_cast<size_t>(r)];
    } else {
      for (int q = 0; q < grid.tp; ++q) {
        w = std::max(w, pace[static_cast<size_t>(grid.rank(grid.dp_rank(r), q))]);
      }
    }
    auto changes = t.Note(step, r, c, pace[static_cast<size_t>(r)] * c, w * c);
    EXPECT_EQ(changes.has_value(), r == grid.world_size - 1) << "rank " << r;
    if (changes) out = *changes;
  }
  return out;
}

TEST(StragglerSplitTest, MinimisesTheSlowestReplicasTime) {
  // A replica at half speed gets a third of the window.
  EXPECT_EQ(StragglerTracker::Split({1.0, 2.0}, 6), (std::vector<int>{8, 4}));
  EXPECT_EQ(StragglerTracker::Split({2.0, 1.0}, 4), (std::vector<int>{3, 5}));
  // Even paces: the even split.
  EXPECT_EQ(StragglerTracker::Split({1.0, 1.0, 1.0}, 4), (std::vector<int>{4, 4, 4}));
  // At least one each, however slow.
  EXPECT_EQ(StragglerTracker::Split({1.0, 100.0}, 3), (std::vector<int>{5, 1}));
  const std::vector<int> s = StragglerTracker::Split({1.0, 1.3, 0.9, 2.2}, 8);
  int sum = 0;
  for (int c : s) sum += c;
  EXPECT_EQ(sum, 32);
}

TEST(StragglerTrackerTest, NamesAfterWindowsSlowStepsAndClearsAfterAsManyFast) {
  const RankGrid grid{4, 1};
  StragglerTracker t(Config(), grid);
  const std::vector<double> slow = {1.0, 1.02, 2.0, 0.98};
  for (int64_t s = 0; s < 2; ++s) EXPECT_TRUE(Step(t, grid, s, slow, 4).empty());
  std::vector<StragglerTracker::Change> c = Step(t, grid, 2, slow, 4);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 2);
  EXPECT_TRUE(c[0].named);
  EXPECT_EQ(c[0].since_step, 0);
  EXPECT_NEAR(c[0].slowdown, 2.0, 1e-9);  // over the median of the others (1.0)
  ASSERT_EQ(t.named().size(), 1u);
  EXPECT_EQ(t.named()[0].rank, 2);
  EXPECT_NEAR(t.slowdowns()[0], 1.0 / 1.0, 0.03);
  // Fast again: the median of its last 5 steps turns at the third fast one (step 5), and the
  // third step under the threshold (step 7) clears it.
  const std::vector<double> fast = {1.0, 1.0, 1.0, 1.0};
  int64_t s = 3;
  for (; s < 20 && !t.named().empty(); ++s) Step(t, grid, s, fast, 4);
  EXPECT_TRUE(t.named().empty());
  EXPECT_EQ(s, 8);
}

TEST(StragglerTrackerTest, ARankThatOnlyWaitsIsNotNamed) {
  // DP 2 x TP 2, rank 1 slow: its TP peer rank 0 waits for it inside the TP collectives, which
  // compute_seconds leaves out, so rank 0's score stays normal.
  const RankGrid grid{4, 2};
  StragglerTracker t(Config(), grid);
  for (int64_t s = 0; s < 8; ++s) Step(t, grid, s, {1.0, 2.0, 1.0, 1.0}, 4);
  ASSERT_EQ(t.named().size(), 1u);
  EXPECT_EQ(t.named()[0].rank, 1);
}

// The ranks of a replica share a processor: its slowness shows up as waits inside its TP
// collectives, not in any rank's compute; the replica is named, all its ranks.
TEST(StragglerTrackerTest, AReplicaSlowOnlyInItsWallTimeIsNamedWhole) {
  const RankGrid grid{4, 2};
  StragglerTracker t(Config(), grid);
  for (int64_t s = 0; s < 8; ++s) {
    Step(t, grid, s, {1.0, 1.0, 1.1, 1.1}, 4, {}, {2.0, 2.0, 3.0, 3.0});
  }
  const std::vector<StragglerTracker::Named> named = t.named();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].rank, 2);
  EXPECT_EQ(named[1].rank, 3);
  EXPECT_NEAR(named[0].slowdown, 1.5, 1e-9);
  EXPECT_EQ(named[0].since_step, 0);
  EXPECT_EQ(t.SplitFor(6), (std::vector<int>{7, 5}));
}

TEST(StragglerTrackerTest, NoiseNamesNoOne) {
  const RankGrid grid{8, 2};
  StragglerTracker t(Config(), grid);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> noise(0.85, 1.15);
  for (int64_t s = 0; s < 200; ++s) {
    std::vector<double> pace(8);
    for (double& p : pace) p = noise(rng);
    for (const auto& c : Step(t, grid, s, pace, 4)) ADD_FAILURE() << "rank " << c.rank << " named";
    EXPECT_TRUE(t.SplitFor(4).empty()) << "step " << s;
  }
}

TEST(StragglerTrackerTest, TheSplitFollowsTheSlowReplicaAndReturnsToEven) {
  const RankGrid grid{4, 2};  // replicas {0, 1} and {2, 3}
  StragglerTracker t(Config(), grid);
  EXPECT_TRUE(t.SplitFor(6).empty());  // nothing measured yet: even
  std::vector<int> split;
  int64_t s = 0;
  for (; s < 5; ++s) {
    Step(t, grid, s, {1.0, 1.0, 2.0, 1.0}, 6, split);
    split = t.SplitFor(6);
  }
  EXPECT_EQ(split, (std::vector<int>{8, 4}));
  // Measured under the split, the paces are the same: the split stays.
  for (; s < 10; ++s) {
    Step(t, grid, s, {1.0, 1.0, 2.0, 1.0}, 6, split);
    EXPECT_EQ(t.SplitFor(6), split) << "step " << s;
  }
  // The slowdown goes: within a few steps the split is even again.
  int64_t even_at = -1;
  for (; s < 20; ++s) {
    Step(t, grid, s, {1.0, 1.0, 1.0, 1.0}, 6, split);
    split = t.SplitFor(6);
    if (split.empty() && even_at < 0) even_at = s;
  }
  EXPECT_GE(even_at, 10);
  EXPECT_LE(even_at, 13);
  // A small gain does not move it (1.1x: 7/5 would take 7 against 6.6 even).
  for (; s < 30; ++s) Step(t, grid, s, {1.0, 1.0, 1.1, 1.0}, 6);
  EXPECT_TRUE(t.SplitFor(6).empty());
}

TEST(StragglerTrackerTest, ANewLayoutStartsOver) {
  StragglerTracker t(Config(), RankGrid{2, 1});
  for (int64_t s = 0; s < 5; ++s) Step(t, RankGrid{2, 1}, s, {1.0, 3.0}, 4);
  EXPECT_EQ(t.named().size(), 1u);
  EXPECT_FALSE(t.SplitFor(4).empty());
  t.NewAttempt(RankGrid{2, 1});  // same layout: what was measured stays
  EXPECT_EQ(t.named().size(), 1u);
  t.NewAttempt(RankGrid{4, 1});
  EXPECT_TRUE(t.named().empty());
  EXPECT_TRUE(t.SplitFor(4).empty());
}

}  // namespace
}  // namespace latchkey
