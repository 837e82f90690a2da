// Runs are deterministic: the same job run twice saves byte-identical weights and writes the
// same per-step losses and gradient norms, for the layouts and precisions that take different
// paths through the training core (DP x TP with ZeRO-1 and clipping, dropout, bf16).
#include <gtest/gtest.h>

#include <ostream>

#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"

namespace latchkey::testing {
namespace {

struct Case {
  const char* name;
  bool bf16;
  double dropout;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Determinism : public ::testing::TestWithParam<Case> {};

TEST_P(Determinism, TwoIdenticalRunsSaveByteIdenticalWeights) {
  const Case c = GetParam();
  SpecParams p;  // synthetic data, AdamW, ZeRO-1
  p.tp = 2;
  p.world_size = 4;  // DP 2 x TP 2
  p.clip = 0.5;
  p.steps = 4;
  p.seed = 7;
  if (c.dropout > 0) {
    p.model["resid_pdrop"] = c.dropout;
    p.model["attn_pdrop"] = c.dropout;
    p.model["embd_pdrop"] = c.dropout;
  }
  nlohmann::json spec = SpecObject(p);
  if (c.bf16) spec["bf16"] = {{"enabled", true}};
  const WorkerRun a = RunWorkers(spec, 4, {"--save", "{dir}/final"});
  ASSERT_TRUE(a.ok()) << a.Describe();
  const WorkerRun b = RunWorkers(spec, 4, {"--save", "{dir}/final"});
  ASSERT_TRUE(b.ok()) << b.Describe();
  const std::string wa = ReadText(a.dir + "/final/model.safetensors");
  const std::string wb = ReadText(b.dir + "/final/model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "saved weights differ between two identical runs (" << a.dir << ", "
                        << b.dir << ")";
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(a.steps[r].size(), 4u);
    ASSERT_EQ(b.steps[r].size(), 4u);
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_EQ(a.steps[r][s]["loss"], b.steps[r][s]["loss"]) << "rank " << r << " step " << s;
      EXPECT_EQ(a.steps[r][s]["grad_norm"], b.steps[r][s]["grad_norm"])
          << "rank " << r << " step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Determinism,
                         ::testing::Values(Case{"fp32", false, 0.0}, Case{"dropout", false, 0.1},
                                           Case{"bf16", true, 0.0}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace latchkey::testing
