#include "common/spec_limits.h"

#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/hf_checkpoint.h"
#include "worker/checkpoint/safetensors.h"

namespace latchkey {
namespace {

using ::testing::HasSubstr;
std::string Msg(const absl::Status& st) { return std::string(st.message()); }
using ::testing::StartsWith;

ModelConfig Tiny(bool mqa) {
  ModelConfig m;  // the fixture's shape: 2 layers, 64 wide, 8 heads, vocab 256, 64 positions
  m.multi_query = mqa;
  return m;
}

// Hand counts, module by module as PyTorch's named_parameters() lists them.
TEST(ModelParameterCountTest, MatchesManualCounts) {
  // E 64, D 8, I 256: wte 16384, wpe 4096, ln_f 128; per layer ln_1 128, c_attn (64+16)*64+80
  // = 5200 (MQA) or 3*64*64+192 = 12480 (MHA), attn.c_proj 4160, ln_2 128, c_fc 16640,
  // mlp.c_proj 16448.
  EXPECT_EQ(ModelParameterCount(Tiny(true)), 16384 + 4096 + 128 + 2 * 42704);
  EXPECT_EQ(ModelParameterCount(Tiny(false)), 16384 + 4096 + 128 + 2 * 49984);
  ModelConfig m = Tiny(true);
  m.n_inner = 100;  // explicit n_inner replaces 4 * n_embd in both MLP projections
  const int64_t per_layer = 128 + 5200 + 4160 + 128 + (100 * 64 + 100) + (64 * 100 + 64);
  EXPECT_EQ(ModelParameterCount(m), 16384 + 4096 + 128 + 2 * per_layer);
}

// The exact count equals the number of elements in the fixture checkpoints (lm_head is tied).
TEST(ModelParameterCountTest, MatchesFixtureCheckpoints) {
  for (const char* variant : {"mqa", "mha"}) {
    const std::string dir =
        std::string(LATCHKEY_SOURCE_DIR) + "/testdata/gptbigcode-tiny/" + variant;
    absl::StatusOr<HfCheckpoint> ckpt = ReadHfCheckpoint(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    int64_t elements = 0;
    for (const StTensor& t : ckpt->weights.tensors) {
      if (t.name.find("lm_head") != std::string::npos) continue;
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      elements += n;
    }
    EXPECT_EQ(ModelParameterCount(ckpt->config), elements) << variant;
  }
}

TEST(ModelParameterCountTest, SaturatesInsteadOfOverflowing) {
  ModelConfig m;
  m.n_layer = INT_MAX;
  m.n_embd = INT_MAX;
  m.n_head = 1;
  m.n_inner = INT_MAX;
  m.vocab_size = INT_MAX;
  m.n_positions = INT_MAX;
  EXPECT_EQ(ModelParameterCount(m), INT64_MAX);
  m.multi_query = false;
  EXPECT_EQ(ModelParameterCount(m), INT64_MAX);
  ModelConfig zero;
  zero.n_head = 0;  // never divides by zero
  EXPECT_GT(ModelParameterCount(zero), 0);
}

TEST(CheckSpecLimitsTest, RefusesAWorldOverTheLimitNamingIt) {
  JobSpec spec;
  spec.world_size = 65536;
  EXPECT_TRUE(CheckSpecLimits(spec, SpecLimits{}).ok());  // equal to the limit is allowed
  spec.world_size = 65537;
  EXPECT_EQ(Msg(CheckSpecLimits(spec, SpecLimits{})),
            "latchkey.world_size: 65537 exceeds the coordinator's limit of 65536");
  SpecLimits small;
  small.max_world_size = 8;
  spec.world_size = 16;
  EXPECT_EQ(Msg(CheckSpecLimits(spec, small)),
            "latchkey.world_size: 16 exceeds the coordinator's limit of 8");
}

TEST(CheckSpecLimitsTest, RefusesAModelOverTheBudgetNamingTheSize) {
  JobSpec spec;
  spec.model.n_layer = 100000;
  spec.model.n_embd = 65536;
  spec.model.n_head = 64;
  const int64_t n = ModelParameterCount(spec.model);
  ASSERT_GT(n, int64_t{20000000000});
  absl::Status st = CheckSpecLimits(spec, SpecLimits{});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  char expected[160];
  std::snprintf(expected, sizeof expected,
                "model: %g parameters exceed the coordinator's limit of 2e+10 "
                "(--max-model-parameters)",
                static_cast<double>(n));
  EXPECT_EQ(st.message(), expected);

  SpecLimits small;
  small.max_model_parameters = ModelParameterCount(Tiny(true));
  EXPECT_TRUE(CheckSpecLimits(JobSpec{}, small).ok());  // equal to the limit is allowed
  small.max_model_parameters -= 1;
  EXPECT_THAT(Msg(CheckSpecLimits(JobSpec{}, small)), StartsWith("model: 106016 parameters"));
}

class DataRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::canonical(dir_.path()).string() + "/root";
    outside_ = std::filesystem::canonical(dir_.path()).string() + "/outside";
    std::filesystem::create_directories(root_ + "/sub");
    std::filesystem::create_directories(outside_);
    std::ofstream(root_ + "/sub/tokens.bin") << "xx";
    std::ofstream(outside_ + "/secret.bin") << "yy";
    std::filesystem::create_symlink(outside_ + "/secret.bin", root_ + "/link.bin");
    std::filesystem::create_directory_symlink(outside_, root_ + "/linkdir");
    std::filesystem::create_directory_symlink(root_ + "/sub", outside_ + "/into_root");
    std::filesystem::create_directories(root_ + "2");
  }
  testing::ScopedTempDir dir_{"spec_limits"};
  std::string root_, outside_;
};

TEST_F(DataRootsTest, AcceptsPathsInsideARoot) {
  const std::vector<std::string> roots = {root_};
  for (const std::string& p :
       {root_ + "/sub/tokens.bin", root_ + "/sub/../sub/tokens.bin", root_ + "/new/ckpt", root_,
        root_ + "/", outside_ + "/into_root/tokens.bin", root_ + "/a/../b"}) {
    EXPECT_TRUE(CheckPathUnderRoots("f", p, roots).ok()) << p;
  }
  EXPECT_TRUE(CheckPathUnderRoots("f", "/anything", {}).ok());  // no roots: unconfined
  EXPECT_TRUE(CheckPathUnderRoots("f", outside_ + "/secret.bin", {root_, outside_}).ok());
}

TEST_F(DataRootsTest, RefusesEscapesNamingTheField) {
  const std::vector<std::string> roots = {root_ + "/"};
  for (const std::string& p :
       {outside_ + "/secret.bin", root_ + "/../outside/secret.bin", root_ + "/link.bin",
        root_ + "/linkdir/secret.bin", root_ + "/linkdir/not_yet/ckpt", root_ + "2/x",
        root_ + "/sub/../../outside", std::string("/etc/passwd"), std::string("/")}) {
    absl::Status st = CheckPathUnderRoots("latchkey.init_from", p, roots);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << p;
    EXPECT_THAT(Msg(st), StartsWith("latchkey.init_from: " + p)) << p;
    EXPECT_THAT(Msg(st), HasSubstr("is outside the data roots (" + root_ + "/)")) << p;
  }
  EXPECT_THAT(Msg(CheckPathUnderRoots("f", root_ + "/link.bin", roots)),
              HasSubstr("(resolves to " + outside_ + "/secret.bin)"));
}

TEST_F(DataRootsTest, CheckSpecLimitsNamesEachPathField) {
  SpecLimits limits;
  limits.data_roots = {root_};
  JobSpec ok;
  ok.data.tokens_file = root_ + "/sub/tokens.bin";
  ok.eval.tokens_file = root_ + "/sub/tokens.bin";
  ok.init_from = root_ + "/sub";
  ok.checkpoint.dir = root_ + "/ckpt";
  EXPECT_TRUE(CheckSpecLimits(ok, limits).ok());
  const std::string bad = root_ + "/link.bin";
  struct Case {
    std::string field;
    std::string* path;
  };
  for (int i = 0; i < 4; ++i) {
    JobSpec s = ok;
    const Case cases[] = {{"latchkey.data.tokens_file", &s.data.tokens_file},
                          {"latchkey.eval.tokens_file", &s.eval.tokens_file},
                          {"latchkey.init_from", &s.init_from},
                          {"latchkey.checkpoint.dir", &s.checkpoint.dir}};
    *cases[i].path = bad;
    absl::Status st = CheckSpecLimits(s, limits);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(st), StartsWith(cases[i].field + ": " + bad));
  }
}

