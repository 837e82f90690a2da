// The evaluation loss (latchkey.eval) in real multi-process jobs: the same value at DP 1 and DP 2
// when K is not divisible by DP; training (losses, grad norms, dropout, weights) and each step's
// collective counts unchanged by evaluation; eval_loss exactly on the due steps and lr on every
// step; a bad eval file refused naming latchkey.eval.tokens_file.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <vector>

#include "tests/support/launch.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

nlohmann::json Eval(int every_steps, int samples) {
  return {{"tokens_file", FixtureDir() + "/eval.bin"},
          {"dtype", "uint16"},
          {"every_steps", every_steps},
          {"samples", samples}};
}

// WarmupLR from 0 (its default warmup_min_lr): steps 0 and 1 update with lr 0, so the weights
// evaluated after them are the fixture checkpoint's, whatever the layout.
RunShape ZeroLrStart(int dp, int samples) {
  RunShape s;
  s.variant = "mqa";
  s.mb = 1;
  s.gas = 2;
  s.dp = dp;
  s.steps = 3;
  s.scheduler = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}}}};
  s.eval = Eval(1, samples);
  return s;
}

TEST(EvalTest, DpTwoWithThreeSamplesEqualsDpOne) {
  WorkerRun one = RunWorkers(FixtureSpec(ZeroLrStart(1, 3)), 1);
  ASSERT_TRUE(one.ok()) << one.Describe();
  WorkerRun two = RunWorkers(FixtureSpec(ZeroLrStart(2, 3)), 2);
  ASSERT_TRUE(two.ok()) << two.Describe();
  ASSERT_EQ(one.steps[0].size(), 3u);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(two.steps[r].size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      const nlohmann::json& a = one.steps[0][s];
      const nlohmann::json& b = two.steps[r][s];
      ASSERT_TRUE(a.contains("eval_loss") && b.contains("eval_loss")) << b.dump();
      const double ea = a["eval_loss"].get<double>();
      const double eb = b["eval_loss"].get<double>();
      if (s < 2) {
        EXPECT_EQ(a["lr"].get<double>(), 0.0);
        // Same weights, the same per-sample forwards, float64 sums of the same three values.
        EXPECT_EQ(ea, eb) << "rank " << r << " step " << s;
      } else {
        // Step 2 trains (lr > 0) on the window's samples, which depend on DP: no comparison.
        EXPECT_GT(a["lr"].get<double>(), 0.0);
      }
      EXPECT_EQ(eb, two.steps[0][s]["eval_loss"].get<double>()) << "every rank reports it";
      EXPECT_GT(ea, 5.0);
      EXPECT_LT(ea, 6.0);
    }
  }
  // K = 3 with the DP 2 split {0, 2} / {1} is the mean of three samples, not of the two ranks'
  // means: a run with K = 2 (one sample per rank) differs from it.
  WorkerRun k2 = RunWorkers(FixtureSpec(ZeroLrStart(2, 2)), 2);
  ASSERT_TRUE(k2.ok()) << k2.Describe();
  EXPECT_NE(k2.steps[0][0]["eval_loss"].get<double>(), two.steps[0][0]["eval_loss"].get<double>());
}

TEST(EvalTest, KLargerThanTheFileWrapsAround) {
  // eval.bin holds 2000 tokens: floor(1999 / 32) = 62 samples; K = 124 takes each one twice.
  // The one rank computes with the threads each of the two ranks has (LOCAL_WORLD_SIZE 2):
  // float32 results depend on the thread count (on an AMD EPYC, one rank with both cores
  // differed by 8e-9 from the two ranks with one each), and this compares the samples taken.
  WorkerRun once = RunWorkers(FixtureSpec(ZeroLrStart(1, 62)), 1, {}, std::chrono::seconds(300),
                              /*local_world_size=*/2);
  ASSERT_TRUE(once.ok()) << once.Describe();
  WorkerRun twice = RunWorkers(FixtureSpec(ZeroLrStart(2, 124)), 2);
  ASSERT_TRUE(twice.ok()) << twice.Describe();
  EXPECT_NEAR(once.steps[0][0]["eval_loss"].get<double>(),
              twice.steps[0][0]["eval_loss"].get<double>(), 1e-12);
}

