// latchkey.data {"format": "megatron", ...} and latchkey.eval {"split": ...}: parsing, the
// defaults, the refusals (each naming its field) and the canonical JSON round trip.
#include <functional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Base() {
  return json::parse(R"json(
{"model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
           "vocab_size": 256, "n_positions": 64, "multi_query": true},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
 "tensor_parallel": {"autotp_size": 2},
 "latchkey": {"seq_len": 32, "steps": 20, "seed": 7, "world_size": 4,
              "data": {"format": "megatron", "path_prefix": "corpus/text_document"}}}
)json");
}

absl::StatusOr<JobSpec> Parse(const json& j) { return ParseJobSpec(j.dump(), "/jobs/a"); }

TEST(JobSpecMegatron, DefaultsAndResolvedPaths) {
  auto spec = Parse(Base());
  ASSERT_TRUE(spec.ok()) << spec.status();
  const DataConfig& d = spec->data;
  EXPECT_EQ(d.format, DataFormat::kMegatron);
  EXPECT_EQ(d.path_prefix, "/jobs/a/corpus/text_document");
  EXPECT_TRUE(d.blend.empty());
  EXPECT_EQ(d.split, "100,0,0");
  EXPECT_EQ(d.megatron_seed, 7u);  // latchkey.seed
  EXPECT_EQ(d.cache_dir, "");
  // steps * GAS * DP * MB = 20 * 4 * 2 * 2, fixed at submit.
  EXPECT_EQ(d.num_samples, 320);
}

TEST(JobSpecMegatron, BlendSplitSeedCacheDirAndEvalSplit) {
  json j = Base();
  j["latchkey"]["data"] = {{"format", "megatron"},
                           {"blend",
                            {{{"weight", 0.5}, {"path_prefix", "a"}},
                             {{"weight", 0.25}, {"path_prefix", "/d/b"}},
                             {{"weight", 0.25}, {"path_prefix", "c"}}}},
                           {"split", "90,5,5"},
                           {"seed", 1234},
                           {"cache_dir", "idx-cache"}};
  j["latchkey"]["eval"] = {{"split", "validation"}, {"every_steps", 5}, {"samples", 16}};
  auto spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->data.blend.size(), 3u);
  EXPECT_EQ(spec->data.blend[0].path_prefix, "/jobs/a/a");
  EXPECT_EQ(spec->data.blend[1].path_prefix, "/d/b");
  EXPECT_EQ(spec->data.blend[2].weight, 0.25);
  EXPECT_EQ(spec->data.split, "90,5,5");
  EXPECT_EQ(spec->data.megatron_seed, 1234u);
  EXPECT_EQ(spec->data.cache_dir, "/jobs/a/idx-cache");
  EXPECT_EQ(spec->eval.split, "validation");
  EXPECT_TRUE(spec->eval.enabled());
  // The canonical JSON round-trips, from any base folder, and is a fixed point.
  const std::string text = JobSpecToJson(*spec);
  auto back = ParseJobSpec(text, "/elsewhere");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *spec);
  EXPECT_EQ(JobSpecToJson(*back), text);
}

TEST(JobSpecMegatron, NumSamplesSurvivesALaterGasChange) {
  json j = Base();
  j["latchkey"]["data"]["num_samples"] = 1000;
  auto spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.num_samples, 1000);
  JobSpec changed = *spec;
  changed.gradient_accumulation_steps = 8;  // what `latchkey update --gas` changes
  auto back = ParseJobSpec(JobSpecToJson(changed), "/");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data.num_samples, 1000);  // the indices (and the order) stay
}

TEST(JobSpecMegatron, FlatFilesKeepWorking) {
  json j = Base();
  j["latchkey"]["data"] = {{"tokens_file", "t.bin"}, {"dtype", "uint32"}};
  auto spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.format, DataFormat::kTokens);
  EXPECT_EQ(spec->data.tokens_file, "/jobs/a/t.bin");
  EXPECT_EQ(spec->data.num_samples, 0);
  j["latchkey"]["data"]["format"] = "tokens";
  auto explicit_tokens = Parse(j);
  ASSERT_TRUE(explicit_tokens.ok());
  EXPECT_EQ(*explicit_tokens, *spec);
  auto back = ParseJobSpec(JobSpecToJson(*spec), "/");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *spec);
}

struct Refusal {
  std::function<void(json&)> edit;
  std::string field;
};

