#include "common/job_spec.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/latch.h"
#include "common/validate_job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"
#include "tests/support/tiny_model.h"

namespace latchkey {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The full example of docs/job-spec.md, verbatim.
constexpr char kExample[] = R"json(
{"model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
           "vocab_size": 256, "n_positions": 64, "multi_query": true},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}, "bf16": {"enabled": false},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
 "tensor_parallel": {"autotp_size": 2}, "managed_gradient_accumulation": true,
 "latchkey": {"seq_len": 64, "steps": 20, "seed": 1, "world_size": 2, "kv_reduce": "auto",
              "data": {"tokens_file": "data.bin", "dtype": "uint16"}}}
)json";

json Example() { return json::parse(kExample); }

absl::StatusOr<JobSpec> Parse(const json& j, const std::string& base = "/jobs/a") {
  return ParseJobSpec(j.dump(), base);
}

TEST(JobSpecTest, ParsesDesignExample) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kExample, "/jobs/a");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModelConfig& m = spec->model;
  // Every field: 2 layers, n_embd 64, 8 heads, n_inner null, vocab 256, 64 positions, MQA, and
  // the defaults of the keys left out (no dropout, epsilon 1e-5, scaled attention).
  EXPECT_EQ(testing::ModelDiff(m, testing::TinyModel()), "");
  EXPECT_EQ(m.inner(), 256);
  EXPECT_EQ(m.head_dim(), 8);
  EXPECT_EQ(spec->micro_batch_size, 2);
  EXPECT_EQ(spec->gradient_accumulation_steps, 4);
  EXPECT_EQ(spec->gradient_clipping, 1.0);
  EXPECT_EQ(spec->zero_stage, 1);
  EXPECT_FALSE(spec->bf16);
  EXPECT_EQ(spec->optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(spec->optimizer.lr, 1e-3);
  EXPECT_EQ(spec->optimizer.weight_decay, 0.1);
  EXPECT_EQ(spec->optimizer.betas[0], 0.9);  // torch defaults where absent
  EXPECT_EQ(spec->optimizer.betas[1], 0.999);
  EXPECT_EQ(spec->optimizer.eps, 1e-8);
  EXPECT_EQ(spec->tp, 2);
  EXPECT_FALSE(spec->has_partition_config);
  EXPECT_TRUE(spec->managed_gradient_accumulation);
  EXPECT_TRUE(spec->window_schedule.empty());
  EXPECT_EQ(spec->seq_len, 64);
  EXPECT_EQ(spec->steps, 20);
  EXPECT_EQ(spec->seed, 1u);
  EXPECT_EQ(spec->world_size, 2);
  EXPECT_EQ(spec->dp(), 1);
  EXPECT_EQ(spec->kv_reduce, KvReducePolicy::kAuto);
  EXPECT_EQ(spec->data.tokens_file, "/jobs/a/data.bin");
  EXPECT_EQ(spec->data.dtype, TokenDtype::kUint16);
  EXPECT_FALSE(spec->data.synthetic_seed.has_value());
  EXPECT_TRUE(spec->init_from.empty());
  EXPECT_TRUE(spec->warnings.empty());
}

TEST(JobSpecTest, Defaults) {
  json j = Example();
  for (const char* k : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                        "gradient_clipping", "zero_optimization", "bf16", "optimizer",
                        "tensor_parallel", "managed_gradient_accumulation"}) {
    j.erase(k);
  }
  j["latchkey"].erase("world_size");
  j["latchkey"].erase("kv_reduce");
  j["latchkey"].erase("seed");
  j["latchkey"]["data"].erase("dtype");
  j["model"]["n_inner"] = nullptr;
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->micro_batch_size, 1);
  EXPECT_EQ(spec->gradient_accumulation_steps, 1);
  EXPECT_EQ(spec->gradient_clipping, 0.0);
  EXPECT_EQ(spec->zero_stage, 0);
  EXPECT_EQ(spec->tp, 1);
  EXPECT_EQ(spec->world_size, 1);  // default: tp
  EXPECT_EQ(spec->kv_reduce, KvReducePolicy::kAuto);
  EXPECT_EQ(spec->data.dtype, TokenDtype::kUint16);
  EXPECT_EQ(spec->model.n_inner, 0);
  EXPECT_EQ(spec->optimizer, OptimizerConfig());
  EXPECT_EQ(spec->optimizer.weight_decay, 0.01);
}

