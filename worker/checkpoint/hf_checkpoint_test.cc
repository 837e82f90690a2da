#include "worker/checkpoint/hf_checkpoint.h"

#include <filesystem>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"
#include "tests/support/tiny_model.h"
#include "worker/checkpoint/files.h"
#include "worker/model/gpt_bigcode_params.h"

namespace latchkey {
namespace {

using ::testing::HasSubstr;
using testing::ModelDiff;
using testing::TinyMhaModel;
using testing::TinyModel;
namespace fs = std::filesystem;

const std::string kFixtures = std::string(LATCHKEY_SOURCE_DIR) + "/testdata/gptbigcode-tiny";

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A copy of a fixture folder that a test may modify.
std::string CopyFixture(const std::string& variant) {
  std::string dir = testing::MakeTempDir("hf-checkpoint") + "/ckpt";
  fs::create_directories(dir);
  for (const char* f : {kHfConfigFileName, kHfWeightsFileName}) {
    fs::copy_file(kFixtures + "/" + variant + "/" + f, dir + "/" + f);
    fs::permissions(dir + "/" + f, fs::perms::owner_write, fs::perm_options::add);
  }
  return dir;
}

TEST(HfCheckpointTest, ReadsFixtures) {
  for (bool mqa : {true, false}) {
    SCOPED_TRACE(mqa);
    absl::StatusOr<HfCheckpoint> ck = ReadHfCheckpoint(kFixtures + (mqa ? "/mqa" : "/mha"));
    ASSERT_TRUE(ck.ok()) << ck.status();
    const ModelConfig& c = ck->config;
    // Every field: 2 layers, n_embd 64, 8 heads, n_inner null, vocab 256, 64 positions, no
    // dropout, epsilon 1e-5.
    EXPECT_EQ(ModelDiff(c, TinyModel(mqa)), "");
    EXPECT_EQ(c.inner(), 256);
    EXPECT_TRUE(CheckConfigAgrees(TinyModel(mqa), c, "latchkey.init_from").ok());
    const StTensor* c_attn = ck->weights.Find("transformer.h.0.attn.c_attn.weight");
    ASSERT_NE(c_attn, nullptr);
    EXPECT_EQ(c_attn->shape, (std::vector<int64_t>{mqa ? 80 : 192, 64}));
    EXPECT_EQ(ck->weights.Find("transformer.h.1.mlp.c_proj.weight")->shape,
              (std::vector<int64_t>{64, 256}));
    EXPECT_EQ(ck->weights.metadata.at("format"), "pt");
  }
}

TEST(HfCheckpointTest, WriteThenReadRoundTrip) {
  absl::StatusOr<HfCheckpoint> ck = ReadHfCheckpoint(kFixtures + "/mqa");
  ASSERT_TRUE(ck.ok()) << ck.status();
  const testing::ScopedTempDir tmp_root("hf-checkpoint");
  std::string root = tmp_root.path();
  std::string dir = root + "/a/b/step-3";  // parents are created
  StFile weights = ck->weights;
  weights.metadata.clear();  // WriteHfCheckpoint adds format=pt itself
  ASSERT_TRUE(WriteHfCheckpoint(dir, ck->config, std::move(weights)).ok());

  absl::StatusOr<HfCheckpoint> back = ReadHfCheckpoint(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(CheckConfigAgrees(ck->config, back->config, "x").ok());
  EXPECT_DOUBLE_EQ(back->config.layer_norm_epsilon, ck->config.layer_norm_epsilon);
  EXPECT_EQ(back->weights.metadata, ck->weights.metadata);
  ASSERT_EQ(back->weights.tensors.size(), ck->weights.tensors.size());
  for (size_t i = 0; i < ck->weights.tensors.size(); ++i) {
    EXPECT_EQ(back->weights.tensors[i].name, ck->weights.tensors[i].name);
    EXPECT_EQ(back->weights.tensors[i].shape, ck->weights.tensors[i].shape);
    EXPECT_EQ(back->weights.tensors[i].data, ck->weights.tensors[i].data);
  }
  // Same bytes as the independent writer's file.
  EXPECT_EQ(*ReadWholeFile(dir + "/model.safetensors"),
            *ReadWholeFile(kFixtures + "/mqa/model.safetensors"));
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.insert(e.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors"}));
}

TEST(HfCheckpointTest, ConfigJsonHasExactlyTheDesignKeys) {
  ModelConfig c = TinyModel();
  nlohmann::json j = nlohmann::json::parse(SerializeHfConfig(c));
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"model_type",
                                         "architectures",
                                         "vocab_size",
                                         "n_positions",
                                         "n_embd",
                                         "n_layer",
                                         "n_head",
                                         "n_inner",
                                         "activation_function",
                                         "resid_pdrop",
                                         "embd_pdrop",
                                         "attn_pdrop",
                                         "layer_norm_epsilon",
                                         "initializer_range",
                                         "scale_attn_weights",
                                         "attention_softmax_in_fp32",
                                         "scale_attention_softmax_in_fp32",
                                         "multi_query",
                                         "tie_word_embeddings",
                                         "bos_token_id",
                                         "eos_token_id",
                                         "torch_dtype"}));
  EXPECT_EQ(j["model_type"], "gpt_bigcode");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"GPTBigCodeForCausalLM"}));
  EXPECT_EQ(j["activation_function"], "gelu_pytorch_tanh");
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_TRUE(j["n_inner"].is_null());
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["multi_query"], true);
  EXPECT_EQ(j["eos_token_id"], 255);

  c.n_inner = 128;
  c.multi_query = false;
  c.layer_norm_epsilon = 1e-6;
  c.resid_pdrop = 0.25;
  absl::StatusOr<ModelConfig> back = ParseHfConfig(SerializeHfConfig(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->n_inner, 128);
  EXPECT_FALSE(back->multi_query);
  EXPECT_DOUBLE_EQ(back->layer_norm_epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(back->resid_pdrop, 0.25);
  EXPECT_TRUE(CheckConfigAgrees(c, *back, "x").ok());
}

TEST(HfCheckpointTest, ConfigDefaultsAndAliases) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig("{}");
  ASSERT_TRUE(c.ok()) << c.status();
  // transformers' GPTBigCodeConfig(): n_layer 12, n_embd 768, n_head 12, n_inner None, vocab
  // 50257, n_positions 1024, multi_query, dropout 0.1, epsilon 1e-5, initializer range 0.02.
  const ModelConfig hf{12, 768, 12, 0, 50257, 1024, true, 0.1, 0.1, 0.1, 1e-5, 0.02, true};
  EXPECT_EQ(ModelDiff(*c, hf), "");
  c = ParseHfConfig(R"({"hidden_size":32,"num_attention_heads":4,"num_hidden_layers":1,
                        "max_position_embeddings":16,"n_inner":64})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_embd, 32);
  EXPECT_EQ(c->n_head, 4);
  EXPECT_EQ(c->n_layer, 1);
  EXPECT_EQ(c->n_positions, 16);
  EXPECT_EQ(c->n_inner, 64);
}

