#include "tests/support/specs.h"

#include <cstdlib>
#include <fstream>

#include "tests/support/launch.h"

namespace latchkey::testing {

nlohmann::json ModelJson(const ModelShape& m) {
  return {{"model_type", "gpt_bigcode"}, {"n_layer", m.n_layer},
          {"n_embd", m.n_embd},          {"n_head", m.n_head},
          {"vocab_size", m.vocab_size},  {"n_positions", m.n_positions},
          {"multi_query", m.multi_query}};
}

nlohmann::json FixtureModel(const std::string& variant) {
  std::ifstream in(FixtureDir() + "/" + variant + "/config.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  return {{"model_type", "gpt_bigcode"},    {"n_layer", c["n_layer"]},
          {"n_embd", c["n_embd"]},          {"n_head", c["n_head"]},
          {"vocab_size", c["vocab_size"]},  {"n_positions", c["n_positions"]},
          {"multi_query", c["multi_query"]}};
}

nlohmann::json SyntheticData(int seed) { return {{"synthetic", {{"seed", seed}}}}; }

nlohmann::json TokensData(const std::string& tokens_file, const std::string& dtype) {
  return {{"tokens_file", tokens_file}, {"dtype", dtype}};
}

nlohmann::json ExampleSpecJson() {
  return {{"model", ModelJson()},
          {"tensor_parallel", {{"autotp_size", 2}}},
          {"latchkey",
           {{"seq_len", 64},
            {"steps", 20},
            {"world_size", 2},
            {"data", {{"tokens_file", "data.bin"}}}}}};
}

nlohmann::json SpecObject(const SpecParams& p) {
  nlohmann::json j = {
      {"model", p.model},
      {"train_micro_batch_size_per_gpu", p.micro_batch},
      {"gradient_accumulation_steps", p.gas},
      {"optimizer", {{"type", p.optimizer}, {"params", {{"lr", p.lr}}}}},
      {"tensor_parallel", {{"autotp_size", p.tp}}},
  };
  for (auto it = p.optimizer_params.begin(); it != p.optimizer_params.end(); ++it) {
    j["optimizer"]["params"][it.key()] = it.value();
  }
  if (p.clip) j["gradient_clipping"] = *p.clip;
  if (p.zero_stage) j["zero_optimization"] = {{"stage", *p.zero_stage}};
  if (p.managed) j["managed_gradient_accumulation"] = *p.managed;
  nlohmann::json& l = j["latchkey"];
  l = {{"seq_len", p.seq_len},
       {"steps", p.steps},
       {"world_size", p.world_size},
       {"kv_reduce", p.kv_reduce},
       {"data", p.data}};
  if (p.seed) l["seed"] = *p.seed;
  if (!p.init_from.empty()) l["init_from"] = p.init_from;
  for (auto it = p.extra_latchkey.begin(); it != p.extra_latchkey.end(); ++it) {
    l[it.key()] = it.value();
  }
  for (auto it = p.extra_top.begin(); it != p.extra_top.end(); ++it) {
    j[it.key()] = it.value();
  }
  return j;
}

SpecParams SingleRankParams() {
  SpecParams p;
  p.world_size = 1;
  p.tp = 1;
  return p;
}

std::string SpecJson(const SpecParams& p) { return SpecObject(p).dump(); }

RunShape Dp2Tp2Shape() {
  RunShape r;
  r.mb = 1;
  r.dp = 2;
  r.tp = 2;
  return r;
}

std::string TestBackend() {
  const char* env = std::getenv("LATCHKEY_TEST_BACKEND");
  return env != nullptr ? env : "";
}

SpecParams FixtureParams(const RunShape& r) {
  SpecParams p;
  p.model = FixtureModel(r.variant);
  p.micro_batch = r.mb;
  p.gas = r.gas;
  p.clip = r.clip;
  p.zero_stage = r.zero;
  p.optimizer = r.optimizer;
  p.lr = r.lr;
  p.tp = r.tp;
  p.managed = std::nullopt;
  p.seq_len = 32;
  p.steps = r.steps;
  p.seed = 1;
  p.world_size = r.dp * r.tp;
  p.kv_reduce = r.kv_reduce;
  p.init_from = FixtureDir() + "/" + r.variant;
  p.data = TokensData(FixtureDir() + "/tokens.bin");
  if (r.weight_decay) p.optimizer_params["weight_decay"] = *r.weight_decay;
  if (!r.scheduler.is_null()) p.extra_top["scheduler"] = r.scheduler;
  if (!r.eval.is_null()) p.extra_latchkey["eval"] = r.eval;
  if (const std::string backend = TestBackend(); !backend.empty()) {
    p.extra_latchkey["backend"] = backend;
  }
  return p;
}

nlohmann::json FixtureSpec(const RunShape& r) { return SpecObject(FixtureParams(r)); }

}  // namespace latchkey::testing
