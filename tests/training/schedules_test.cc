// Every run of testdata/gptbigcode-tiny/expected-schedules.json (made by an independent float64
// implementation: AdamW and SGD, DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR,
// clipping, DP 2, evaluation loss) reproduced by real multi-process jobs at TP 1, 2 and 4:
// loss and eval loss within 1e-5, grad norm within 1e-5 relative, lr within 1e-9 relative,
// final parameter norms within 1e-6 relative after SGD and 1e-3 relative after AdamW, each
// tensor's norm change from the initial weights within 0.5% (SGD) and 2% (AdamW; there the key
// entries of c_attn.bias, whose gradient is zero, are checked apart), and eval_loss in exactly
// the JSONL records of the steps where the fixture evaluated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "tests/support/launch.h"
#include "tests/support/specs.h"

namespace latchkey::testing {
namespace {

struct Case {
  size_t run;
  int tp;
};

nlohmann::json Expected() {
  std::ifstream in(FixtureDir() + "/expected-schedules.json");
  return nlohmann::json::parse(in);
}

std::string Name(const ::testing::TestParamInfo<Case>& i) {
  const nlohmann::json run = Expected()["runs"][i.param.run];
  return "run" + std::to_string(i.param.run) + "_" + run["variant"].get<std::string>() + "_" +
         run["optimizer"]["type"].get<std::string>() + "_" +
         run["scheduler"]["type"].get<std::string>() + "_tp" + std::to_string(i.param.tp);
}

void PrintTo(const Case& c, std::ostream* os) { *os << "run " << c.run << " tp " << c.tp; }

std::vector<Case> AllCases() {
  std::vector<Case> out;
  const size_t runs = Expected()["runs"].size();
  for (size_t i = 0; i < runs; ++i) {
    for (int tp : {1, 2, 4}) out.push_back({i, tp});
  }
  return out;
}

// |got - want| / |want|; 0 when both are 0, infinite when only want is.
double RelDiff(double got, double want) {
  const double d = std::fabs(got - want);
  if (d == 0.0) return 0.0;
  return want == 0.0 ? INFINITY : d / std::fabs(want);
}

// The job spec of fixture run `run` on dp x tp ranks.
nlohmann::json RunSpec(const nlohmann::json& run, int tp) {
  RunShape shape;
  shape.variant = run["variant"];
  shape.mb = run["MB"];
  shape.gas = run["GAS"];
  shape.dp = run["DP"];
  shape.tp = tp;
  shape.clip = run["clip"];
  shape.steps = run["steps"];
  shape.zero = 0;
  shape.kv_reduce = "auto";
  const nlohmann::json& opt = run["optimizer"];
  shape.optimizer = opt["type"];
  shape.lr = opt["lr"];
  if (opt.contains("weight_decay")) shape.weight_decay = opt["weight_decay"].get<double>();
  shape.scheduler = run["scheduler"];
  shape.eval = {{"tokens_file", FixtureDir() + "/eval.bin"},
                {"dtype", "uint16"},
                {"every_steps", run["eval"]["every_steps"]},
                {"samples", run["eval"]["samples"]}};
  return FixtureSpec(shape);
}

TEST(ScheduleFixture, CoversEveryScheduleBothOptimizersAndDp2) {
  const nlohmann::json e = Expected();
  ASSERT_EQ(e["seq_len"], 32);
  ASSERT_EQ(e["tokens_file"], "tokens.bin");
  ASSERT_EQ(e["eval_tokens_file"], "eval.bin");
  ASSERT_EQ(e["dtype"], "uint16");
  std::set<std::string> schedules, optimizers;
  bool dp2 = false;
  for (const auto& run : e["runs"]) {
    schedules.insert(run["scheduler"]["type"].get<std::string>());
    optimizers.insert(run["optimizer"]["type"].get<std::string>());
    dp2 = dp2 || run["DP"] == 2;
    // The optimizer keys this test maps into the spec; anything else would be silently dropped.
    for (auto it = run["optimizer"].begin(); it != run["optimizer"].end(); ++it) {
      EXPECT_TRUE(it.key() == "type" || it.key() == "lr" || it.key() == "weight_decay") << it.key();
    }
    EXPECT_EQ(run["per_step"].size(), run["steps"].get<size_t>());
  }
  EXPECT_EQ(schedules, (std::set<std::string>{"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}));
  EXPECT_EQ(optimizers, (std::set<std::string>{"SGD", "AdamW"}));
  EXPECT_TRUE(dp2);
}

// The entries of c_attn.bias that add one vector b to every key: a query's scores q·(k_j + b)
// all move by q·b, which softmax ignores, so their gradient is exactly zero. The float64
// fixture keeps them at their initial values times AdamW's decay (its gradient there is ~1e-17:
// transformers in float64, softmax too, gives 7e-18). Float32 leaves ~3e-9 of rounding in them,
// which AdamW divides by its own root (plus eps 1e-8) into steps of up to lr in no direction: with
// them, h.0.attn.c_attn.bias's norm change differed from the fixture's by 7.2% on one CPU and by
// 16.8% on another. Layout: multi-query [q n_embd | k head_dim | v head_dim]; multi-head, per
// head [q | k | v] of head_dim each.
std::vector<bool> KeyBiasEntries(const std::string& variant) {
  std::ifstream in(FixtureDir() + "/" + variant + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  const int n_embd = config["n_embd"], heads = config["n_head"], hd = n_embd / heads;
  if (config["multi_query"].get<bool>()) {
    std::vector<bool> key(n_embd + 2 * hd, false);
    for (int i = 0; i < hd; ++i) key[n_embd + i] = true;
    return key;
  }
  std::vector<bool> key(3 * n_embd, false);
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < hd; ++i) key[h * 3 * hd + hd + i] = true;
  }
  return key;
}

// For an AdamW run's c_attn.bias: checks each key entry against the fixture's value (its
// initial value decayed by (1 - lr_t * weight_decay) every step) within the most Adam can move
// a coordinate, lr_t * (1 - beta1) / sqrt(1 - beta2) per step (Kingma & Ba, section 2.1), takes
// the key entries out of `got` and `start`, and returns the fixture's norm of the rest.
double CheckKeyBiasAndRemoveIt(const nlohmann::json& run, const std::string& name,
                               std::vector<double>& got, std::vector<double>& start,
                               double want_norm) {
  const std::vector<bool> key = KeyBiasEntries(run["variant"]);
  EXPECT_EQ(got.size(), key.size()) << name;
  if (got.size() != key.size() || start.size() != key.size()) return want_norm;
  const double wd = run["optimizer"].value("weight_decay", 0.0);
  double decay = 1.0, bound = 0.0;
  for (const auto& step : run["per_step"]) {
    decay *= 1.0 - step["lr"].get<double>() * wd;
    bound += step["lr"].get<double>() * (1.0 - 0.9) / std::sqrt(1.0 - 0.999);
  }
  std::vector<double> got_rest, start_rest;
  double want_key_sq = 0.0;
  for (size_t i = 0; i < key.size(); ++i) {
    if (!key[i]) {
      got_rest.push_back(got[i]);
      start_rest.push_back(start[i]);
      continue;
    }
    const double want = start[i] * decay;
    want_key_sq += want * want;
    EXPECT_LE(std::fabs(got[i] - want), bound) << name << "[" << i << "]: " << got[i] << " want "
                                               << want << " (a key bias has no gradient)";
  }
  got = got_rest;
  start = start_rest;
  return std::sqrt(want_norm * want_norm - want_key_sq);
}

class ScheduleRun : public ::testing::TestWithParam<Case> {};

TEST_P(ScheduleRun, ReproducesLossGradNormLrEvalLossAndParams) {
  const Case& c = GetParam();
  const nlohmann::json run = Expected()["runs"][c.run];
  const int dp = run["DP"];
  const int steps = run["steps"];
  const int world = dp * c.tp;
  WorkerRun w = RunWorkers(RunSpec(run, c.tp), world, {"--save", "{dir}/final"});
  ASSERT_TRUE(w.ok()) << w.Describe();

  double max_loss = 0, max_grad = 0, max_lr = 0, max_eval = 0, max_norm = 0;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(w.steps[r].size(), static_cast<size_t>(steps)) << w.Describe();
    for (int s = 0; s < steps; ++s) {
      const nlohmann::json& got = w.steps[r][s];
      const nlohmann::json& want = run["per_step"][s];
      const std::string at = "rank " + std::to_string(r) + " step " + std::to_string(s);
      ASSERT_EQ(got["step"], s) << at;

      const double loss = got["loss"].get<double>(), want_loss = want["loss"].get<double>();
      EXPECT_NEAR(loss, want_loss, 1e-5) << at;
      max_loss = std::max(max_loss, std::fabs(loss - want_loss));

      const double grad = RelDiff(got["grad_norm"].get<double>(), want["grad_norm"].get<double>());
      EXPECT_LE(grad, 1e-5) << at << ": grad_norm " << got["grad_norm"] << " want "
                            << want["grad_norm"];
      max_grad = std::max(max_grad, grad);

      ASSERT_TRUE(got.contains("lr") && got["lr"].is_number()) << at << ": " << got.dump();
      const double lr = RelDiff(got["lr"].get<double>(), want["lr"].get<double>());
      EXPECT_LE(lr, 1e-9) << at << ": lr " << got["lr"] << " want " << want["lr"];
      max_lr = std::max(max_lr, lr);

      if (want.contains("eval_loss")) {
        ASSERT_TRUE(got.contains("eval_loss") && got["eval_loss"].is_number())
            << at << ": no eval_loss in " << got.dump();
        const double ev = got["eval_loss"].get<double>();
        const double want_ev = want["eval_loss"].get<double>();
        EXPECT_NEAR(ev, want_ev, 1e-5) << at;
        max_eval = std::max(max_eval, std::fabs(ev - want_ev));
      } else {
        EXPECT_FALSE(got.contains("eval_loss")) << at << ": no evaluation expected: " << got.dump();
      }
    }
  }

  const auto final_tensors = TensorsOf(w.dir + "/final/model.safetensors");
  const auto initial_tensors =
      TensorsOf(FixtureDir() + "/" + run["variant"].get<std::string>() + "/model.safetensors");
  const auto& want_norms = run["final_param_l2"];
  const bool sgd = run["optimizer"]["type"] == "SGD";
  const double norm_tol = sgd ? 1e-6 : 1e-3;
  // How far training moved each tensor's norm from the initial weights' (the fixture's start):
  // the final norm alone cannot tell a trained tensor from an untrained one where training
  // changes the norm by less than the norm tolerance (17 of 28 tensors after run 0's AdamW).
  // SGD's changes agree to 0.5% (measured: at most 0.11%, the smallest changes, ~1e-4 of the
  // LayerNorm weights, at TP 4), AdamW's to 2% (measured: at most 0.2%, h.0.ln_1.bias of run 0,
  // whose change is ~2e-5; c_attn.bias without its key entries, which are checked apart
  // (CheckKeyBiasAndRemoveIt), within 0.02%). An untrained tensor is off by 100%.
  const double change_tol = sgd ? 5e-3 : 2e-2;
  double max_change = 0.0;
  ASSERT_EQ(final_tensors.size(), want_norms.size());
  for (auto it = want_norms.begin(); it != want_norms.end(); ++it) {
    const std::string& name = it.key();
    ASSERT_TRUE(final_tensors.count(name) && initial_tensors.count(name)) << name;
    std::vector<double> got = final_tensors.at(name), start = initial_tensors.at(name);
    const double d = RelDiff(L2(got), it.value().get<double>());
    EXPECT_LE(d, norm_tol) << name << ": " << L2(got) << " want " << it.value();
    max_norm = std::max(max_norm, d);
    double want_final = it.value().get<double>();
    if (!sgd && absl::EndsWith(name, ".attn.c_attn.bias")) {
      want_final = CheckKeyBiasAndRemoveIt(run, name, got, start, want_final);
    }
    const double want_change = want_final - L2(start);
    const double got_change = L2(got) - L2(start);
    ASSERT_NE(want_change, 0.0) << name << ": the fixture did not train it";
    const double c = RelDiff(got_change, want_change);
    EXPECT_LE(c, change_tol) << name << ": norm changed by " << got_change << ", want "
                             << want_change;
    max_change = std::max(max_change, c);
  }
  std::printf("max deviation of a tensor's norm change from the initial weights (rel): %.3g\n",
              max_change);
  std::printf(
      "max deviation: loss %.3g  grad_norm(rel) %.3g  lr(rel) %.3g  eval_loss %.3g  "
      "param_l2(rel) %.3g\n",
      max_loss, max_grad, max_lr, max_eval, max_norm);
}

INSTANTIATE_TEST_SUITE_P(Schedules, ScheduleRun, ::testing::ValuesIn(AllCases()), Name);

}  // namespace
}  // namespace latchkey::testing
