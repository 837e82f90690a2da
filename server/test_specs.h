// Job specs and a temp folder for the coordinator's tests and benchmarks (test-only;
// header-only).
#ifndef LATCHKEY_SERVER_TEST_SPECS_H_
#define LATCHKEY_SERVER_TEST_SPECS_H_

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace latchkey::testing {

// A fresh folder under /tmp, removed with everything in it when this goes out of scope.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    char tmpl[] = "/tmp/latchkey_server_test_XXXXXX";
    const char* dir = mkdtemp(tmpl);
    path_ = dir ? dir : "/tmp";
  }
  ~ScopedTempDir() {
    std::error_code ec;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct SpecParams {
  int world_size = 2;
  int tp = 2;
  int steps = 10;
  int gas = 4;
  int zero_stage = 1;
  bool multi_query = true;
  std::string kv_reduce = "auto";
  std::string
      extra_latchkey;  // appended inside "latchkey": {...}, e.g. ", \"window_schedule\": [2]"
  bool managed = true;
};

// A small valid GPTBigCode job (synthetic data: no files needed).
inline std::string SpecJson(const SpecParams& p = {}) {
  return absl::StrCat(
      R"({"model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,)",
      R"( "vocab_size": 256, "n_positions": 64, "multi_query": )", p.multi_query ? "true" : "false",
      R"(},)", R"( "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )", p.gas,
      ",", R"( "zero_optimization": {"stage": )", p.zero_stage, "},",
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},)",
      R"( "tensor_parallel": {"autotp_size": )", p.tp, "},",
      R"( "managed_gradient_accumulation": )", p.managed ? "true" : "false", ",",
      R"( "latchkey": {"seq_len": 32, "steps": )", p.steps, R"(, "world_size": )", p.world_size,
      R"(, "kv_reduce": ")", p.kv_reduce, R"(", "data": {"synthetic": {"seed": 1}})",
      p.extra_latchkey, "}}");
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_SERVER_TEST_SPECS_H_
