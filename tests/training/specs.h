// Job specs for the multi-process training tests: the fixture's tiny GPTBigCode.
#ifndef LATCHKEY_TESTS_TRAINING_SPECS_H_
#define LATCHKEY_TESTS_TRAINING_SPECS_H_

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/launch.h"

namespace latchkey::testing {

// The fixture variant's model block (from its config.json).
inline nlohmann::json FixtureModel(const std::string& variant) {
  std::ifstream in(FixtureDir() + "/" + variant + "/config.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  return {{"model_type", "gpt_bigcode"}, {"n_layer", c["n_layer"]},
          {"n_embd", c["n_embd"]},       {"n_head", c["n_head"]},
          {"vocab_size", c["vocab_size"]}, {"n_positions", c["n_positions"]},
          {"multi_query", c["multi_query"]}};
}

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
};

// SGD from the fixture checkpoint on the fixture tokens (seq_len 32).
inline nlohmann::json FixtureSpec(const RunShape& r) {
  nlohmann::json opt_params = {{"lr", r.lr}};
  return {{"model", FixtureModel(r.variant)},
          {"train_micro_batch_size_per_gpu", r.mb},
          {"gradient_accumulation_steps", r.gas},
          {"gradient_clipping", r.clip},
          {"zero_optimization", {{"stage", r.zero}}},
          {"optimizer", {{"type", r.optimizer}, {"params", opt_params}}},
          {"tensor_parallel", {{"autotp_size", r.tp}}},
          {"latchkey",
           {{"seq_len", 32},
            {"steps", r.steps},
            {"seed", 1},
            {"world_size", r.dp * r.tp},
            {"kv_reduce", r.kv_reduce},
            {"init_from", FixtureDir() + "/" + r.variant},
            {"data", {{"tokens_file", FixtureDir() + "/tokens.bin"}, {"dtype", "uint16"}}}}}};
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_TRAINING_SPECS_H_