// config.json exactly as transformers 4.36.2's save_pretrained writes it for
// GPTBigCodeConfig(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=8, n_inner=None)
// (tests/hf/ checks the whole round trip with the real library): n_inner null and keys latchkey
// does not use (transformers_version, use_cache, architectures, bos/eos_token_id, ...).
constexpr char kTransformersConfig[] = R"({
  "activation_function": "gelu_pytorch_tanh",
  "architectures": [
    "GPTBigCodeForCausalLM"
  ],
  "attention_softmax_in_fp32": true,
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt_bigcode",
  "multi_query": true,
  "n_embd": 64,
  "n_head": 8,
  "n_inner": null,
  "n_layer": 2,
  "n_positions": 64,
  "resid_pdrop": 0.1,
  "scale_attention_softmax_in_fp32": true,
  "scale_attn_weights": true,
  "torch_dtype": "float32",
  "transformers_version": "4.36.2",
  "use_cache": true,
  "vocab_size": 256
}
)";

TEST(HfCheckpointTest, ReadsTheConfigTransformersWrites) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kTransformersConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_inner, 0);
  EXPECT_EQ(c->inner(), 256);
  EXPECT_TRUE(c->multi_query);
  EXPECT_DOUBLE_EQ(c->attn_pdrop, 0.1);
  EXPECT_DOUBLE_EQ(c->layer_norm_epsilon, 1e-5);
  EXPECT_TRUE(CheckConfigAgrees(TinyModel(), *c, "latchkey.init_from").ok());

  // The folder save_pretrained writes: its config.json, the weights, and generation_config.json
  // (ignored).
  const std::string dir = CopyFixture("mqa");
  ASSERT_TRUE(WriteFileAtomically(dir + "/" + kHfConfigFileName, kTransformersConfig).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/generation_config.json",
                                  R"({"_from_model_config": true, "bos_token_id": 50256})")
                  .ok());
  absl::StatusOr<HfCheckpoint> ckpt = ReadHfCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->config.n_inner, 0);
}