TEST(JobSpecTest, WorldSizeDefaultsToTp) {
  json j = Example();
  j["latchkey"].erase("world_size");
  j["tensor_parallel"]["autotp_size"] = 4;
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->world_size, 4);
  EXPECT_EQ(spec->dp(), 1);
}

TEST(JobSpecTest, SgdAndSyntheticAndMha) {
  json j = Example();
  j["optimizer"] = {{"type", "sgd"}, {"params", {{"lr", 0.5}, {"momentum", 0}}}};
  j["latchkey"]["data"] = {{"synthetic", {{"seed", 7}}}, {"dtype", "uint32"}};
  j["model"]["multi_query"] = false;
  j["tensor_parallel"]["partition_config"] = json::object();
  j["latchkey"]["world_size"] = 4;
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer.type, OptimizerType::kSgd);
  EXPECT_EQ(spec->optimizer.lr, 0.5);
  EXPECT_EQ(spec->optimizer.momentum, 0.0);
  EXPECT_EQ(spec->optimizer.weight_decay, 0.0);
  EXPECT_EQ(spec->data.synthetic_seed, 7u);
  EXPECT_TRUE(spec->data.tokens_file.empty());
  EXPECT_EQ(spec->data.dtype, TokenDtype::kUint32);
  EXPECT_FALSE(spec->model.multi_query);
  EXPECT_TRUE(spec->has_partition_config);  // allowed for MHA
  EXPECT_EQ(spec->dp(), 2);
}

// One case per validation rule: a mutation of the example and the field path it must name.
struct ErrorCase {
  const char* name;
  std::function<void(json&)> mutate;
  std::string path;
  std::string reason;  // a substring of the message after the path, when it matters
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class JobSpecErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(JobSpecErrorTest, NamesTheField) {
  const ErrorCase& c = GetParam();
  json j = Example();
  c.mutate(j);
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(c.path + ": "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.reason));
}

