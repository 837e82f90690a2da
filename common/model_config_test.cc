#include "common/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace latchkey {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;

ModelConfig Odd() {
  ModelConfig c;
  c.n_layer = 3;
  c.n_inner = 128;
  c.multi_query = false;
  c.resid_pdrop = 0.25;
  c.layer_norm_epsilon = 1e-6;
  c.scale_attn_weights = false;
  return c;
}

TEST(ModelConfigTest, EachFormatReadsBackWhatItWrites) {
  for (ModelJsonFormat f :
       {ModelJsonFormat::kJobSpec, ModelJsonFormat::kHfConfig, ModelJsonFormat::kManifest}) {
    for (const ModelConfig& c : {ModelConfig{}, Odd()}) {
      const nlohmann::json j = nlohmann::json::parse(ModelConfigToJson(c, f).dump());
      absl::StatusOr<ModelConfig> back = ModelConfigFromJson(j, f, "config.json");
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_TRUE(*back == c);
    }
  }
}

TEST(ModelConfigTest, NInnerZeroIsNullExceptInTheManifest) {
  const ModelConfig c;
  EXPECT_TRUE(ModelConfigToJson(c, ModelJsonFormat::kJobSpec)["n_inner"].is_null());
  EXPECT_TRUE(ModelConfigToJson(c, ModelJsonFormat::kHfConfig)["n_inner"].is_null());
  EXPECT_EQ(ModelConfigToJson(c, ModelJsonFormat::kManifest)["n_inner"], 0);
}

TEST(ModelConfigTest, DefaultsArePerFormat) {
  absl::StatusOr<ModelConfig> hf =
      ModelConfigFromJson(nlohmann::json::object(), ModelJsonFormat::kHfConfig, "c.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->resid_pdrop, 0.1);
  EXPECT_EQ(hf->n_layer, 12);
  const nlohmann::json spec_model = {
      {"model_type", "gpt_bigcode"}, {"n_layer", 2},     {"n_embd", 64}, {"n_head", 8},
      {"vocab_size", 256},           {"n_positions", 64}};
  absl::StatusOr<ModelConfig> spec = ModelConfigFromJson(spec_model, ModelJsonFormat::kJobSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resid_pdrop, 0.0);
  absl::StatusOr<ModelConfig> manifest =
      ModelConfigFromJson(spec_model, ModelJsonFormat::kManifest);
  EXPECT_THAT(manifest.status().message(), HasSubstr("n_inner"));
}

TEST(ModelConfigTest, DiffNamesFieldsInOrder) {
  ModelConfig a;
  ModelConfig b = a;
  EXPECT_TRUE(DiffModelConfigs(a, b).empty());
  b.n_head = 4;
  b.attn_pdrop = 0.1;
  EXPECT_THAT(DiffModelConfigs(a, b),
              ElementsAre(Field(&ModelFieldDiff::key, ::testing::StrEq("n_head")),
                          Field(&ModelFieldDiff::key, ::testing::StrEq("attn_pdrop"))));
  const std::vector<ModelFieldDiff> shape = DiffModelConfigs(a, b, ModelFields::kShape);
  ASSERT_EQ(shape.size(), 1u);
  EXPECT_EQ(shape[0].a, "8");
  EXPECT_EQ(shape[0].b, "4");
  EXPECT_FALSE(a == b);
}

TEST(ModelConfigTest, ShapeComparesTheInnerWidth) {
  ModelConfig a;
  ModelConfig b = a;
  b.n_inner = 4 * a.n_embd;
  EXPECT_TRUE(DiffModelConfigs(a, b, ModelFields::kShape).empty());
  EXPECT_FALSE(a == b);
  b.multi_query = false;
  const std::vector<ModelFieldDiff> d = DiffModelConfigs(a, b, ModelFields::kShape);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_STREQ(d[0].key, "multi_query");
  EXPECT_EQ(d[0].a, "true");
  EXPECT_EQ(d[0].b, "false");
}

}  // namespace
}  // namespace latchkey
