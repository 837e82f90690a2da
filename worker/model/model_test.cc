// The unsharded model against the independent float64 fixture (testdata/gptbigcode-tiny).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not via ATen.h in torch 2.x)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/scripted_group.h"
#include "worker/checkpoint/hf_checkpoint.h"
#include "worker/comm/collective_error.h"
#include "worker/comm/comm.h"
#include "worker/comm/process_groups.h"
#include "worker/data/token_source.h"
#include "worker/model/gpt_bigcode.h"
#include "worker/model/param_store.h"

namespace latchkey {
namespace {

const std::string kFixture = std::string(LATCHKEY_SOURCE_DIR) + "/testdata/gptbigcode-tiny";

nlohmann::json Expected() {
  std::ifstream in(kFixture + "/expected.json");
  return nlohmann::json::parse(in);
}

std::map<std::string, at::Tensor> LoadFull(const HfCheckpoint& ckpt) {
  std::map<std::string, at::Tensor> full;
  for (const StTensor& t : ckpt.weights.tensors) {
    full[t.name] = at::from_blob(const_cast<char*>(t.data.data()), t.shape, at::kFloat).clone();
  }
  return full;
}

class FixtureLoss : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureLoss, LossOfSamples0And1) {
  const std::string variant = GetParam();
  auto ckpt = ReadHfCheckpoint(kFixture + "/" + variant);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto layout = BuildTpLayout(ckpt->config, 1, 0);
  ASSERT_TRUE(layout.ok());
  ParamStore store(*layout, 1);
  ASSERT_TRUE(store.LoadFromFull(LoadFull(*ckpt), 0).ok());
  comm::ProcessGroups groups = comm::MakeSingleProcessGroups();
  GptBigCode model(ckpt->config, &store, groups.tp_group.get(), 1);