std::vector<ErrorCase> ErrorCases() {
  auto lk = [](json& j) -> json& { return j["latchkey"]; };
  return {
      {"ModelMissing", [](json& j) { j.erase("model"); }, "model", "required"},
      {"ModelNotObject", [](json& j) { j["model"] = 3; }, "model", "must be an object"},
      {"ModelType", [](json& j) { j["model"]["model_type"] = "gpt2"; }, "model.model_type", ""},
      {"ModelTypeMissing", [](json& j) { j["model"].erase("model_type"); }, "model.model_type",
       "required"},
      {"NLayerMissing", [](json& j) { j["model"].erase("n_layer"); }, "model.n_layer", "required"},
      {"NLayerType", [](json& j) { j["model"]["n_layer"] = "2"; }, "model.n_layer",
       "must be an integer"},
      {"NLayerFloat", [](json& j) { j["model"]["n_layer"] = 2.5; }, "model.n_layer", "integer"},
      {"NLayerZero", [](json& j) { j["model"]["n_layer"] = 0; }, "model.n_layer", ">= 1"},
      {"NLayerHuge", [](json& j) { j["model"]["n_layer"] = 10000000000LL; }, "model.n_layer",
       "out of range"},
      {"VocabNegative", [](json& j) { j["model"]["vocab_size"] = -1; }, "model.vocab_size", ""},
      {"NInnerZero", [](json& j) { j["model"]["n_inner"] = 0; }, "model.n_inner", ""},
      {"MultiQueryType", [](json& j) { j["model"]["multi_query"] = "yes"; }, "model.multi_query",
       "true or false"},
      {"PdropRange", [](json& j) { j["model"]["resid_pdrop"] = 1.5; }, "model.resid_pdrop", ""},
      {"LnEpsZero", [](json& j) { j["model"]["layer_norm_epsilon"] = 0; },
       "model.layer_norm_epsilon", ""},
      {"ModelUnknownKey", [](json& j) { j["model"]["n_ctx"] = 64; }, "model.n_ctx", "unknown key"},
      {"EmbdNotDivisible", [](json& j) { j["model"]["n_embd"] = 60; }, "model.n_embd",
       "60 is not divisible by model.n_head (8)"},
      {"TpDoesNotDivideHeads", [](json& j) { j["tensor_parallel"]["autotp_size"] = 3; },
       "tensor_parallel.autotp_size", "3 does not divide model.n_head (8)"},
      {"TpExceedsHeads",
       [](json& j) {
         j["tensor_parallel"]["autotp_size"] = 16;
         j["latchkey"]["world_size"] = 16;
       },
       "tensor_parallel.autotp_size", "16 exceeds model.n_head (8)"},
      {"TpZero", [](json& j) { j["tensor_parallel"]["autotp_size"] = 0; },
       "tensor_parallel.autotp_size", ">= 1"},
      {"TpDoesNotDivideInner",
       [](json& j) {
         j["model"]["n_inner"] = 100;
         j["tensor_parallel"]["autotp_size"] = 8;
         j["latchkey"]["world_size"] = 8;
       },
       "tensor_parallel.autotp_size", "8 does not divide model.n_inner (100)"},
      {"PartitionConfigMqa",
       [](json& j) {
         j["tensor_parallel"]["partition_config"] = {{"a", 1}};
       },
       "tensor_parallel.partition_config", "multi_query"},
      {"ZeroStage3", [](json& j) { j["zero_optimization"]["stage"] = 3; },
       "zero_optimization.stage", "ZeRO 3 is not supported (use 0, 1 or 2)"},
      {"ZeroStage7", [](json& j) { j["zero_optimization"]["stage"] = 7; },
       "zero_optimization.stage", ""},
      {"ZeroStageNegative", [](json& j) { j["zero_optimization"]["stage"] = -1; },
       "zero_optimization.stage", ""},
      {"GasZero", [](json& j) { j["gradient_accumulation_steps"] = 0; },
       "gradient_accumulation_steps", ">= 1"},
      {"GasNegative", [](json& j) { j["gradient_accumulation_steps"] = -2; },
       "gradient_accumulation_steps", ""},
      {"GasAutoString", [](json& j) { j["gradient_accumulation_steps"] = "auto"; },
       "gradient_accumulation_steps", "must be an integer"},
      {"MicroBatchZero", [](json& j) { j["train_micro_batch_size_per_gpu"] = 0; },
       "train_micro_batch_size_per_gpu", ""},
      {"ClippingNegative", [](json& j) { j["gradient_clipping"] = -1.0; }, "gradient_clipping", ""},
      {"Bf16Type", [](json& j) { j["bf16"]["enabled"] = 1; }, "bf16.enabled", ""},
      {"Fp16Enabled",
       [](json& j) {
         j["fp16"] = {{"enabled", true}};
       },
       "fp16.enabled", ""},
      {"ManagedType", [](json& j) { j["managed_gradient_accumulation"] = "no"; },
       "managed_gradient_accumulation", ""},
      {"LrZero", [](json& j) { j["optimizer"]["params"]["lr"] = 0; }, "optimizer.params.lr", ""},
      {"LrType", [](json& j) { j["optimizer"]["params"]["lr"] = "fast"; }, "optimizer.params.lr",
       "must be a number"},
      {"OptimizerTypeUnknown", [](json& j) { j["optimizer"]["type"] = "Adam"; }, "optimizer.type",
       "not supported"},
      {"OptimizerTypeMissing", [](json& j) { j["optimizer"].erase("type"); }, "optimizer.type",
       "required"},
      {"SgdMomentum",
       [](json& j) {
         j["optimizer"] = {{"type", "SGD"}, {"params", {{"momentum", 0.9}}}};
       },
       "optimizer.params.momentum", "not supported yet"},
      {"SgdBetas",
       [](json& j) {
         j["optimizer"] = {{"type", "SGD"}, {"params", {{"betas", {0.9, 0.9}}}}};
       },
       "optimizer.params.betas", ""},
      {"Betas", [](json& j) { j["optimizer"]["params"]["betas"] = {0.9}; },
       "optimizer.params.betas", ""},
      {"BetaRange",
       [](json& j) {
         j["optimizer"]["params"]["betas"] = {0.9, 1.0};
       },
       "optimizer.params.betas[1]", ""},
      {"AdamUnknownParam", [](json& j) { j["optimizer"]["params"]["amsgrad"] = true; },
       "optimizer.params.amsgrad", ""},
      {"LatchkeyMissing", [](json& j) { j.erase("latchkey"); }, "latchkey", "required"},
      {"LatchkeyUnknownKey", [=](json& j) { lk(j)["epochs"] = 1; }, "latchkey.epochs",
       "unknown key"},
      {"SeqLenMissing", [=](json& j) { lk(j).erase("seq_len"); }, "latchkey.seq_len", "required"},
      {"SeqLenZero", [=](json& j) { lk(j)["seq_len"] = 0; }, "latchkey.seq_len", ""},
      {"SeqLenExceedsPositions", [=](json& j) { lk(j)["seq_len"] = 65; }, "latchkey.seq_len",
       "65 exceeds model.n_positions (64)"},
      {"StepsZero", [=](json& j) { lk(j)["steps"] = 0; }, "latchkey.steps", ""},
      {"SeedNegative", [=](json& j) { lk(j)["seed"] = -1; }, "latchkey.seed", ""},
      {"WorldSizeNotDivisible", [=](json& j) { lk(j)["world_size"] = 3; }, "latchkey.world_size",
       "3 is not divisible by tensor_parallel.autotp_size (2)"},
      {"KvReduceUnknown", [=](json& j) { lk(j)["kv_reduce"] = "sometimes"; }, "latchkey.kv_reduce",
       "sometimes"},
      {"ScheduleEntryZero",
       [=](json& j) {
         j["managed_gradient_accumulation"] = false;
         lk(j)["window_schedule"] = {1, 0, 4};
       },
       "latchkey.window_schedule[1]", ""},
      {"ScheduleEntryType",
       [=](json& j) {
         j["managed_gradient_accumulation"] = false;
         lk(j)["window_schedule"] = {1, "2"};
       },
       "latchkey.window_schedule[1]", "integer"},
      {"ScheduleNotArray",
       [=](json& j) {
         j["managed_gradient_accumulation"] = false;
         lk(j)["window_schedule"] = 4;
       },
       "latchkey.window_schedule", "array"},
      {"UnmanagedWithoutSchedule", [](json& j) { j["managed_gradient_accumulation"] = false; },
       "latchkey.window_schedule", "required"},
      {"UnmanagedEmptySchedule",
       [=](json& j) {
         j["managed_gradient_accumulation"] = false;
         lk(j)["window_schedule"] = json::array();
       },
       "latchkey.window_schedule", "non-empty"},
      {"ScheduleWithManaged",
       [=](json& j) {
         lk(j)["window_schedule"] = {1, 2};
       },
       "latchkey.window_schedule", "managed_gradient_accumulation: false"},
      {"InitFromEmpty", [=](json& j) { lk(j)["init_from"] = ""; }, "latchkey.init_from", ""},
      {"InitFromType", [=](json& j) { lk(j)["init_from"] = 5; }, "latchkey.init_from", ""},
      {"DataMissing", [=](json& j) { lk(j).erase("data"); }, "latchkey.data", "required"},
      {"DataNeither",
       [=](json& j) {
         lk(j)["data"] = {{"dtype", "uint16"}};
       },
       "latchkey.data", "exactly one"},
      {"DataBoth",
       [=](json& j) {
         lk(j)["data"]["synthetic"] = {{"seed", 1}};
       },
       "latchkey.data", "exactly one"},
      {"TokensFileEmpty", [=](json& j) { lk(j)["data"]["tokens_file"] = ""; },
       "latchkey.data.tokens_file", ""},
      {"DtypeUnknown", [=](json& j) { lk(j)["data"]["dtype"] = "int8"; }, "latchkey.data.dtype",
       "int8"},
      {"DataUnknownKey", [=](json& j) { lk(j)["data"]["shuffle"] = true; }, "latchkey.data.shuffle",
       "unknown key"},
      {"CheckpointDirMissing",
       [=](json& j) {
         lk(j)["checkpoint"] = {{"every_steps", 2}};
       },
       "latchkey.checkpoint.dir", "required"},
      {"CheckpointDirEmpty",
       [=](json& j) {
         lk(j)["checkpoint"] = {{"dir", ""}, {"every_steps", 2}};
       },
       "latchkey.checkpoint.dir", "must not be empty"},
      {"CheckpointEveryMissing",
       [=](json& j) {
         lk(j)["checkpoint"] = {{"dir", "ck"}};
       },
       "latchkey.checkpoint.every_steps", "required"},
      {"CheckpointEveryZero",
       [=](json& j) {
         lk(j)["checkpoint"] = {{"dir", "ck"}, {"every_steps", 0}};
       },
       "latchkey.checkpoint.every_steps", "must be >= 1"},
      {"CheckpointKeepZero",
       [=](json& j) {
         lk(j)["checkpoint"] = {{"dir", "ck"}, {"every_steps", 1}, {"keep", 0}};
       },
       "latchkey.checkpoint.keep", "must be >= 1"},
      {"CheckpointUnknownKey",
       [=](json& j) {
         lk(j)["checkpoint"] = {{"dir", "ck"}, {"every_steps", 1}, {"compress", true}};
       },
       "latchkey.checkpoint.compress", "unknown key"},
      {"CheckpointAsyncNotBool",
       [=](json& j) {
         lk(j)["checkpoint"] = {{"dir", "ck"}, {"every_steps", 1}, {"async", 1}};
       },
       "latchkey.checkpoint.async", "must be true or false, got 1"},
      {"MaxRestartsNegative", [=](json& j) { lk(j)["max_restarts"] = -1; }, "latchkey.max_restarts",
       "must be >= 0, got -1"},
      {"HangTimeoutZero", [=](json& j) { lk(j)["hang_timeout_seconds"] = 0; },
       "latchkey.hang_timeout_seconds", ""},
      {"SyntheticUnknownKey",
       [=](json& j) {
         lk(j)["data"] = {{"synthetic", {{"seed", 1}, {"len", 9}}}};
       },
       "latchkey.data.synthetic.len", "unknown key"},
  };
}