TEST(HfCheckpointTest, ConfigErrors) {
  struct Case {
    std::string json;
    std::string fragment;
  };
  const Case cases[] = {
      {"{", "c.json: not valid JSON"},
      {"[1]", "c.json: not a JSON object but array"},
      {R"({"model_type":"gpt2"})", "c.json: model_type: \"gpt2\" is not supported"},
      {R"({"activation_function":"relu"})", "activation_function: \"relu\" is not supported"},
      {R"({"n_head":"8"})", "n_head: must be an integer, got \"8\""},
      {R"({"n_head":8.5})", "n_head: must be an integer"},
      {R"({"n_layer":0})", "n_layer: must be positive, got 0"},
      {R"({"vocab_size":-3})", "vocab_size: must be positive, got -3"},
      {R"({"n_embd":4294967296})", "n_embd: must be positive, got 4294967296"},
      {R"({"n_inner":-1})", "n_inner: must be >= 0 or null, got -1"},
      {R"({"hidden_size":true})", "hidden_size: must be an integer"},
      {R"({"multi_query":1})", "multi_query: must be true or false, got 1"},
      {R"({"layer_norm_epsilon":"x"})", "layer_norm_epsilon: must be a number"},
      {R"({"attn_pdrop":-0.5})", "attn_pdrop: must be >= 0"},
      {R"({"tie_word_embeddings":false})", "tie_word_embeddings: false is not supported"},
      {R"({"n_embd":64,"n_head":6})", "n_embd 64 is not divisible by n_head 6"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    absl::StatusOr<ModelConfig> r = ParseHfConfig(c.json, "c.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(r.status()), HasSubstr(c.fragment));
  }
}

TEST(HfCheckpointTest, ConfigAgreement) {
  ModelConfig spec = TinyModel();
  ModelConfig ck = TinyModel();
  ck.n_inner = 256;  // 4 * n_embd: same as null
  EXPECT_TRUE(CheckConfigAgrees(spec, ck, "latchkey.init_from").ok());
  ck.layer_norm_epsilon = 1e-6;  // not a shape key
  EXPECT_TRUE(CheckConfigAgrees(spec, ck, "latchkey.init_from").ok());

  ck = TinyModel();
  ck.n_head = 4;
  absl::Status s = CheckConfigAgrees(spec, ck, "latchkey.init_from");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s), "latchkey.init_from: checkpoint n_head 4 disagrees with model.n_head 8");

  struct Case {
    void (*mutate)(ModelConfig*);
    std::string fragment;
  };
  const Case cases[] = {
      {[](ModelConfig* c) { c->n_layer = 3; },
       "checkpoint n_layer 3 disagrees with model.n_layer 2"},
      {[](ModelConfig* c) { c->n_embd = 128; },
       "checkpoint n_embd 128 disagrees with model.n_embd 64"},
      {[](ModelConfig* c) { c->n_inner = 128; },
       "checkpoint n_inner 128 disagrees with model.n_inner 256"},
      {[](ModelConfig* c) { c->vocab_size = 300; }, "checkpoint vocab_size 300 disagrees"},
      {[](ModelConfig* c) { c->n_positions = 128; }, "checkpoint n_positions 128 disagrees"},
      {[](ModelConfig* c) { c->multi_query = false; },
       "checkpoint multi_query false disagrees with model.multi_query true"},
  };
  for (const Case& c : cases) {
    ck = TinyModel();
    c.mutate(&ck);
    s = CheckConfigAgrees(spec, ck, "latchkey.init_from");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(s), HasSubstr("latchkey.init_from: " + c.fragment));
  }
  ck = TinyModel();
  ck.n_layer = 1;
  ck.vocab_size = 512;
  s = CheckConfigAgrees(spec, ck, "f");
  EXPECT_THAT(Msg(s), HasSubstr("n_layer 1 disagrees"));
  EXPECT_THAT(Msg(s), HasSubstr("; checkpoint vocab_size 512 disagrees"));
}

TEST(HfCheckpointTest, MissingPathsAreNamed) {
  absl::StatusOr<HfCheckpoint> ck = ReadHfCheckpoint("/nonexistent/ckpt");
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ck.status()), HasSubstr("checkpoint directory /nonexistent/ckpt"));

  ck = ReadHfCheckpoint(kFixtures + "/mqa/config.json");
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ck.status()), HasSubstr("is not a directory"));

  std::string dir = CopyFixture("mqa");
  fs::remove(dir + "/model.safetensors");
  ck = ReadHfCheckpoint(dir);
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ck.status()), HasSubstr(dir + "/model.safetensors: missing"));

  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json", "{}").ok());
  ck = ReadHfCheckpoint(dir + "/");
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(ck.status()), HasSubstr("sharded"));
  fs::remove(dir + "/model.safetensors.index.json");

  ASSERT_TRUE(WriteFileAtomically(dir + "/pytorch_model.bin", "x").ok());
  ck = ReadHfCheckpoint(dir);
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(ck.status()), HasSubstr("pytorch_model.bin"));

  fs::remove(dir + "/config.json");
  ck = ReadHfCheckpoint(dir);
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ck.status()), HasSubstr(dir + "/config.json: missing"));
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(HfCheckpointTest, CorruptFilesInFolder) {
  std::string dir = CopyFixture("mqa");
  std::string bytes = *ReadWholeFile(dir + "/model.safetensors");
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors", bytes.substr(0, 1000)).ok());
  absl::StatusOr<HfCheckpoint> ck = ReadHfCheckpoint(dir);
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Msg(ck.status()), HasSubstr(dir + "/model.safetensors"));

  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", "{\"n_head\": ").ok());
  ck = ReadHfCheckpoint(dir);
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ck.status()), HasSubstr(dir + "/config.json: not valid JSON"));
  fs::remove_all(fs::path(dir).parent_path());
}

