// latchkey.tensorboard: {dir}, relative to the spec's folder, canonical round trip, refusals.
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

// Without TP or a world size: one rank.
json Example() {
  json j = testing::ExampleSpecJson();
  j.erase("tensor_parallel");
  j["latchkey"].erase("world_size");
  return j;
}

absl::StatusOr<JobSpec> Parse(const json& j) { return ParseJobSpec(j.dump(), "/jobs/a"); }

TEST(JobSpecTensorboardTest, AbsentIsOffAndDirResolvesAgainstTheSpecFolder) {
  absl::StatusOr<JobSpec> plain = Parse(Example());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->tensorboard.enabled());
  EXPECT_FALSE(json::parse(JobSpecToJson(*plain))["latchkey"].contains("tensorboard"));

  json j = Example();
  j["latchkey"]["tensorboard"] = {{"dir", "tb"}};
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->tensorboard.enabled());
  EXPECT_EQ(spec->tensorboard.dir, "/jobs/a/tb");
  EXPECT_EQ(json::parse(JobSpecToJson(*spec))["latchkey"]["tensorboard"]["dir"], "/jobs/a/tb");
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToJson(*spec), "/elsewhere");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *spec);
  EXPECT_NE(*back, *plain);

  j["latchkey"]["tensorboard"] = {{"dir", "/abs/tb"}};
  spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tensorboard.dir, "/abs/tb");
}

TEST(JobSpecTensorboardTest, RefusalsNameTheField) {
  const struct {
    json value;
    const char* field;
  } cases[] = {
      {json::object(), "latchkey.tensorboard.dir"},
      {{{"dir", ""}}, "latchkey.tensorboard.dir"},
      {{{"dir", 3}}, "latchkey.tensorboard.dir"},
      {{{"dir", "tb"}, {"flush_secs", 1}}, "latchkey.tensorboard.flush_secs"},
      {"tb", "latchkey.tensorboard"},
  };
  for (const auto& c : cases) {
    json j = Example();
    j["latchkey"]["tensorboard"] = c.value;
    absl::StatusOr<JobSpec> spec = Parse(j);
    ASSERT_FALSE(spec.ok()) << c.value.dump();
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.field)) << c.value.dump();
  }
}

}  // namespace
}  // namespace latchkey