  const nlohmann::json expected = Expected();
  const int S = expected["seq_len"];
  auto src = OpenTokenFile(kFixture + "/tokens.bin", TokenDtype::kUint16, S, 256, "tokens");
  ASSERT_TRUE(src.ok());
  at::Tensor tokens = at::empty({2, S + 1}, at::kLong);
  (*src)->Sample(0, tokens.data_ptr<int64_t>());
  (*src)->Sample(1, tokens.data_ptr<int64_t>() + S + 1);
  at::NoGradGuard no_grad;
  const double loss =
      model.Loss(tokens.narrow(1, 0, S), tokens.narrow(1, 1, S), {0, 1}).item<double>();
  EXPECT_NEAR(loss, expected["variants"][variant]["loss_samples_0_1"].get<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Variants, FixtureLoss, ::testing::Values("mqa", "mha"));

// With dropout a row's masks follow its stream position: the same positions give the same loss,
// a row moved within the batch together with its position keeps its masks, another position
// draws others. Evaluation mode draws nothing: the dropout-free loss exactly.
TEST(GptBigCodeDropout, MasksFollowTheRowPosition) {
  auto ckpt = ReadHfCheckpoint(kFixture + "/mqa");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ModelConfig config = ckpt->config;
  auto layout = BuildTpLayout(config, 1, 0);
  ASSERT_TRUE(layout.ok());
  ParamStore store(*layout, 1);
  ASSERT_TRUE(store.LoadFromFull(LoadFull(*ckpt), 0).ok());
  comm::ProcessGroups groups = comm::MakeSingleProcessGroups();
  GptBigCode plain(config, &store, groups.tp_group.get(), 1);
  config.embd_pdrop = config.resid_pdrop = config.attn_pdrop = 0.1;
  GptBigCode model(config, &store, groups.tp_group.get(), 1);

  const int S = Expected()["seq_len"];
  auto src = OpenTokenFile(kFixture + "/tokens.bin", TokenDtype::kUint16, S, 256, "tokens");
  ASSERT_TRUE(src.ok());
  at::Tensor tokens = at::empty({2, S + 1}, at::kLong);
  (*src)->Sample(0, tokens.data_ptr<int64_t>());
  (*src)->Sample(1, tokens.data_ptr<int64_t>() + S + 1);
  const at::Tensor swapped = tokens.flip(0);
  at::NoGradGuard no_grad;
  const auto loss = [&](GptBigCode& m, const at::Tensor& t, std::vector<int64_t> positions) {
    return m.Loss(t.narrow(1, 0, S), t.narrow(1, 1, S), positions).item<double>();
  };
  const double ref = loss(model, tokens, {40, 41});
  EXPECT_EQ(loss(model, tokens, {40, 41}), ref);
  EXPECT_NEAR(loss(model, swapped, {41, 40}), ref, 1e-6);
  EXPECT_GT(std::abs(loss(model, swapped, {40, 41}) - ref), 1e-4);
  EXPECT_GT(std::abs(loss(model, tokens, {40, 42}) - ref), 1e-4);
  const double without = loss(plain, tokens, {40, 41});
  EXPECT_GT(std::abs(ref - without), 1e-3);
  model.set_training(false);
  EXPECT_EQ(loss(model, tokens, {40, 41}), without);
  EXPECT_THROW(loss(model, tokens, {40}), c10::Error);
}

TEST(TpLayout, ValidationErrorsNameTheField) {
  ModelConfig m;  // n_embd 64, n_head 8
  auto bad_div = BuildTpLayout(m, 3, 0);
  EXPECT_EQ(bad_div.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_div.status().message().find("tensor_parallel.autotp_size"), std::string::npos);
  auto too_big = BuildTpLayout(m, 16, 0);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  m.n_embd = 60;
  auto bad_embd = BuildTpLayout(m, 1, 0);
  EXPECT_EQ(bad_embd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_embd.status().message().find("model.n_embd"), std::string::npos);
}

TEST(TpLayout, MqaShardsQueryHeadsAndReplicatesKv) {
  ModelConfig m;
  auto l = BuildTpLayout(m, 4, 1);
  ASSERT_TRUE(l.ok());
  for (const ParamLayout& p : *l) {
    if (p.name == "transformer.h.0.attn.c_attn.weight") {
      EXPECT_EQ(p.local_shape, (std::vector<int64_t>{16 + 16, 64}));  // 2 heads of 8 + K,V
      EXPECT_EQ(p.shard_begin, 16);
      EXPECT_EQ(p.kv_row_begin, 16);
      EXPECT_EQ(p.kv_rows, 16);
    }
    if (p.name == "transformer.h.0.mlp.c_fc.weight") {
      EXPECT_EQ(p.local_shape, (std::vector<int64_t>{64, 64}));
    }
    if (p.name == "transformer.h.0.attn.c_proj.weight") {
      EXPECT_EQ(p.local_shape, (std::vector<int64_t>{64, 16}));
    }
  }
}

TEST(ParamStore, ShardAndAssembleRoundTrip) {
  ModelConfig m;
  m.multi_query = true;
  auto full = InitFullWeights(m, 3);
  std::vector<std::vector<ParamLayout>> layouts;
  std::vector<at::Tensor> flats;
  for (int r = 0; r < 2; ++r) {
    layouts.push_back(*BuildTpLayout(m, 2, r));
    ParamStore s(layouts.back(), 1);
    ASSERT_TRUE(s.LoadFromFull(full, r).ok());
    flats.push_back(s.flat_params().narrow(0, 0, s.numel()).clone());
  }
  auto back = AssembleFull(layouts, flats);
  ASSERT_EQ(back.size(), full.size());
  for (const auto& [name, t] : full) EXPECT_TRUE(at::equal(back.at(name), t)) << name;
}

// Rank 0 of a TP-2 fixture model (2 layers: 4 all-reduces forward, 4 backward).
struct TpShard {
  explicit TpShard(int ok_all_reduces)
      : group("tp", 0, 2, std::make_shared<comm::CollectiveStats>(), ok_all_reduces) {
    auto ckpt = ReadHfCheckpoint(kFixture + "/mqa");
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    config = ckpt->config;
    store = std::make_unique<ParamStore>(*BuildTpLayout(config, 2, 0), 1);
    EXPECT_TRUE(store->LoadFromFull(LoadFull(*ckpt), 0).ok());
    model = std::make_unique<GptBigCode>(config, store.get(), &group, 1);
  }
  at::Tensor Loss() {
    at::Tensor ids = at::arange(16, at::kLong).remainder(config.vocab_size).view({2, 8});
    return model->Loss(ids, ids, {0, 1});
  }
  testing::ScriptedGroup group;
  ModelConfig config;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<GptBigCode> model;
};

TEST(GptBigCodeErrors, CollectiveFailingInForwardThrowsItsStatus) {
  TpShard shard(/*ok_all_reduces=*/1);
  try {
    shard.Loss();
    FAIL() << "forward succeeded";
  } catch (const comm::CollectiveError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded) << e.status();
    EXPECT_NE(e.status().message().find("all_reduce on group 'tp'"), std::string::npos);
  }
}

// A collective failing inside autograd's backward (the TP layers' input-gradient all-reduce)
// reaches the caller of backward() as the same CollectiveError, code and message intact.
TEST(GptBigCodeErrors, CollectiveFailingInBackwardKeepsItsTypeThroughAutograd) {
  TpShard shard(/*ok_all_reduces=*/4);  // the whole forward
  at::Tensor loss = shard.Loss();
  ASSERT_EQ(shard.group.all_reduces(), 4);
  try {
    loss.backward();
    FAIL() << "backward succeeded";
  } catch (const comm::CollectiveError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded) << e.status();
    EXPECT_NE(e.status().message().find("all_reduce on group 'tp' (rank 0 of 2)"),
              std::string::npos)
        << e.status();
  } catch (const std::exception& e) {
    FAIL() << "the collective's error lost its type: " << e.what();
  }
  EXPECT_EQ(shard.group.all_reduces(), 5);  // failed on the first backward all-reduce
}

}  // namespace
}  // namespace latchkey
