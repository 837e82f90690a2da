// Job specs for tests and benchmarks, built one way. SpecParams holds every knob a test turns;
// its defaults are the small synthetic job the coordinator's tests submit. FixtureSpec (the
// fixture's tiny GPTBigCode trained on the fixture's tokens) is a named setting of the same knobs.
//
//   SpecParams p;                 // synthetic data, TP 2 x DP 1, AdamW
//   p.steps = 3;
//   p.extra_latchkey = {{"no_sync", {false, true}}};
//   std::string text = SpecJson(p);
//
//   RunShape s;                   // the fixture run: SGD, TP 1 x DP 1, 6 steps
//   s.tp = 2;
//   nlohmann::json spec = FixtureSpec(s);
#ifndef LATCHKEY_TESTS_SUPPORT_SPECS_H_
#define LATCHKEY_TESTS_SUPPORT_SPECS_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace latchkey::testing {

// The "model" block of a GPTBigCode job; the defaults are the fixture's model (tiny_model.h's
// TinyModel() as a ModelConfig).
struct ModelShape {
  int n_layer = 2;
  int n_embd = 64;
  int n_head = 8;
  int vocab_size = 256;
  int n_positions = 64;
  bool multi_query = true;
};
nlohmann::json ModelJson(const ModelShape& m = {});
// The fixture variant's ("mqa" or "mha") model block, read from its config.json.
nlohmann::json FixtureModel(const std::string& variant);

// The "latchkey.data" block: synthetic tokens, or a token file.
nlohmann::json SyntheticData(int seed);
nlohmann::json TokensData(const std::string& tokens_file, const std::string& dtype = "uint16");

// Optional knobs left unset are left out of the spec (the spec's own defaults apply).
struct SpecParams {
  nlohmann::json model = ModelJson();
  int micro_batch = 2;                 // train_micro_batch_size_per_gpu
  int gas = 4;                         // gradient_accumulation_steps
  std::optional<double> clip;          // gradient_clipping
  std::optional<int> zero_stage = 1;   // zero_optimization.stage
  std::string optimizer = "AdamW";     // optimizer.type
  double lr = 0.001;                   // optimizer.params.lr
  int tp = 2;                          // tensor_parallel.autotp_size
  std::optional<bool> managed = true;  // managed_gradient_accumulation
  int seq_len = 32;                    // latchkey.*
  int steps = 10;
  std::optional<int> seed;
  int world_size = 2;
  std::string kv_reduce = "auto";
  std::string init_from;  // empty: left out
  nlohmann::json data = SyntheticData(1);
  // Merged into "latchkey" last, e.g. {{"window_schedule", {1, 3}}}.
  nlohmann::json extra_latchkey = nlohmann::json::object();
  // Merged into "optimizer.params" after lr, e.g. {{"weight_decay", 0.1}}.
  nlohmann::json optimizer_params = nlohmann::json::object();
  // Merged into the top level last, e.g. {{"scheduler", {{"type", "WarmupLR"}}}}.
  nlohmann::json extra_top = nlohmann::json::object();
};

// SpecParams on one rank (world_size 1, TP 1), the rest as SpecParams' defaults.
SpecParams SingleRankParams();

// The small spec the job-spec unit tests start from: the fixture-size model (ModelJson()), TP 2
// on world size 2, 20 steps of 64 tokens from the token file data.bin, and nothing else (every
// other key at the spec's default).
nlohmann::json ExampleSpecJson();

nlohmann::json SpecObject(const SpecParams& p = {});
std::string SpecJson(const SpecParams& p = {});

// A run of the fixture model: SGD from the fixture checkpoint on the fixture tokens (seq_len 32,
// seed 1), on dp x tp ranks.
struct RunShape {
  std::string variant = "mqa";
  int mb = 2;
  int gas = 1;
  int dp = 1;
  int tp = 1;
  double lr = 0.5;
  double clip = 0.0;
  int steps = 6;
  int zero = 0;
  std::string optimizer = "SGD";
  std::string kv_reduce = "per_micro_batch";
  std::optional<double> weight_decay;  // optimizer.params.weight_decay; unset: left out
  nlohmann::json scheduler;            // the top-level "scheduler" block; null: left out
  nlohmann::json eval;                 // the "latchkey.eval" block; null: left out
};
// DP 2 x TP 2 (4 ranks) with one-sample micro-batches, the rest as RunShape's defaults: the
// smallest layout with both kinds of parallelism, where the window and evaluation tests run.
RunShape Dp2Tp2Shape();
// The fixture specs' latchkey.backend: $LATCHKEY_TEST_BACKEND when set (the ctest entries that
// rerun training suites on another transport, e.g. gloo), else the spec's default (auto).
std::string TestBackend();
SpecParams FixtureParams(const RunShape& r);
nlohmann::json FixtureSpec(const RunShape& r);

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_SPECS_H_