INSTANTIATE_TEST_SUITE_P(Rules, JobSpecErrorTest, ::testing::ValuesIn(ErrorCases()),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(JobSpecTest, NotJsonOrNotObject) {
  for (const char* text : {"{\"model\": ", "[1, 2]", "", "null"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, "/");
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), StartsWith("spec: "));
  }
}

TEST(JobSpecTest, ExactMessageForTpNotDividingHeads) {
  json j = Example();
  j["tensor_parallel"]["autotp_size"] = 3;
  j["latchkey"]["world_size"] = 3;
  EXPECT_EQ(Parse(j).status().message(),
            "tensor_parallel.autotp_size: 3 does not divide model.n_head (8)");
}

TEST(JobSpecTest, UnknownDeepSpeedKeysAreWarnings) {
  json j = Example();
  j["steps_per_print"] = 10;
  j["train_batch_size"] = 8;
  j["zero_optimization"]["overlap_comm"] = true;
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->warnings, ElementsAre("unknown key 'zero_optimization.overlap_comm' ignored",
                                          "unknown top-level key 'steps_per_print' ignored",
                                          "unknown top-level key 'train_batch_size' ignored"));
}

TEST(JobSpecTest, RelativePathsResolveAgainstBaseDir) {
  json j = Example();
  j["latchkey"]["data"]["tokens_file"] = "../data/./tokens.bin";
  j["latchkey"]["init_from"] = "ckpt/step-10";
  absl::StatusOr<JobSpec> spec = Parse(j, "/jobs/a");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.tokens_file, "/jobs/data/tokens.bin");
  EXPECT_EQ(spec->init_from, "/jobs/a/ckpt/step-10");

  j["latchkey"]["data"]["tokens_file"] = "/srv/tokens.bin";
  spec = Parse(j, "/jobs/a");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.tokens_file, "/srv/tokens.bin");

  // A relative base_dir resolves against the working directory; files are never opened.
  spec = Parse(Example(), "rel/dir");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.tokens_file,
            (std::filesystem::current_path() / "rel/dir/data.bin").lexically_normal().string());
}

