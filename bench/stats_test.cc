#include "bench/stats.h"

#include <gtest/gtest.h>

namespace latchkey::bench {
namespace {

TEST(BenchStats, MedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  EXPECT_DOUBLE_EQ(Median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(Median({10.0, 1.0}), 5.5);
}

TEST(BenchStats, MedianOfAnOddCountIsTheMiddleValue) {
  EXPECT_DOUBLE_EQ(Median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_DOUBLE_EQ(Median({7.0}), 7.0);
  EXPECT_DOUBLE_EQ(Median({}), 0.0);
}

TEST(BenchStats, Spread) {
  EXPECT_DOUBLE_EQ(Min({3.0, 1.5, 2.0}), 1.5);
  EXPECT_DOUBLE_EQ(Max({3.0, 1.5, 2.0}), 3.0);
}

}  // namespace
}  // namespace latchkey::bench
