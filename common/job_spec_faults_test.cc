// The operational keys of the job spec: latchkey.checkpoint, max_restarts and
// hang_timeout_seconds (their refusals are in job_spec_test.cc's error table), and
// latchkey.backend, device and tf32 (refusals here).
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
using testing::ExampleSpecJson;

absl::StatusOr<JobSpec> Parse(const json& j) { return ParseJobSpec(j.dump(), "/jobs/a"); }

TEST(JobSpecTest, FaultToleranceKeys) {
  absl::StatusOr<JobSpec> plain = Parse(ExampleSpecJson());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->checkpoint.enabled());
  EXPECT_EQ(plain->max_restarts, 3);
  EXPECT_EQ(plain->hang_timeout_seconds, 20);

  json j = ExampleSpecJson();
  j["latchkey"]["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 5}};
  j["latchkey"]["max_restarts"] = 0;
  j["latchkey"]["hang_timeout_seconds"] = 4.5;
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->checkpoint.enabled());
  EXPECT_EQ(spec->checkpoint.dir, "/jobs/a/ckpt");  // relative to the spec's folder
  EXPECT_EQ(spec->checkpoint.every_steps, 5);
  EXPECT_EQ(spec->checkpoint.keep, 2);
  EXPECT_EQ(spec->max_restarts, 0);
  EXPECT_EQ(spec->hang_timeout_seconds, 4.5);
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToJson(*spec), "/elsewhere");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *spec);
  EXPECT_NE(*back, *plain);
}

TEST(JobSpecTest, CheckpointAsyncDefaultsToTrueAndRoundTrips) {
  json j = ExampleSpecJson();
  j["latchkey"]["checkpoint"] = {{"dir", "ckpt"}, {"every_steps", 5}};
  absl::StatusOr<JobSpec> on = Parse(j);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->checkpoint.async);
  j["latchkey"]["checkpoint"]["async"] = false;
  absl::StatusOr<JobSpec> off = Parse(j);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->checkpoint.async);
  EXPECT_NE(*off, *on);
  EXPECT_EQ(json::parse(JobSpecToJson(*off))["latchkey"]["checkpoint"]["async"], false);
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToJson(*off), "/elsewhere");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *off);
}

TEST(JobSpecTest, BackendAndDeviceKeys) {
  absl::StatusOr<JobSpec> plain = Parse(ExampleSpecJson());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->backend, CommBackend::kAuto);
  EXPECT_EQ(plain->device, DeviceKind::kCpu);
  EXPECT_FALSE(plain->tf32);

  json j = ExampleSpecJson();
  j["latchkey"]["backend"] = "nccl";
  j["latchkey"]["device"] = "cuda";
  j["latchkey"]["tf32"] = true;
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->backend, CommBackend::kNccl);
  EXPECT_EQ(spec->device, DeviceKind::kCuda);
  EXPECT_TRUE(spec->tf32);
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToJson(*spec), "/elsewhere");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *spec);
  EXPECT_NE(*back, *plain);

  for (const char* name : {"auto", "gloo", "shm"}) {
    json c = ExampleSpecJson();
    c["latchkey"]["backend"] = name;
    absl::StatusOr<JobSpec> cpu = Parse(c);
    ASSERT_TRUE(cpu.ok()) << name << ": " << cpu.status();
    EXPECT_STREQ(CommBackendName(cpu->backend), name);
  }
}

TEST(JobSpecTest, BackendAndDeviceRefusals) {
  struct Case {
    json latchkey;  // keys merged into "latchkey"
    std::string field;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {{{"backend", "mpi"}}, "latchkey.backend", "unknown backend 'mpi'"},
      {{{"device", "tpu"}}, "latchkey.device", "unknown device 'tpu'"},
      {{{"backend", "nccl"}}, "latchkey.backend", "nccl needs latchkey.device"},
      {{{"backend", "shm"}, {"device", "cuda"}}, "latchkey.backend", "shm takes cpu buffers only"},
      {{{"backend", "gloo"}, {"device", "cuda"}}, "latchkey.backend", "gloo takes cpu buffers"},
      {{{"tf32", 1}}, "latchkey.tf32", ""},
  };
  for (const Case& c : cases) {
    json j = ExampleSpecJson();
    j["latchkey"].update(c.latchkey);
    absl::StatusOr<JobSpec> spec = Parse(j);
    ASSERT_FALSE(spec.ok()) << c.latchkey.dump();
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), ::testing::StartsWith(c.field + ":"))
        << spec.status();
    EXPECT_THAT(std::string(spec.status().message()), ::testing::HasSubstr(c.reason));
  }
}

// Unknown keys (the reader of every spec object) suggest the key meant.
TEST(JobSpecTest, UnknownKeySuggestsTheNearestKnownOne) {
  json j = ExampleSpecJson();
  j["latchkey"]["stpes"] = 20;
  j["latchkey"].erase("steps");
  // A required key: the error names both the key missing and the misspelling.
  EXPECT_EQ(Parse(j).status().message(),
            "latchkey.steps: required; latchkey.stpes: unknown key; did you mean latchkey.steps?");
  j = ExampleSpecJson();
  j["latchkey"]["max_restart"] = 2;  // an optional key
  EXPECT_EQ(Parse(j).status().message(),
            "latchkey.max_restart: unknown key; did you mean latchkey.max_restarts?");
  j = ExampleSpecJson();  // nothing near: the plain refusal
  j["latchkey"]["zzzzzzzz"] = 1;
  EXPECT_EQ(Parse(j).status().message(), "latchkey.zzzzzzzz: unknown key");
}

}  // namespace
}  // namespace latchkey