TEST(JobSpecTest, LoadJobSpecFileUsesItsFolder) {
  const testing::ScopedTempDir tmp("job-spec");
  const std::filesystem::path dir = tmp.path();
  const std::string path = (dir / "spec.json").string();
  std::ofstream(path) << kExample;
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.tokens_file,
            (std::filesystem::absolute(dir) / "data.bin").lexically_normal().string());
  EXPECT_EQ(LoadJobSpecFile((dir / "missing.json").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(JobSpecTest, ValidateModelForTp) {
  ModelConfig m;  // n_embd 64, n_head 8, inner 256
  EXPECT_TRUE(ValidateModelForTp(m, 1, false).ok());
  EXPECT_TRUE(ValidateModelForTp(m, 8, false).ok());
  EXPECT_THAT(std::string(ValidateModelForTp(m, 0, false).message()),
              StartsWith("tensor_parallel.autotp_size: "));
  EXPECT_THAT(std::string(ValidateModelForTp(m, 16, false).message()),
              StartsWith("tensor_parallel.autotp_size: "));
  EXPECT_THAT(std::string(ValidateModelForTp(m, 2, true).message()),
              StartsWith("tensor_parallel.partition_config: "));
  m.multi_query = false;
  EXPECT_TRUE(ValidateModelForTp(m, 2, true).ok());
  m.n_embd = 60;
  EXPECT_THAT(std::string(ValidateModelForTp(m, 1, false).message()), StartsWith("model.n_embd: "));
  m.n_embd = 64;
  m.n_head = 0;
  EXPECT_THAT(std::string(ValidateModelForTp(m, 1, false).message()), StartsWith("model.n_head: "));
  m.n_head = 8;
  m.n_inner = 100;
  absl::Status s = ValidateModelForTp(m, 8, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tensor_parallel.autotp_size: 8 does not divide model.n_inner (100)");
}

TEST(JobSpecTest, ManagedWindows) {
  JobSpec spec;
  spec.gradient_accumulation_steps = 4;
  for (int64_t s = 0; s < 5; ++s) {
    EXPECT_EQ(spec.WindowLength(s), 4);
    EXPECT_EQ(spec.FirstMicroBatch(s), 4 * s);
  }
}

TEST(JobSpecTest, ScheduleLastEntryRepeats) {
  json j = Example();
  j["managed_gradient_accumulation"] = false;
  j["latchkey"]["window_schedule"] = {1, 2, 4};
  absl::StatusOr<JobSpec> spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<int> n = {1, 2, 4, 4, 4};
  const std::vector<int64_t> m = {0, 1, 3, 7, 11};
  for (int s = 0; s < 5; ++s) {
    EXPECT_EQ(spec->WindowLength(s), n[s]) << s;
    EXPECT_EQ(spec->FirstMicroBatch(s), m[s]) << s;
  }
  EXPECT_EQ(spec->FirstMicroBatch(1000), 7 + 4 * (1000 - 3));
}

TEST(JobSpecTest, NameHelpersRoundTrip) {
  for (KvReducePolicy p : {KvReducePolicy::kAuto, KvReducePolicy::kPerMicroBatch,
                           KvReducePolicy::kDeferred, KvReducePolicy::kCoalesced}) {
    EXPECT_EQ(ParseKvReducePolicy(KvReducePolicyName(p)), p);
  }
  for (KvMode m : {KvMode::kPerMicroBatch, KvMode::kDeferred, KvMode::kCoalesced}) {
    EXPECT_EQ(ParseKvMode(KvModeName(m)), m);
  }
  EXPECT_STREQ(KvReducePolicyName(KvReducePolicy::kPerMicroBatch), "per_micro_batch");
  EXPECT_STREQ(KvModeName(KvMode::kCoalesced), "coalesced");
  EXPECT_FALSE(ParseKvReducePolicy("Auto").has_value());
  EXPECT_FALSE(ParseKvMode("auto").has_value());  // a latch never carries auto
}

TEST(JobSpecTest, JsonRoundTrip) {
  std::vector<json> variants;
  variants.push_back(Example());
  json j = Example();
  j["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.3}}}};
  j["model"]["multi_query"] = false;
  j["model"]["n_inner"] = 96;
  j["model"]["resid_pdrop"] = 0.1;
  j["model"]["initializer_range"] = 0.0173;
  j["tensor_parallel"] = {{"autotp_size", 2}, {"partition_config", {{"x", 1}}}};
  j["bf16"]["enabled"] = true;
  j["zero_optimization"]["stage"] = 0;
  variants.push_back(j);
  j = Example();
  j["managed_gradient_accumulation"] = false;
  j["latchkey"]["window_schedule"] = {1, 2, 4};
  j["latchkey"]["data"] = {{"synthetic", {{"seed", 18446744073709551615ULL}}}, {"dtype", "uint32"}};
  j["latchkey"]["init_from"] = "ckpt";
  j["latchkey"]["kv_reduce"] = "deferred";
  j["latchkey"]["seed"] = 123456789012345ULL;
  j["optimizer"]["params"] = {{"lr", 3e-4}, {"betas", {0.8, 0.95}}, {"eps", 1e-6}};
  variants.push_back(j);

  for (const json& v : variants) {
    absl::StatusOr<JobSpec> a = Parse(v);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string text = JobSpecToJson(*a);
    absl::StatusOr<JobSpec> b = ParseJobSpec(text, "/somewhere/else");
    ASSERT_TRUE(b.ok()) << b.status() << "\n" << text;
    EXPECT_EQ(*a, *b) << text;
    EXPECT_EQ(JobSpecToJson(*b), text);  // canonical: a fixed point
  }
}

TEST(JobSpecTest, JsonRoundTripDropsWarnings) {
  json j = Example();
  j["wall_clock_breakdown"] = false;
  absl::StatusOr<JobSpec> a = Parse(j);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->warnings.size(), 1u);
  absl::StatusOr<JobSpec> b = ParseJobSpec(JobSpecToJson(*a), "/");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->warnings.empty());
  EXPECT_NE(*a, *b);
  a->warnings.clear();
  EXPECT_EQ(*a, *b);
}

}  // namespace
}  // namespace latchkey

