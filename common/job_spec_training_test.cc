// The training keys of the job spec: the top-level `scheduler` (DeepSpeed's LR schedules) and
// `latchkey.eval`: defaults, every refusal naming its field, warnings, the canonical form.
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

json Base() {
  return json::parse(R"({
    "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
              "vocab_size": 256, "n_positions": 64},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
    "latchkey": {"seq_len": 32, "steps": 6, "data": {"tokens_file": "tokens.bin"}}})");
}

absl::StatusOr<JobSpec> Parse(const json& j) { return ParseJobSpec(j.dump(), "/jobs/a"); }

json WithScheduler(const std::string& type, const json& params) {
  json j = Base();
  j["scheduler"] = {{"type", type}};
  if (!params.is_null()) j["scheduler"]["params"] = params;
  return j;
}

TEST(SchedulerSpec, AbsentMeansConstantLr) {
  auto spec = Parse(Base());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->scheduler.type, SchedulerType::kNone);
  EXPECT_FALSE(spec->eval.enabled());
  EXPECT_EQ(json::parse(JobSpecToJson(*spec)).count("scheduler"), 0u);
  EXPECT_EQ(json::parse(JobSpecToJson(*spec))["latchkey"].count("eval"), 0u);
}

TEST(SchedulerSpec, WarmupLrDefaults) {
  auto spec = Parse(WithScheduler("WarmupLR", nullptr));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const SchedulerConfig& c = spec->scheduler;
  EXPECT_EQ(c.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(c.warmup_min_lr, 0.0);
  EXPECT_EQ(c.warmup_max_lr, 0.002);  // the optimizer's lr
  EXPECT_EQ(c.warmup_num_steps, 1000);
  EXPECT_EQ(c.warmup_type, WarmupType::kLog);
  EXPECT_TRUE(spec->warnings.empty());
}

TEST(SchedulerSpec, WarmupLrMaxDefaultsToTheOptimizersLrWhateverTheKeyOrder) {
  json j = WithScheduler("WarmupLR", {{"warmup_num_steps", 3}});
  j.erase("optimizer");
  j["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.25}}}};
  auto spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->scheduler.warmup_max_lr, 0.25);
  EXPECT_EQ(spec->scheduler.warmup_num_steps, 3);
}

TEST(SchedulerSpec, WarmupDecayLrDefaults) {
  auto spec = Parse(WithScheduler("WarmupDecayLR", {{"total_num_steps", 5000}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const SchedulerConfig& c = spec->scheduler;
  EXPECT_EQ(c.type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(c.total_num_steps, 5000);
  EXPECT_EQ(c.warmup_min_lr, 0.0);
  EXPECT_EQ(c.warmup_max_lr, 0.001);  // the constructor's default, not the optimizer's lr
  EXPECT_EQ(c.warmup_num_steps, 1000);
  EXPECT_EQ(c.warmup_type, WarmupType::kLog);
}

TEST(SchedulerSpec, WarmupCosineLrDefaults) {
  auto spec = Parse(WithScheduler("WarmupCosineLR", {{"total_num_steps", 5000}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const SchedulerConfig& c = spec->scheduler;
  EXPECT_EQ(c.type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(c.total_num_steps, 5000);
  EXPECT_EQ(c.warmup_min_ratio, 0.0);
  EXPECT_EQ(c.cos_min_ratio, 1e-4);
  EXPECT_EQ(c.warmup_num_steps, 1000);
  EXPECT_EQ(c.warmup_type, WarmupType::kLog);
}

TEST(SchedulerSpec, EveryParameterRead) {
  auto spec = Parse(WithScheduler("WarmupCosineLR", {{"total_num_steps", 6},
                                                     {"warmup_num_steps", 2},
                                                     {"warmup_type", "linear"},
                                                     {"warmup_min_ratio", 0.1},
                                                     {"cos_min_ratio", 0.05}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(spec->scheduler.warmup_min_ratio, 0.1);
  EXPECT_EQ(spec->scheduler.cos_min_ratio, 0.05);
  spec = Parse(WithScheduler("WarmupDecayLR", {{"total_num_steps", 5},
                                               {"warmup_min_lr", 1e-4},
                                               {"warmup_max_lr", 0.5},
                                               {"warmup_num_steps", 2},
                                               {"warmup_type", "log"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->scheduler.warmup_min_lr, 1e-4);
  EXPECT_EQ(spec->scheduler.warmup_max_lr, 0.5);
}

TEST(SchedulerSpec, TotalBelowWarmupIsAcceptedWithAWarning) {
  auto spec =
      Parse(WithScheduler("WarmupDecayLR", {{"total_num_steps", 3}, {"warmup_num_steps", 10}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->warnings, ElementsAre("scheduler.params.total_num_steps: 3 is less than "
                                          "warmup_num_steps (10)"));
  // Compared with the raised warmup length (at least 2), as DeepSpeed does.
  spec = Parse(WithScheduler("WarmupCosineLR", {{"total_num_steps", 1}, {"warmup_num_steps", 1}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->warnings, ElementsAre(HasSubstr("1 is less than warmup_num_steps (2)")));
}

TEST(SchedulerSpec, UnknownKeysOfTheBlockAreWarnings) {
  json j = WithScheduler("WarmupLR", nullptr);
  j["scheduler"]["comment"] = "x";
  auto spec = Parse(j);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->warnings, ElementsAre("unknown key 'scheduler.comment' ignored"));
}

struct Refusal {
  const char* name;
  json spec;
  std::string path;
  std::string reason;
};

void PrintTo(const Refusal& r, std::ostream* os) { *os << r.name; }

class TrainingSpecRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(TrainingSpecRefusal, NamesTheField) {
  const Refusal& r = GetParam();
  auto spec = Parse(r.spec);
  ASSERT_FALSE(spec.ok()) << r.spec.dump();
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(r.path + ": "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(r.reason));
}

json WithEval(const json& eval) {
  json j = Base();
  j["latchkey"]["eval"] = eval;
  return j;
}

const json kEval = {{"tokens_file", "eval.bin"}, {"every_steps", 2}, {"samples", 4}};

json EvalWith(const std::string& key, const json& value) {
  json e = kEval;
  if (value.is_null()) {
    e.erase(key);
  } else {
    e[key] = value;
  }
  return WithEval(e);
}

std::vector<Refusal> Refusals() {
  const json total = {{"total_num_steps", 10}};
  json not_object = Base();
  not_object["scheduler"] = "WarmupLR";
  json no_type = Base();
  no_type["scheduler"] = {{"params", total}};
  json params_not_object = WithScheduler("WarmupLR", nullptr);
  params_not_object["scheduler"]["params"] = 5;
  json type_not_string = Base();
  type_not_string["scheduler"] = {{"type", 1}};
  return {
      {"NotAnObject", not_object, "scheduler", "must be an object"},
      {"TypeMissing", no_type, "scheduler.type", "required"},
      {"TypeNotString", type_not_string, "scheduler.type", "must be a string"},
      {"TypeUnknown", WithScheduler("OneCycle", nullptr), "scheduler.type",
       "unknown scheduler 'OneCycle' (WarmupLR, WarmupDecayLR, WarmupCosineLR)"},
      {"TypeCase", WithScheduler("warmuplr", nullptr), "scheduler.type", "warmuplr"},
      {"ParamsNotObject", params_not_object, "scheduler.params", "must be an object"},
      {"WarmupLrUnknownParam", WithScheduler("WarmupLR", total), "scheduler.params.total_num_steps",
       "unknown or unsupported parameter for WarmupLR"},
      {"WarmupLrLastBatchIteration", WithScheduler("WarmupLR", {{"last_batch_iteration", 5}}),
       "scheduler.params.last_batch_iteration", "unknown or unsupported parameter"},
      {"CosineTakesNoLr",
       WithScheduler("WarmupCosineLR", {{"total_num_steps", 10}, {"warmup_max_lr", 0.1}}),
       "scheduler.params.warmup_max_lr", "unknown or unsupported parameter for WarmupCosineLR"},
      {"DecayTakesNoRatio",
       WithScheduler("WarmupDecayLR", {{"total_num_steps", 10}, {"cos_min_ratio", 0.1}}),
       "scheduler.params.cos_min_ratio", "unknown or unsupported parameter for WarmupDecayLR"},
      {"WarmupTypeUnknown", WithScheduler("WarmupLR", {{"warmup_type", "cosine"}}),
       "scheduler.params.warmup_type", "unknown warmup_type 'cosine' (log, linear)"},
      {"WarmupTypeNotString", WithScheduler("WarmupLR", {{"warmup_type", 1}}),
       "scheduler.params.warmup_type", "must be a string"},
      {"WarmupStepsZero", WithScheduler("WarmupLR", {{"warmup_num_steps", 0}}),
       "scheduler.params.warmup_num_steps", "must be a positive integer, got 0"},
      {"WarmupStepsFloat", WithScheduler("WarmupLR", {{"warmup_num_steps", 2.5}}),
       "scheduler.params.warmup_num_steps", "integer"},
      {"DecayTotalMissing", WithScheduler("WarmupDecayLR", nullptr),
       "scheduler.params.total_num_steps", "required"},
      {"CosineTotalMissing", WithScheduler("WarmupCosineLR", {{"warmup_num_steps", 2}}),
       "scheduler.params.total_num_steps", "required"},
      {"TotalZero", WithScheduler("WarmupCosineLR", {{"total_num_steps", 0}}),
       "scheduler.params.total_num_steps", ">= 1"},
      {"MinLrNegative", WithScheduler("WarmupLR", {{"warmup_min_lr", -0.1}}),
       "scheduler.params.warmup_min_lr", ""},
      {"MaxLrType", WithScheduler("WarmupLR", {{"warmup_max_lr", "big"}}),
       "scheduler.params.warmup_max_lr", "must be a number"},
      {"MinRatioNegative",
       WithScheduler("WarmupCosineLR", {{"total_num_steps", 4}, {"warmup_min_ratio", -1}}),
       "scheduler.params.warmup_min_ratio", ""},
      {"CosMinRatioNegative",
       WithScheduler("WarmupCosineLR", {{"total_num_steps", 4}, {"cos_min_ratio", -1e-4}}),
       "scheduler.params.cos_min_ratio", ""},
      {"EvalNotObject", WithEval(3), "latchkey.eval", "must be an object"},
      {"EvalTokensFileMissing", EvalWith("tokens_file", nullptr), "latchkey.eval.tokens_file",
       "required"},
      {"EvalTokensFileEmpty", EvalWith("tokens_file", ""), "latchkey.eval.tokens_file",
       "must not be empty"},
      {"EvalTokensFileType", EvalWith("tokens_file", 7), "latchkey.eval.tokens_file",
       "must be a string"},
      {"EvalDtypeUnknown", EvalWith("dtype", "int8"), "latchkey.eval.dtype", "int8"},
      {"EvalEveryStepsMissing", EvalWith("every_steps", nullptr), "latchkey.eval.every_steps",
       "required"},
      {"EvalEveryStepsZero", EvalWith("every_steps", 0), "latchkey.eval.every_steps", ">= 1"},
      {"EvalEveryStepsType", EvalWith("every_steps", "2"), "latchkey.eval.every_steps",
       "must be an integer"},
      {"EvalSamplesMissing", EvalWith("samples", nullptr), "latchkey.eval.samples", "required"},
      {"EvalSamplesZero", EvalWith("samples", 0), "latchkey.eval.samples", ">= 1"},
      {"EvalSamplesNegative", EvalWith("samples", -3), "latchkey.eval.samples", ">= 1"},
      {"EvalUnknownKey", EvalWith("batch_size", 4), "latchkey.eval.batch_size", "unknown key"},
  };
}

INSTANTIATE_TEST_SUITE_P(Rules, TrainingSpecRefusal, ::testing::ValuesIn(Refusals()),
                         [](const ::testing::TestParamInfo<Refusal>& info) {
                           return std::string(info.param.name);
                         });

TEST(EvalSpec, ParsedWithItsPathResolved) {
  auto spec = Parse(WithEval(kEval));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->eval.enabled());
  EXPECT_EQ(spec->eval.tokens_file, "/jobs/a/eval.bin");
  EXPECT_EQ(spec->eval.dtype, TokenDtype::kUint16);
  EXPECT_EQ(spec->eval.every_steps, 2);
  EXPECT_EQ(spec->eval.samples, 4);
  json e = kEval;
  e["dtype"] = "uint32";
  e["tokens_file"] = "/data/held-out.bin";
  spec = Parse(WithEval(e));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->eval.dtype, TokenDtype::kUint32);
  EXPECT_EQ(spec->eval.tokens_file, "/data/held-out.bin");
}

TEST(TrainingSpec, CanonicalFormRoundTrips) {
  std::vector<json> variants = {
      WithScheduler("WarmupLR", nullptr),
      WithScheduler("WarmupLR",
                    {{"warmup_min_lr", 1e-4}, {"warmup_max_lr", 3e-3}, {"warmup_num_steps", 3}}),
      WithScheduler("WarmupDecayLR", {{"total_num_steps", 5},
                                      {"warmup_num_steps", 2},
                                      {"warmup_max_lr", 0.5},
                                      {"warmup_type", "linear"}}),
      WithScheduler("WarmupCosineLR", {{"total_num_steps", 6},
                                       {"warmup_num_steps", 2},
                                       {"warmup_type", "linear"},
                                       {"cos_min_ratio", 0.02}}),
      WithScheduler("WarmupDecayLR", {{"total_num_steps", 1}, {"warmup_num_steps", 4}}),
  };
  for (size_t i = 0; i < variants.size(); ++i) {
    json e = kEval;
    if (i % 2 == 1) e["dtype"] = "uint32";
    variants[i]["latchkey"]["eval"] = e;
  }
  for (const json& v : variants) {
    auto a = Parse(v);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string text = JobSpecToJson(*a);
    auto b = ParseJobSpec(text, "/somewhere/else");
    ASSERT_TRUE(b.ok()) << b.status() << "\n" << text;
    EXPECT_EQ(*a, *b) << text;  // the total < warmup warning is made again from the values
    EXPECT_EQ(JobSpecToJson(*b), text);
    const json canonical = json::parse(text);
    EXPECT_EQ(canonical["latchkey"]["eval"]["tokens_file"], "/jobs/a/eval.bin");
    EXPECT_TRUE(canonical["scheduler"]["params"].contains("warmup_type")) << text;
  }
}

TEST(TrainingSpec, CanonicalSchedulerNamesEveryParameterOfItsType) {
  auto spec = Parse(WithScheduler("WarmupLR", nullptr));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(json::parse(JobSpecToJson(*spec))["scheduler"],
            json::parse(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
              "warmup_max_lr": 0.002, "warmup_num_steps": 1000, "warmup_type": "log"}})"));
  spec = Parse(WithScheduler("WarmupCosineLR", {{"total_num_steps", 9}}));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(json::parse(JobSpecToJson(*spec))["scheduler"],
            json::parse(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 9,
              "warmup_min_ratio": 0.0, "cos_min_ratio": 0.0001, "warmup_num_steps": 1000,
              "warmup_type": "log"}})"));
}

}  // namespace
}  // namespace latchkey
