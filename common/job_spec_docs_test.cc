// Every key the spec parser reads is documented in docs/job-spec.md. The keys are those of the
// canonical JSON (JobSpecToJson writes every field explicitly) of specs that between them turn
// every optional section on: tokens data with eval, checkpoints, TensorBoard, elastic recovery and
// the window keys; Megatron data with a blend and an eval split. A key counts as documented when
// it appears as a word inside a `code span` of the page (a table's `key`, or `{dir, keep}`).
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using json = nlohmann::json;

void CollectKeys(const json& j, std::set<std::string>* keys) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      keys->insert(key);
      CollectKeys(value, keys);
    }
  } else if (j.is_array()) {
    for (const auto& v : j) CollectKeys(v, keys);
  }
}

// The words (letters, digits, `_`) inside the page's inline code spans, each span within one
// line; the fence lines of code blocks are left out, so their backticks pair with nothing.
std::set<std::string> CodeSpanWords(const std::string& markdown) {
  std::set<std::string> words;
  std::istringstream lines(markdown);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("```", 0) == 0) continue;
    bool in_span = false;
    std::string word;
    for (const char ch : line + " ") {
      const bool word_char = std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
      if (in_span && word_char) {
        word += ch;
        continue;
      }
      if (!word.empty() && !std::isdigit(static_cast<unsigned char>(word[0]))) words.insert(word);
      word.clear();
      if (ch == '`') in_span = !in_span;
    }
  }
  return words;
}

json Common() {
  return json::parse(R"json(
{"model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
           "vocab_size": 256, "n_positions": 64, "multi_query": true},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}, "bf16": {"enabled": false},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20}},
 "tensor_parallel": {"autotp_size": 2, "sequence_parallel": true},
 "latchkey": {"seq_len": 64, "steps": 20, "world_size": 4, "no_sync": [true, false],
              "overlap_dp_reduction": true, "elastic": {"min_dp": 1},
              "rejoin_timeout_seconds": 30, "hang_timeout_seconds": 20, "max_restarts": 3,
              "activation_checkpointing": {"mode": "full", "every_layers": 1},
              "checkpoint": {"dir": "ckpt", "every_steps": 5, "keep": 2, "async": true},
              "tensorboard": {"dir": "tb"}, "init_from": "hf"}})json");
}

TEST(JobSpecDocs, EveryKeyTheParserReadsIsDocumented) {
  json tokens = Common();
  tokens["latchkey"]["data"] = {{"tokens_file", "data.bin"}, {"dtype", "uint16"}};
  tokens["latchkey"]["eval"] = {{"tokens_file", "eval.bin"}, {"every_steps", 5}, {"samples", 4}};
  json synthetic = Common();
  synthetic["latchkey"]["data"] = {{"synthetic", {{"seed", 3}}}};
  synthetic["managed_gradient_accumulation"] = false;
  synthetic["latchkey"].erase("no_sync");
  synthetic["latchkey"].erase("elastic");
  synthetic["latchkey"]["window_schedule"] = {2, 1};
  json megatron = Common();
  megatron["latchkey"]["data"] = {
      {"format", "megatron"},
      {"blend", {{{"weight", 1.0}, {"path_prefix", "a"}}, {{"weight", 2.0}, {"path_prefix", "b"}}}},
      {"split", "90,10,0"},
      {"cache_dir", "cache"},
      {"seed", 5}};
  megatron["latchkey"]["eval"] = {{"split", "validation"}, {"every_steps", 5}, {"samples", 4}};

  std::set<std::string> keys;
  for (const json& j : {tokens, synthetic, megatron}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(j.dump(), "/jobs/a");
    ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << j.dump(2);
    CollectKeys(json::parse(JobSpecToJson(*spec)), &keys);
    CollectKeys(j, &keys);  // keys the canonical form writes differently
  }
  ASSERT_GT(keys.size(), 50u);

  std::ifstream in(std::string(LATCHKEY_SOURCE_DIR) + "/docs/job-spec.md");
  std::stringstream page;
  page << in.rdbuf();
  ASSERT_FALSE(page.str().empty()) << "docs/job-spec.md not found";
  const std::set<std::string> documented = CodeSpanWords(page.str());
  for (const std::string& key : keys) {
    EXPECT_TRUE(documented.count(key)) << "key `" << key << "` is not in docs/job-spec.md";
  }
}

}  // namespace
}  // namespace latchkey