namespace latchkey {
namespace {

nlohmann::json MaskSpec() {
  return nlohmann::json::parse(R"({
    "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
              "vocab_size": 256, "n_positions": 64},
    "gradient_accumulation_steps": 3,
    "latchkey": {"seq_len": 16, "steps": 2, "data": {"synthetic": {"seed": 1}}}})");
}

TEST(NoSyncMask, ParsedAndUsedByTheGate) {
  nlohmann::json j = MaskSpec();
  j["latchkey"]["no_sync"] = {false, true, false};
  auto spec = ParseJobSpec(j.dump(), "/tmp");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->no_sync, (std::vector<bool>{false, true, false}));
  const Latch latch = DecideLatch(*spec, InitialPolicy(*spec), 0, 0);
  EXPECT_EQ(latch.no_sync, (std::vector<bool>{false, true, false}));
  auto back = ParseJobSpec(JobSpecToJson(*spec), "/");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->no_sync, spec->no_sync);
}

TEST(NoSyncMask, Refusals) {
  for (const auto& [mask, field] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{true, true}, "latchkey.no_sync"},
           {{true, true, true}, "latchkey.no_sync[2]"},
           {{true, 1, false}, "latchkey.no_sync[1]"},
           {nlohmann::json::array(), "latchkey.no_sync"}}) {
    nlohmann::json j = MaskSpec();
    j["latchkey"]["no_sync"] = mask;
    auto spec = ParseJobSpec(j.dump(), "/tmp");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << mask.dump();
    EXPECT_EQ(spec.status().message().rfind(field + ":", 0), 0u) << spec.status();
  }
}

}  // namespace
}  // namespace latchkey
