// latchkey.elastic and latchkey.rejoin_timeout_seconds: parsing, the canonical JSON, the
// refusals naming the field, and ElasticDp, the choice of dp' elastic recovery makes.
#include <string>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/specs.h"

namespace latchkey {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// DP2 x TP2, GAS 1.
json Example() {
  json j = testing::ExampleSpecJson();
  j["latchkey"]["world_size"] = 4;
  return j;
}

absl::StatusOr<JobSpec> Parse(const json& j) { return ParseJobSpec(j.dump(), "/jobs/a"); }

TEST(ElasticSpecTest, AbsentIsTodaysBehaviour) {
  absl::StatusOr<JobSpec> spec = Parse(Example());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->elastic.enabled());
  EXPECT_EQ(spec->rejoin_timeout_seconds, 0);  // 0: the coordinator's liveness timeout
  EXPECT_EQ(json::parse(JobSpecToJson(*spec))["latchkey"].count("elastic"), 0u);
}

TEST(ElasticSpecTest, ParsesAndRoundTrips) {
  json j = Example();
  j["latchkey"]["elastic"] = {{"min_dp", 1}};
  j["latchkey"]["rejoin_timeout_seconds"] = 7.5;
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->elastic.enabled());
  EXPECT_EQ(spec->elastic.min_dp, 1);
  EXPECT_EQ(spec->rejoin_timeout_seconds, 7.5);
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToJson(*spec), "/elsewhere");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *spec);
  absl::StatusOr<JobSpec> plain = Parse(Example());
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(*back, *plain);
}

struct Refusal {
  std::string name;
  json elastic;
  int world_size;
  int gas;
  std::string field;
  std::string reason;
};

TEST(ElasticSpecTest, Refusals) {
  const Refusal cases[] = {
      {"MinDpZero", {{"min_dp", 0}}, 4, 1, "latchkey.elastic.min_dp", "must be >= 1"},
      {"MinDpMissing", json::object(), 4, 1, "latchkey.elastic.min_dp", "required"},
      {"UnknownKey", {{"min_dp", 1}, {"max_dp", 2}}, 4, 1, "latchkey.elastic.max_dp", ""},
      {"MinDpAboveDp", {{"min_dp", 3}}, 4, 1, "latchkey.elastic.min_dp", "exceeds the spec's dp"},
      // dp 2: min_dp 2 leaves no smaller dp' at all.
      {"NoSmallerDp", {{"min_dp", 2}}, 4, 1, "latchkey.elastic", "admits no dp'"},
      // dp 4, GAS 1: dp' 3 does not divide 4 (GAS' would be 4/3).
      {"NoIntegerGas", {{"min_dp", 3}}, 8, 1, "latchkey.elastic", "admits no dp'"},
  };
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.name);
    json j = Example();
    j["latchkey"]["elastic"] = c.elastic;
    j["latchkey"]["world_size"] = c.world_size;
    j["gradient_accumulation_steps"] = c.gas;
    absl::StatusOr<JobSpec> spec = Parse(j);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr(c.field + ":"));
    EXPECT_THAT(spec.status().message(), HasSubstr(c.reason));
  }
  json j = Example();
  j["latchkey"]["rejoin_timeout_seconds"] = 0;
  absl::StatusOr<JobSpec> zero = Parse(j);
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("latchkey.rejoin_timeout_seconds:"));

  json unmanaged = Example();
  unmanaged["latchkey"]["elastic"] = {{"min_dp", 1}};
  unmanaged["managed_gradient_accumulation"] = false;
  unmanaged["latchkey"]["window_schedule"] = {2, 1};
  absl::StatusOr<JobSpec> u = Parse(unmanaged);
  ASSERT_FALSE(u.ok());
  EXPECT_THAT(u.status().message(), HasSubstr("latchkey.elastic:"));
  EXPECT_THAT(u.status().message(), HasSubstr("managed windows"));
}

TEST(ElasticSpecTest, NoIntegerGasAtThreeButTwoWorks) {
  // dp 4, GAS 1, min_dp 2: dp' 3 is skipped, dp' 2 (GAS' 2) exists: accepted.
  json j = Example();
  j["latchkey"]["world_size"] = 8;
  j["latchkey"]["elastic"] = {{"min_dp", 2}};
  absl::StatusOr<JobSpec> spec = Parse(j);
  EXPECT_TRUE(spec.ok()) << spec.status();
}

struct DpCase {
  int min_dp, max_dp, tp, workers;
  int64_t global;
  int want;
};

TEST(ElasticSpecTest, ElasticDpTable) {
  const DpCase cases[] = {
      {1, 2, 2, 2, 2, 1},   // DP2xTP2, two ranks left: dp' 1, GAS' 2
      {1, 2, 2, 3, 2, 1},   // a third worker fills no whole TP group
      {1, 2, 2, 4, 2, 2},   // all back: the spec's dp, never above
      {1, 2, 2, 8, 2, 2},   // spares beyond the spec's dp are not used
      {1, 4, 1, 3, 4, 2},   // dp' 3 skipped (4 / 3), dp' 2 taken
      {1, 4, 1, 3, 12, 3},  // GAS 3 x dp 4 = 12: dp' 3 divides, GAS' 4
      {2, 4, 1, 1, 4, 0},   // fewer workers than min_dp
      {3, 4, 1, 3, 4, 0},   // only dp' 3 fits and 4 / 3 is no integer
      {1, 2, 2, 1, 2, 0},   // not even one TP group
      {1, 6, 2, 10, 6, 3},  // 5 groups: dp' 5 skipped (6 / 5), dp' 3 (GAS' 2)
  };
  for (const DpCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "min " << c.min_dp << " max " << c.max_dp << " tp " << c.tp
                                      << " workers " << c.workers << " G " << c.global);
    EXPECT_EQ(ElasticDp(c.min_dp, c.max_dp, c.tp, c.workers, c.global), c.want);
  }
}

}  // namespace
}  // namespace latchkey