TEST(JobSpecMegatron, RefusalsNameTheField) {
  const std::vector<Refusal> cases = {
      {[](json& j) { j["latchkey"]["data"]["format"] = "arrow"; }, "latchkey.data.format"},
      {[](json& j) { j["latchkey"]["data"].erase("path_prefix"); }, "latchkey.data.path_prefix"},
      {[](json& j) { j["latchkey"]["data"]["blend"] = json::array(); },
       "latchkey.data.path_prefix"},  // both given
      {[](json& j) {
         j["latchkey"]["data"].erase("path_prefix");
         j["latchkey"]["data"]["blend"] = json::array();
       },
       "latchkey.data.blend"},
      {[](json& j) {
         j["latchkey"]["data"].erase("path_prefix");
         j["latchkey"]["data"]["blend"] = {{{"weight", 0}, {"path_prefix", "a"}}};
       },
       "latchkey.data.blend[0].weight"},
      {[](json& j) {
         j["latchkey"]["data"].erase("path_prefix");
         j["latchkey"]["data"]["blend"] = {{{"weight", 1}}};
       },
       "latchkey.data.blend[0].path_prefix"},
      {[](json& j) {
         j["latchkey"]["data"].erase("path_prefix");
         j["latchkey"]["data"]["blend"] = {{{"weight", 1}, {"path_prefix", "a"}, {"w", 1}}};
       },
       "latchkey.data.blend[0].w"},
      {[](json& j) { j["latchkey"]["data"]["split"] = "90,x"; }, "latchkey.data.split"},
      {[](json& j) { j["latchkey"]["data"]["split"] = "0,0,0"; }, "latchkey.data.split"},
      {[](json& j) { j["latchkey"]["data"]["seed"] = 4294967296ULL; }, "latchkey.data.seed"},
      {[](json& j) { j["latchkey"]["data"]["dtype"] = "uint16"; }, "latchkey.data.dtype"},
      {[](json& j) { j["latchkey"]["data"]["tokens_file"] = "x"; }, "latchkey.data.tokens_file"},
      {[](json& j) { j["latchkey"]["data"]["num_samples"] = 0; }, "latchkey.data.num_samples"},
      {[](json& j) { j["latchkey"]["data"]["cache_dir"] = ""; }, "latchkey.data.cache_dir"},
      {[](json& j) { j["latchkey"]["data"]["shuffle"] = true; }, "latchkey.data.shuffle"},
      {[](json& j) {
         j["latchkey"]["eval"] = {{"split", "valid"}, {"every_steps", 1}, {"samples", 1}};
       },
       "latchkey.eval.split"},
      {[](json& j) {
         // The default split 100,0,0 has no validation part.
         j["latchkey"]["eval"] = {{"split", "validation"}, {"every_steps", 1}, {"samples", 1}};
       },
       "latchkey.eval.split"},
      {[](json& j) {
         j["latchkey"]["data"] = {{"tokens_file", "t.bin"}};
         j["latchkey"]["eval"] = {{"split", "validation"}, {"every_steps", 1}, {"samples", 1}};
       },
       "latchkey.eval.split"},
      {[](json& j) {
         j["latchkey"]["data"]["split"] = "90,5,5";
         j["latchkey"]["eval"] = {
             {"split", "test"}, {"tokens_file", "e.bin"}, {"every_steps", 1}, {"samples", 1}};
       },
       "latchkey.eval.split"},
  };
  for (const Refusal& c : cases) {
    json j = Base();
    c.edit(j);
    auto spec = Parse(j);
    ASSERT_FALSE(spec.ok()) << j.dump();
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.field + ":")) << j.dump();
  }
}

// A misspelt key of latchkey.data, its blend or latchkey.eval: the refusal names the key meant,
// also when the misspelt key is a required one (then with the key missing).
TEST(JobSpecMegatron, MisspeltKeysSuggestTheKeyMeant) {
  const struct {
    std::function<void(json&)> edit;
    std::string message;
  } cases[] = {
      {[](json& j) {
         j["latchkey"]["data"] = {{"format", "megatron"}, {"path_prefx", "c"}};
       },
       "latchkey.data.path_prefix: exactly one of path_prefix or blend is required with format "
       "\"megatron\"; latchkey.data.path_prefx: unknown key; did you mean "
       "latchkey.data.path_prefix?"},
      {[](json& j) { j["latchkey"]["data"]["spilt"] = "90,5,5"; },
       "latchkey.data.spilt: unknown key; did you mean latchkey.data.split?"},
      {[](json& j) { j["latchkey"]["data"]["splt"] = "90,5,5"; },
       "latchkey.data.splt: unknown key; did you mean latchkey.data.split?"},
      {[](json& j) {
         j["latchkey"]["data"]["spilt"] = "90,5,5";
         j["latchkey"]["data"]["cahce_dir"] = "c";
       },
       "latchkey.data.cahce_dir: unknown key; did you mean latchkey.data.cache_dir?; "
       "latchkey.data.spilt: unknown key; did you mean latchkey.data.split?"},
      {[](json& j) {
         j["latchkey"]["data"].erase("path_prefix");
         j["latchkey"]["data"]["blend"] = {{{"weight", 1}, {"path_prefx", "a"}}};
       },
       "latchkey.data.blend[0].path_prefix: required; latchkey.data.blend[0].path_prefx: unknown "
       "key; did you mean latchkey.data.blend[0].path_prefix?"},
      {[](json& j) {
         j["latchkey"]["data"]["split"] = "90,5,5";
         j["latchkey"]["eval"] = {{"spilt", "validation"}, {"every_steps", 1}, {"samples", 1}};
       },
       "latchkey.eval.tokens_file: required (or split); latchkey.eval.spilt: unknown key; did you "
       "mean latchkey.eval.split?"},
      {[](json& j) {
         j["latchkey"]["data"] = {{"tokens_fiel", "t.bin"}};
       },
       "latchkey.data: exactly one of tokens_file or synthetic is required; "
       "latchkey.data.tokens_fiel: unknown key; did you mean latchkey.data.tokens_file?"},
      {[](json& j) {
         j["latchkey"]["data"] = {{"fromat", "megatron"}, {"path_prefix", "c"}};
       },
       "latchkey.data: exactly one of tokens_file or synthetic is required; latchkey.data.fromat: "
       "unknown key; did you mean latchkey.data.format?"},
  };
  for (const auto& c : cases) {
    json j = Base();
    c.edit(j);
    auto spec = Parse(j);
    ASSERT_FALSE(spec.ok()) << j.dump();
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(spec.status().message(), c.message) << j.dump();
  }
}

}  // namespace
}  // namespace latchkey