// The parameter table names exactly the fixture's tensors (made by transformers itself), with
// their shapes, in HF module order.
TEST(HfCheckpointTest, ParameterTableMatchesTheFixtures) {
  for (bool mqa : {true, false}) {
    SCOPED_TRACE(mqa ? "mqa" : "mha");
    absl::StatusOr<HfCheckpoint> ck = ReadHfCheckpoint(kFixtures + (mqa ? "/mqa" : "/mha"));
    ASSERT_TRUE(ck.ok()) << ck.status();
    const std::vector<GptBigCodeParam> table = GptBigCodeParams(ck->config);
    ASSERT_EQ(table.size(), ck->weights.tensors.size());
    for (const GptBigCodeParam& p : table) {
      const StTensor* t = ck->weights.Find(p.name);
      ASSERT_NE(t, nullptr) << p.name;
      EXPECT_EQ(t->shape, p.shape) << p.name;
      const bool c_attn = p.name.find("attn.c_attn") != std::string::npos;
      if (c_attn) {
        EXPECT_EQ(p.split, mqa ? ShardKind::kCAttnMqa : ShardKind::kRows) << p.name;
      }
    }
    EXPECT_EQ(table.front().name, "transformer.wte.weight");
    EXPECT_EQ(table[2].name, "transformer.h.0.ln_1.weight");
    EXPECT_EQ(table.back().name, "transformer.ln_f.bias");
    EXPECT_EQ(ck->weights.Find(kTiedLmHeadName), nullptr);
  }
}

TEST(HfCheckpointTest, WeightsMustMatchConfig) {
  StFile w = *ReadSafetensorsFile(kFixtures + "/mqa/model.safetensors");
  EXPECT_TRUE(CheckWeightsMatchConfig(TinyModel(), w, "w").ok());

  ModelConfig c = TinyModel();
  c.n_layer = 3;
  absl::Status s = CheckWeightsMatchConfig(c, w, "w");
  EXPECT_THAT(Msg(s), HasSubstr("w: missing tensor 'transformer.h.2.attn.c_attn.bias' [80]"));
  s = CheckWeightsMatchConfig(TinyMhaModel(), w, "w");
  EXPECT_THAT(Msg(s), HasSubstr("tensor 'transformer.h.0.attn.c_attn.bias' has shape [80], "
                                "config.json implies [192]"));
  c = TinyModel();
  c.n_layer = 1;
  s = CheckWeightsMatchConfig(c, w, "w");
  EXPECT_THAT(Msg(s), HasSubstr("unexpected tensor 'transformer.h.1."));

  StFile with_head = w;
  with_head.tensors.push_back(
      {"lm_head.weight", StDtype::kF32, {256, 64}, w.Find("transformer.wte.weight")->data});
  EXPECT_TRUE(CheckWeightsMatchConfig(TinyModel(), with_head, "w").ok());
  StFile ints = w;
  ints.tensors[0].dtype = StDtype::kI32;
  EXPECT_THAT(Msg(CheckWeightsMatchConfig(TinyModel(), ints, "w")), HasSubstr("dtype I32"));

  c = TinyModel();
  c.n_head = 0;
  EXPECT_THAT(Msg(CheckWeightsMatchConfig(c, w, "w")), HasSubstr("w: invalid model config"));
  c.n_head = 6;
  EXPECT_THAT(Msg(CheckWeightsMatchConfig(c, w, "w")), HasSubstr("n_head 6"));

  // A config.json that disagrees with its weights is refused when reading.
  std::string dir = CopyFixture("mqa");
  c = TinyModel();
  c.n_inner = 128;
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", SerializeHfConfig(c)).ok());
  absl::StatusOr<HfCheckpoint> ck = ReadHfCheckpoint(dir);
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ck.status()), HasSubstr("mlp.c_fc.bias' has shape [256], config.json implies "
                                          "[128]"));

  // And refused when writing: nothing is written.
  std::string out = dir + "/out";
  s = WriteHfCheckpoint(out, c, w);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(fs::path(dir).parent_path());
}

}  // namespace
}  // namespace latchkey
