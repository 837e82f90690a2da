// The memory keys: latchkey.activation_checkpointing, tensor_parallel.sequence_parallel and
// zero_optimization.stage 2: defaults, parsing, the canonical JSON and the refusals naming the
// field.
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/specs.h"

namespace latchkey {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using testing::ExampleSpecJson;
using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<JobSpec> Parse(const json& j) { return ParseJobSpec(j.dump(), "/jobs/a"); }

TEST(MemorySpecTest, DefaultsAndParsing) {
  absl::StatusOr<JobSpec> spec = Parse(ExampleSpecJson());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->activation_checkpointing.mode, RecomputeMode::kNone);
  EXPECT_EQ(spec->activation_checkpointing.every_layers, 1);
  EXPECT_FALSE(spec->sequence_parallel);
  EXPECT_EQ(spec->zero_stage, 0);
  EXPECT_FALSE(spec->overlap_dp_reduction);

  json j = ExampleSpecJson();
  j["zero_optimization"]["stage"] = 2;
  j["tensor_parallel"]["sequence_parallel"] = true;
  j["latchkey"]["activation_checkpointing"] = {{"mode", "selective"}};
  spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->zero_stage, 2);
  EXPECT_TRUE(spec->sequence_parallel);
  EXPECT_EQ(spec->activation_checkpointing.mode, RecomputeMode::kSelective);

  j["latchkey"]["activation_checkpointing"] = {{"mode", "full"}, {"every_layers", 2}};
  spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->activation_checkpointing.mode, RecomputeMode::kFull);
  EXPECT_EQ(spec->activation_checkpointing.every_layers, 2);

  // With tp 1 there is nothing to shard: off, and said so.
  j["tensor_parallel"]["autotp_size"] = 1;
  j["latchkey"]["world_size"] = 1;
  spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->sequence_parallel);
  EXPECT_THAT(spec->warnings, ElementsAre(HasSubstr("tensor_parallel.sequence_parallel: ignored")));
}

TEST(MemorySpecTest, CanonicalJsonRoundTrip) {
  json j = ExampleSpecJson();
  j["zero_optimization"]["stage"] = 2;
  j["tensor_parallel"]["sequence_parallel"] = true;
  j["latchkey"]["activation_checkpointing"] = {{"mode", "full"}, {"every_layers", 2}};
  j["latchkey"]["overlap_dp_reduction"] = true;
  absl::StatusOr<JobSpec> a = Parse(j);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string text = JobSpecToJson(*a);
  absl::StatusOr<JobSpec> b = ParseJobSpec(text, "/elsewhere");
  ASSERT_TRUE(b.ok()) << b.status() << "\n" << text;
  EXPECT_EQ(*a, *b) << text;
  EXPECT_EQ(JobSpecToJson(*b), text);
  b->activation_checkpointing.every_layers = 3;
  EXPECT_FALSE(*a == *b);
}

TEST(MemorySpecTest, RefusalsNameTheField) {
  struct Case {
    std::string name;
    void (*edit)(json&);
    std::string field;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"ModeUnknown",
       [](json& j) {
         j["latchkey"]["activation_checkpointing"] = {{"mode", "some"}};
       },
       "latchkey.activation_checkpointing.mode", "unknown mode 'some' (none, selective, full)"},
      {"EveryLayersZero",
       [](json& j) {
         j["latchkey"]["activation_checkpointing"] = {{"mode", "full"}, {"every_layers", 0}};
       },
       "latchkey.activation_checkpointing.every_layers", ">= 1"},
      {"EveryLayersNotFull",
       [](json& j) {
         j["latchkey"]["activation_checkpointing"] = {{"mode", "selective"}, {"every_layers", 2}};
       },
       "latchkey.activation_checkpointing.every_layers", "applies to mode \"full\" only"},
      {"UnknownKey",
       [](json& j) {
         j["latchkey"]["activation_checkpointing"] = {{"layers", 2}};
       },
       "latchkey.activation_checkpointing.layers", ""},
      {"OverlapWithoutZero", [](json& j) { j["latchkey"]["overlap_dp_reduction"] = true; },
       "latchkey.overlap_dp_reduction", "needs zero_optimization.stage 1"},
      {"SequenceParallelNotBool",
       [](json& j) { j["tensor_parallel"]["sequence_parallel"] = "yes"; },
       "tensor_parallel.sequence_parallel", ""},
      {"SequenceParallelSeqLen",
       [](json& j) {
         j["tensor_parallel"]["sequence_parallel"] = true;
         j["latchkey"]["seq_len"] = 15;
       },
       "tensor_parallel.sequence_parallel", "must be divisible by tensor_parallel.autotp_size (2)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json j = ExampleSpecJson();
    c.edit(j);
    absl::StatusOr<JobSpec> spec = Parse(j);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), StartsWith(c.field + ": "));
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.reason));
  }
}

}  // namespace
}  // namespace latchkey