// Evaluation leaves training exactly as it is: the same losses, grad norms and weights (dropout
// on, so its random streams must not be touched), and each step's collective counts are the
// training window's alone.
TEST(EvalTest, TrainingAndStepCollectiveCountsUnchangedByEval) {
  RunShape s = Dp2Tp2Shape();
  s.variant = "mqa";
  s.gas = 2;
  s.zero = 1;
  s.steps = 3;
  s.optimizer = "AdamW";
  s.lr = 0.002;
  s.kv_reduce = "coalesced";
  nlohmann::json plain = FixtureSpec(s);
  plain["model"]["resid_pdrop"] = 0.1;
  plain["model"]["attn_pdrop"] = 0.1;
  plain["model"]["embd_pdrop"] = 0.1;
  nlohmann::json with_eval = plain;
  with_eval["latchkey"]["eval"] = Eval(1, 3);
  WorkerRun a = RunWorkers(plain, 4, {"--save", "{dir}/final"});
  ASSERT_TRUE(a.ok()) << a.Describe();
  WorkerRun b = RunWorkers(with_eval, 4, {"--save", "{dir}/final"});
  ASSERT_TRUE(b.ok()) << b.Describe();
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(a.steps[r].size(), 3u);
    ASSERT_EQ(b.steps[r].size(), 3u);
    for (size_t st = 0; st < 3; ++st) {
      const nlohmann::json& x = a.steps[r][st];
      const nlohmann::json& y = b.steps[r][st];
      EXPECT_FALSE(x.contains("eval_loss"));
      EXPECT_TRUE(y.contains("eval_loss")) << y.dump();
      EXPECT_EQ(x["loss"], y["loss"]) << "rank " << r << " step " << st;
      EXPECT_EQ(x["grad_norm"], y["grad_norm"]) << "rank " << r << " step " << st;
      EXPECT_EQ(x["collective_calls"], y["collective_calls"]) << "rank " << r << " step " << st;
      EXPECT_EQ(x["kv_allreduce_calls"], y["kv_allreduce_calls"]) << "rank " << r;
      EXPECT_EQ(x["lr"], y["lr"]);
      EXPECT_EQ(y["eval_loss"], b.steps[0][st]["eval_loss"]) << "rank " << r << " step " << st;
    }
  }
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string wa = read(a.dir + "/final/model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == read(b.dir + "/final/model.safetensors")) << "weights differ";
}

TEST(EvalTest, EvalLossOnTheDueStepsAndLrOnEveryStep) {
  RunShape s = ZeroLrStart(1, 2);
  s.steps = 5;
  s.eval = Eval(2, 2);
  WorkerRun w = RunWorkers(FixtureSpec(s), 1);
  ASSERT_TRUE(w.ok()) << w.Describe();
  ASSERT_EQ(w.steps[0].size(), 5u);
  for (size_t st = 0; st < 5; ++st) {
    const nlohmann::json& rec = w.steps[0][st];
    EXPECT_TRUE(rec.contains("lr")) << rec.dump();
    // (s + 1) % 2 == 0, or the last step.
    EXPECT_EQ(rec.contains("eval_loss"), st == 1 || st == 3 || st == 4) << rec.dump();
  }
  // The key order of the record: lr and eval_loss come last.
  std::ifstream in(w.dir + "/steps-0.jsonl");
  std::string line;
  for (int i = 0; i < 4; ++i) std::getline(in, line);
  std::vector<std::string> keys;
  const nlohmann::ordered_json record = nlohmann::ordered_json::parse(line);
  for (const auto& item : record.items()) keys.push_back(item.key());
  ASSERT_GE(keys.size(), 2u);
  EXPECT_EQ(keys[keys.size() - 2], "lr");
  EXPECT_EQ(keys.back(), "eval_loss");
}

void WriteTokens(const std::string& path, const std::vector<uint16_t>& ids) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(ids.data()),
            static_cast<std::streamsize>(ids.size() * sizeof(uint16_t)));
}

TEST(EvalTest, BadEvalFileIsRefusedNamingTheField) {
  ScopedTempDir tmp("eval");
  const std::string short_file = tmp.path() + "/short.bin";
  WriteTokens(short_file, std::vector<uint16_t>(32, 7));  // seq_len 32 needs 33
  const std::string big_id = tmp.path() + "/big.bin";
  std::vector<uint16_t> ids(100, 3);
  ids[40] = 256;  // vocab 256
  WriteTokens(big_id, ids);
  for (const std::string& file : {short_file, big_id, tmp.path() + "/missing.bin"}) {
    RunShape s = ZeroLrStart(1, 2);
    s.steps = 1;
    s.eval = Eval(1, 2);
    s.eval["tokens_file"] = file;
    WorkerRun w = RunWorkers(FixtureSpec(s), 1);
    ASSERT_EQ(w.exit_codes.size(), 1u);
    EXPECT_EQ(w.exit_codes[0], 1) << w.Describe();
    EXPECT_NE(w.stderr_text[0].find("latchkey.eval.tokens_file: "), std::string::npos)
        << w.Describe();
  }
}

}  // namespace
}  // namespace latchkey::testing
