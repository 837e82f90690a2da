// The small GPTBigCode models of the tests and benches as ModelConfig, written once: the tiny
// model of testdata/gptbigcode-tiny (and of specs.h's ModelShape defaults) in its MQA and MHA
// variants, and the same family at other sizes. Header-only and torch-free, so benches include
// it without linking the test-support library.
//
// Thread-safety: pure functions.
#ifndef LATCHKEY_TESTS_SUPPORT_TINY_MODEL_H_
#define LATCHKEY_TESTS_SUPPORT_TINY_MODEL_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "common/model_config.h"

namespace latchkey::testing {

// vocab_size 256, n_inner null (4 * n_embd), no dropout, HF's layer_norm_epsilon and
// initializer_range, scaled attention: what a spec with only these sizes parses to.
inline ModelConfig SmallModel(int n_layer, int n_embd, int n_head, int n_positions,
                              bool multi_query = true) {
  return ModelConfig{n_layer,     n_embd,     n_head, /*n_inner=*/0, /*vocab_size=*/256,
                     n_positions, multi_query};
}

// The fixture's model: 2 layers, n_embd 64, 8 heads (head_dim 8, inner 256), 64 positions;
// multi_query false is the "mha" variant.
inline ModelConfig TinyModel(bool multi_query = true) {
  return SmallModel(2, 64, 8, 64, multi_query);
}
inline ModelConfig TinyMhaModel() { return TinyModel(/*multi_query=*/false); }

// "" when every field of `actual` equals `want`'s; else each differing field as
// "<key> <actual> (want <want>)", joined by "; ", for a test's failure message:
//   EXPECT_EQ(ModelDiff(parsed, TinyModel()), "");
inline std::string ModelDiff(const ModelConfig& actual, const ModelConfig& want) {
  std::string out;
  for (const ModelFieldDiff& d : DiffModelConfigs(actual, want)) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", d.key, " ", d.a, " (want ", d.b, ")");
  }
  return out;
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_TINY_MODEL_H_