TEST_F(DataRootsTest, CheckSpecLimitsNamesEachMegatronPathField) {
  SpecLimits limits;
  limits.data_roots = {root_};
  JobSpec ok;
  ok.data.format = DataFormat::kMegatron;
  ok.data.blend = {{0.5, root_ + "/sub/a"}, {0.5, root_ + "/sub/b"}};
  ok.data.cache_dir = root_ + "/cache";
  EXPECT_TRUE(CheckSpecLimits(ok, limits).ok());
  const std::string bad = root_ + "/link.bin";
  for (int i = 0; i < 3; ++i) {
    JobSpec s = ok;
    const std::pair<std::string, std::string*> cases[] = {
        {"latchkey.data.blend[1].path_prefix", &s.data.blend[1].path_prefix},
        {"latchkey.data.cache_dir", &s.data.cache_dir},
        {"latchkey.data.path_prefix", &s.data.path_prefix}};
    if (i == 2) s.data.blend.clear();
    *cases[i].second = bad;
    absl::Status st = CheckSpecLimits(s, limits);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(st), StartsWith(cases[i].first + ": " + bad));
  }
}

TEST_F(DataRootsTest, WorkerRootsComeFromTheEnvironment) {
  ::unsetenv(kDataRootsEnv);
  EXPECT_TRUE(DataRootsFromEnv().empty());
  EXPECT_TRUE(CheckPathUnderEnvRoots("f", "/etc/passwd").ok());
  ::setenv(kDataRootsEnv, (":" + root_ + "::" + outside_ + "/into_root").c_str(), 1);
  EXPECT_EQ(DataRootsFromEnv(), (std::vector<std::string>{root_, outside_ + "/into_root"}));
  EXPECT_TRUE(CheckPathUnderEnvRoots("f", root_ + "/sub/tokens.bin").ok());
  absl::Status st = CheckPathUnderEnvRoots("latchkey.data.tokens_file", root_ + "/link.bin");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), StartsWith("latchkey.data.tokens_file: "));
  EXPECT_THAT(Msg(st), HasSubstr("LATCHKEY_DATA_ROOTS"));
  ::unsetenv(kDataRootsEnv);
}

}  // namespace
}  // namespace latchkey
