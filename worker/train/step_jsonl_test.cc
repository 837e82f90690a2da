// The per-step JSONL record of a diverged step: a loss, grad_norm or eval_loss that is not finite
// is null (JSON has no NaN or Inf), every other field as on any step.
#include "worker/train/step_jsonl.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace latchkey {
namespace {

TEST(StepJsonl, NonFiniteValuesAreNullAndTheRestIsKept) {
  StepReport r;
  r.step = 1;
  r.micro_batches = 2;
  r.loss = std::nan("");
  r.grad_norm = std::numeric_limits<double>::infinity();
  r.eval_loss = -std::numeric_limits<double>::infinity();
  r.lr = 1e9;
  r.tokens = 128;
  r.step_seconds = 0.5;
  r.collective_calls = {{"all_reduce/tp", 17}};
  const std::string line = StepReportJson(0, r);
  EXPECT_EQ(line.find("NaN"), std::string::npos) << line;
  EXPECT_EQ(line.find("Infinity"), std::string::npos) << line;
  const nlohmann::json j = nlohmann::json::parse(line);  // valid JSON
  EXPECT_TRUE(j["loss"].is_null()) << line;
  EXPECT_TRUE(j["grad_norm"].is_null()) << line;
  EXPECT_TRUE(j["eval_loss"].is_null()) << line;
  EXPECT_EQ(j["step"], 1);
  EXPECT_EQ(j["lr"], 1e9);
  EXPECT_EQ(j["tokens"], 128);
  EXPECT_EQ(j["collective_calls"]["all_reduce/tp"], 17);
  EXPECT_EQ(j["tokens_per_second"], 256.0);

  r.loss = 5.5;
  r.grad_norm = 1.25;
  r.eval_loss.reset();
  const nlohmann::json finite = nlohmann::json::parse(StepReportJson(0, r));
  EXPECT_EQ(finite["loss"], 5.5);
  EXPECT_EQ(finite["grad_norm"], 1.25);
  EXPECT_FALSE(finite.contains("eval_loss"));
}

}  // namespace
}  // namespace latchkey
