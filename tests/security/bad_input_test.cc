// The bad-input catalogue: hostile or broken job specs, data paths, safetensors files,
// config.json files and token files, each answered with the right status code and a message
// naming the field or the reason, never a crash. Most go through the library functions; a few
// through the real coordinator over gRPC (nothing stored) and the real latchkey-worker binary.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "common/spec_limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "latchkey/v1/job_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "proto/channel.h"
#include "tests/coordinator/harness.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/hf_checkpoint.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/data/token_source.h"

namespace latchkey::testing {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// A scratch tree shared by the path entries: <root>/ (the data root) with tokens.bin and two
// symlinks out of it, and <outside>/ with a file the spec must not reach.
struct Tree {
  Tree() {
    const std::string base = std::filesystem::canonical(dir.path()).string();
    root = base + "/root";
    outside = base + "/outside";
    std::filesystem::create_directories(root);
    std::filesystem::create_directories(outside);
    WriteTokens(root + "/tokens.bin", std::vector<uint16_t>(200, 1));
    WriteTokens(outside + "/secret.bin", std::vector<uint16_t>(200, 1));
    std::filesystem::create_symlink(outside + "/secret.bin", root + "/escape.bin");
    std::filesystem::create_directory_symlink(outside, root + "/escape_dir");
  }
  static void WriteTokens(const std::string& path, const std::vector<uint16_t>& ids) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()),
               static_cast<std::streamsize>(ids.size() * 2));
  }
  static void WriteBytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ScopedTempDir dir{"bad_input"};
  std::string root, outside;
};

Tree& T() {
  static Tree* tree = new Tree();
  return *tree;
}

// A small valid spec (synthetic data) to corrupt one field at a time.
json Base() { return SpecObject(); }

absl::Status ParseAndLimit(const std::string& text, const SpecLimits& limits = {}) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, "/jobs/a");
  if (!spec.ok()) return spec.status();
  return CheckSpecLimits(*spec, limits);
}
absl::Status Spec(const std::function<void(json&)>& edit, const SpecLimits& limits = {}) {
  json j = Base();
  edit(j);
  return ParseAndLimit(j.dump(), limits);
}
SpecLimits Roots() {
  SpecLimits l;
  l.data_roots = {T().root};
  return l;
}

// safetensors bytes: an 8-byte little-endian header length, the header, then `data`.
std::string St(const std::string& header, const std::string& data = "", int64_t length = -1) {
  uint64_t n = length >= 0 ? static_cast<uint64_t>(length) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}
absl::Status StParse(const std::string& bytes) {
  return ParseSafetensors(bytes, "m.safetensors").status();
}

std::string FixtureConfig() { return ReadText(FixtureDir() + "/mqa/config.json"); }
absl::Status Config(const std::function<void(json&)>& edit) {
  json j = json::parse(FixtureConfig());
  edit(j);
  return ParseHfConfig(j.dump(), "config.json").status();
}

// An HF folder from the fixture's config.json and the given model.safetensors bytes.
absl::Status HfFolder(const std::string& name, const std::string& config,
                      const std::string& weights) {
  const std::string d = T().root + "/" + name;
  std::filesystem::create_directories(d);
  Tree::WriteBytes(d + "/config.json", config);
  Tree::WriteBytes(d + "/model.safetensors", weights);
  return ReadHfCheckpoint(d).status();
}

absl::Status Tokens(const std::string& name, const std::string& bytes, int vocab = 256,
                    TokenDtype dtype = TokenDtype::kUint16) {
  const std::string p = T().root + "/" + name;
  Tree::WriteBytes(p, bytes);
  return OpenTokenFile(p, dtype, 8, vocab, "latchkey.data.tokens_file").status();
}

struct Case {
  const char* name;
  std::function<absl::Status()> run;
  absl::StatusCode code;
  std::vector<std::string> says;  // substrings of the message: the field and the reason
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

using C = absl::StatusCode;
constexpr C kInvalid = C::kInvalidArgument;

std::vector<Case> Catalogue() {
  return {
      // Job specs: sizes, numbers, types, structure.
      {"huge_model",
       [] {
         return Spec([](json& j) {
           j["model"]["n_layer"] = 100000;
           j["model"]["n_embd"] = 65536;
           j["model"]["n_head"] = 64;
         });
       },
       kInvalid,
       {"model: ", "parameters exceed the coordinator's limit of 2e+10", "--max-model-parameters"}},
      {"huge_vocab",
       [] { return Spec([](json& j) { j["model"]["vocab_size"] = 2000000000; }); },
       kInvalid,
       {"model: ", "exceed"}},
      {"negative_n_layer",
       [] { return Spec([](json& j) { j["model"]["n_layer"] = -1; }); },
       kInvalid,
       {"model.n_layer"}},
      {"overflowing_n_embd",
       [] { return Spec([](json& j) { j["model"]["n_embd"] = 1e30; }); },
       kInvalid,
       {"model.n_embd"}},
      {"n_layer_past_int32",
       [] { return Spec([](json& j) { j["model"]["n_layer"] = 2147483648LL; }); },
       kInvalid,
       {"model.n_layer"}},
      {"n_layer_uint64_max",
       [] { return Spec([](json& j) { j["model"]["n_layer"] = UINT64_MAX; }); },
       kInvalid,
       {"model.n_layer"}},
      {"zero_heads",
       [] { return Spec([](json& j) { j["model"]["n_head"] = 0; }); },
       kInvalid,
       {"model.n_head"}},
      {"vocab_as_string",
       [] { return Spec([](json& j) { j["model"]["vocab_size"] = "256"; }); },
       kInvalid,
       {"model.vocab_size"}},
      {"negative_steps",
       [] { return Spec([](json& j) { j["latchkey"]["steps"] = -5; }); },
       kInvalid,
       {"latchkey.steps"}},
      {"fractional_seq_len",
       [] { return Spec([](json& j) { j["latchkey"]["seq_len"] = 3.5; }); },
       kInvalid,
       {"latchkey.seq_len"}},
      {"lr_as_string",
       [] { return Spec([](json& j) { j["optimizer"]["params"]["lr"] = "fast"; }); },
       kInvalid,
       {"optimizer.params.lr"}},
      {"world_size_zero",
       [] { return Spec([](json& j) { j["latchkey"]["world_size"] = 0; }); },
       kInvalid,
       {"latchkey.world_size"}},
      {"model_not_object",
       [] { return Spec([](json& j) { j["model"] = 5; }); },
       kInvalid,
       {"model"}},
      {"optimizer_not_object",
       [] { return Spec([](json& j) { j["optimizer"] = json::array(); }); },
       kInvalid,
       {"optimizer"}},
      {"scheduler_not_object",
       [] { return Spec([](json& j) { j["scheduler"] = "cosine"; }); },
       kInvalid,
       {"scheduler"}},
      {"latchkey_not_object",
       [] { return Spec([](json& j) { j["latchkey"] = 1; }); },
       kInvalid,
       {"latchkey"}},
      {"data_not_object",
       [] { return Spec([](json& j) { j["latchkey"]["data"] = true; }); },
       kInvalid,
       {"latchkey.data"}},
      {"eval_not_object",
       [] { return Spec([](json& j) { j["latchkey"]["eval"] = 3; }); },
       kInvalid,
       {"latchkey.eval"}},
      {"checkpoint_not_object",
       [] { return Spec([](json& j) { j["latchkey"]["checkpoint"] = "x"; }); },
       kInvalid,
       {"latchkey.checkpoint"}},
      {"tensor_parallel_not_object",
       [] { return Spec([](json& j) { j["tensor_parallel"] = 1; }); },
       kInvalid,
       {"tensor_parallel"}},
      {"zero_optimization_not_object",
       [] { return Spec([](json& j) { j["zero_optimization"] = "1"; }); },
       kInvalid,
       {"zero_optimization"}},
      {"bf16_not_object", [] { return Spec([](json& j) { j["bf16"] = 1; }); }, kInvalid, {"bf16"}},
      {"spec_is_array", [] { return ParseAndLimit("[]"); }, kInvalid, {"array"}},
      {"spec_empty", [] { return ParseAndLimit(""); }, kInvalid, {"JSON"}},
      {"spec_truncated",
       [] {
         std::string s = Base().dump();
         return ParseAndLimit(s.substr(0, s.size() / 2));
       },
       kInvalid,
       {"JSON"}},
      {"spec_deep_nesting",
       [] {
         return ParseAndLimit("{\"model\": " + std::string(200000, '[') + std::string(200000, ']') +
                              "}");
       },
       kInvalid,
       {"spec: ", "nested deeper than 64 levels"}},
      {"spec_huge_string",
       [] { return Spec([](json& j) { j["model"]["model_type"] = std::string(8 << 20, 'x'); }); },
       kInvalid,
       {"model.model_type"}},
      {"spec_non_utf8",
       [] { return ParseAndLimit("{\"model\": {\"model_type\": \"gpt\xff\xfe\"}}"); },
       kInvalid,
       {"UTF-8"}},
      // Paths a spec names, confined to the data root.
      {"tokens_dotdot_escape",
       [] {
         return Spec(
             [](json& j) {
               j["latchkey"]["data"] = TokensData(T().root + "/../outside/secret.bin");
             },
             Roots());
       },
       kInvalid,
       {"latchkey.data.tokens_file: ", "is outside the data roots", "--data-root"}},
      {"tokens_symlink_escape",
       [] {
         return Spec([](json& j) { j["latchkey"]["data"] = TokensData(T().root + "/escape.bin"); },
                     Roots());
       },
       kInvalid,
       {"latchkey.data.tokens_file: ", "resolves to " + T().outside + "/secret.bin"}},
      {"eval_absolute_outside",
       [] {
         return Spec(
             [](json& j) {
               j["latchkey"]["eval"] = {
                   {"tokens_file", "/etc/passwd"}, {"every_steps", 1}, {"samples", 1}};
             },
             Roots());
       },
       kInvalid,
       {"latchkey.eval.tokens_file: /etc/passwd", "outside"}},
      {"init_from_symlinked_dir",
       [] {
         return Spec([](json& j) { j["latchkey"]["init_from"] = T().root + "/escape_dir/model"; },
                     Roots());
       },
       kInvalid,
       {"latchkey.init_from: ", "outside"}},
      {"checkpoint_dir_relative_escape",
       [] {
         absl::StatusOr<JobSpec> s = ParseJobSpec(
             [] {
               json j = Base();
               j["latchkey"]["checkpoint"] = {{"dir", "../../outside/ckpt"}, {"every_steps", 1}};
               return j.dump();
             }(),
             T().root + "/a");
         return s.ok() ? CheckSpecLimits(*s, Roots()) : s.status();
       },
       kInvalid,
       {"latchkey.checkpoint.dir: ", "outside"}},
      // safetensors: truncated or lying headers.
      {"st_shorter_than_length", [] { return StParse("abc"); }, C::kDataLoss, {"m.safetensors"}},
      {"st_header_past_end",
       [] { return StParse(St("{}", "", 1000)); },
       C::kDataLoss,
       {"m.safetensors", "header length 1000", "truncated file"}},
      {"st_header_length_huge",
       [] { return StParse(St("{}", "", INT64_MAX)); },
       kInvalid,
       {"m.safetensors", "header"}},
      {"st_header_not_json", [] { return StParse(St("{not json")); }, kInvalid, {"m.safetensors"}},
      {"st_header_array", [] { return StParse(St("[1,2]")); }, kInvalid, {"m.safetensors"}},
      {"st_offsets_past_end",
       [] {
         return StParse(St(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"));
       },
       C::kDataLoss,
       {"m.safetensors", "truncated file"}},
      {"st_overlapping_offsets",
       [] {
         return StParse(St(
             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
             std::string(12, '\0')));
       },
       kInvalid,
       {"m.safetensors"}},
      {"st_shape_product_overflows",
       [] {
         return StParse(
             St(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})",
                "1234"));
       },
       kInvalid,
       {"w"}},
      {"st_negative_dim",
       [] {
         return StParse(St(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234"));
       },
       kInvalid,
       {"w"}},
      {"st_deep_nesting",
       [] {
         return StParse(St("{\"w\": " + std::string(100000, '[') + std::string(100000, ']') + "}"));
       },
       kInvalid,
       {"m.safetensors", "nested deeper than 8 levels"}},
      {"st_unknown_dtype",
       [] {
         return StParse(St(R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", "1234"));
       },
       kInvalid,
       {"w", "F7"}},
      {"st_size_disagrees_with_shape",
       [] {
         return StParse(
             St(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678"));
       },
       kInvalid,
       {"w"}},
      {"st_missing_file",
       [] { return ReadSafetensorsFile(T().root + "/none.safetensors").status(); },
       C::kNotFound,
       {"none.safetensors"}},
      // config.json
      {"config_truncated",
       [] { return ParseHfConfig(FixtureConfig().substr(0, 40), "config.json").status(); },
       kInvalid,
       {"config.json", "JSON"}},
      {"config_empty",
       [] { return ParseHfConfig("", "config.json").status(); },
       kInvalid,
       {"config.json"}},
      {"config_n_embd_string",
       [] { return Config([](json& j) { j["n_embd"] = "64"; }); },
       kInvalid,
       {"n_embd"}},
      {"config_zero_heads",
       [] { return Config([](json& j) { j["n_head"] = 0; }); },
       kInvalid,
       {"n_head"}},
      {"config_huge_layers",
       [] { return Config([](json& j) { j["n_layer"] = 1e20; }); },
       kInvalid,
       {"n_layer"}},
      {"config_other_model_type",
       [] { return Config([](json& j) { j["model_type"] = "llama"; }); },
       kInvalid,
       {"model_type"}},
      {"config_untied",
       [] { return Config([](json& j) { j["tie_word_embeddings"] = false; }); },
       kInvalid,
       {"tie_word_embeddings"}},
      {"hf_truncated_weights",
       [] {
         std::string w = ReadText(FixtureDir() + "/mqa/model.safetensors");
         return HfFolder("trunc", FixtureConfig(), w.substr(0, w.size() / 2));
       },
       C::kDataLoss,
       {"model.safetensors"}},
      {"hf_config_disagrees_with_weights",
       [] {
         json c = json::parse(FixtureConfig());
         c["n_layer"] = 3;
         return HfFolder("disagree", c.dump(), ReadText(FixtureDir() + "/mqa/model.safetensors"));
       },
       kInvalid,
       {"model.safetensors"}},
      // Token files
      {"tokens_id_past_vocab",
       [] { return Tokens("big.bin", std::string(40, '\0') + "\xff\x7f"); },
       kInvalid,
       {"latchkey.data.tokens_file", "32767", "vocab"}},
      {"tokens_odd_size",
       [] { return Tokens("odd.bin", std::string(41, '\0')); },
       kInvalid,
       {"latchkey.data.tokens_file"}},
      {"tokens_too_few",
       [] { return Tokens("few.bin", std::string(4, '\0')); },
       kInvalid,
       {"latchkey.data.tokens_file"}},
      {"tokens_uint32_past_vocab",
       [] {
         return Tokens("big32.bin", std::string(36, '\0') + "\xff\xff\xff\xff", 256,
                       TokenDtype::kUint32);
       },
       kInvalid,
       {"latchkey.data.tokens_file", "4294967295"}},
      {"tokens_missing",
       [] {
         return OpenTokenFile(T().root + "/none.bin", TokenDtype::kUint16, 8, 256,
                              "latchkey.eval.tokens_file")
             .status();
       },
       C::kNotFound,
       {"latchkey.eval.tokens_file", "none.bin"}},
      {"tokens_worker_root_symlink",
       [] {
         ::setenv(kDataRootsEnv, T().root.c_str(), 1);
         absl::Status st = OpenTokenFile(T().root + "/escape.bin", TokenDtype::kUint16, 8, 256,
                                         "latchkey.data.tokens_file")
                               .status();
         ::unsetenv(kDataRootsEnv);
         return st;
       },
       kInvalid,
       {"latchkey.data.tokens_file", "outside the data roots", "LATCHKEY_DATA_ROOTS"}},
      {"init_from_worker_root_dotdot",
       [] {
         ::setenv(kDataRootsEnv, T().root.c_str(), 1);
         absl::Status st = ReadHfCheckpoint(T().root + "/../outside").status();
         ::unsetenv(kDataRootsEnv);
         return st;
       },
       kInvalid,
       {"outside the data roots", "LATCHKEY_DATA_ROOTS"}},
  };
}

class BadInputTest : public ::testing::TestWithParam<Case> {};

TEST_P(BadInputTest, RefusedWithCodeAndReason) {
  const Case& c = GetParam();
  absl::Status st = c.run();
  EXPECT_EQ(st.code(), c.code) << st;
  for (const std::string& s : c.says) EXPECT_THAT(std::string(st.message()), HasSubstr(s)) << st;
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BadInputTest, ::testing::ValuesIn(Catalogue()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(BadInputCatalogueTest, HasAtLeastFiftyEntries) { EXPECT_GE(Catalogue().size(), 50u); }

// Through the real latchkey-coordinator (--data-root, --max-model-parameters) over gRPC: every
// refused spec is INVALID_ARGUMENT naming the field, and nothing is stored (ListJobs stays empty)
// until a spec within the limits arrives.
TEST(BadInputCoordinatorTest, SubmitJobRefusesAndStoresNothing) {
  ScopedTempDir db{"bad_input_db"};
  CoordinatorProcess server(db / "coord.db", 0,
                            {"--data-root", T().root, "--max-model-parameters", "2e10"});
  ASSERT_TRUE(server.Start());
  auto jobs = v1::JobService::NewStub(MakeCoordinatorChannel(server.address()));
  auto call = [&](const std::string& spec_json, v1::SubmitJobResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitJobRequest req;
    req.set_spec_json(spec_json);
    return jobs->SubmitJob(&ctx, req, resp);
  };
  auto count = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListJobsResponse resp;
    grpc::Status st = jobs->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.jobs_size();
  };
  auto with = [](const std::function<void(json&)>& edit) {
    json j = Base();
    edit(j);
    return j.dump();
  };
  const std::pair<std::string, std::string> refused[] = {
      {with([](json& j) {
         j["model"]["n_layer"] = 100000;
         j["model"]["n_embd"] = 65536;
         j["model"]["n_head"] = 64;
       }),
       "model: "},
      {with([](json& j) { j["latchkey"]["data"] = TokensData(T().root + "/escape.bin"); }),
       "latchkey.data.tokens_file: "},
      {with([](json& j) { j["latchkey"]["init_from"] = T().root + "/../outside"; }),
       "latchkey.init_from: "},
      {with([](json& j) {
         j["latchkey"]["checkpoint"] = {{"dir", "/tmp/elsewhere"}, {"every_steps", 1}};
       }),
       "latchkey.checkpoint.dir: "},
      {with([](json& j) { j["model"]["n_head"] = "8"; }), "model.n_head"},
      {"{\"model\": ", "spec: not valid JSON"},
  };
  for (const auto& [spec_json, says] : refused) {
    v1::SubmitJobResponse resp;
    grpc::Status st = call(spec_json, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << says << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(says));
    EXPECT_TRUE(resp.job_id().empty());
    EXPECT_EQ(count(), 0) << says;
  }
  v1::SubmitJobResponse resp;
  grpc::Status st = call(
      with([](json& j) { j["latchkey"]["data"] = TokensData(T().root + "/tokens.bin"); }), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(count(), 1);
}

// The real latchkey-worker re-checks what it opens against LATCHKEY_DATA_ROOTS: a token file
// that is a symlink out of the root fails the run (exit 1) naming the field; the same spec
// reading a file inside the root trains.
TEST(BadInputWorkerTest, StandaloneWorkerRefusesASymlinkOutOfItsDataRoot) {
  auto run = [](const std::string& tokens, const std::string& name) {
    SpecParams p = SingleRankParams();
    p.steps = 1;
    p.gas = 1;
    p.micro_batch = 1;
    p.seq_len = 8;
    p.data = TokensData(tokens);
    const std::string spec = T().dir / (name + ".json");
    Tree::WriteBytes(spec, SpecJson(p));
    const std::string log = T().dir / (name + ".log");
    int pid = StartProcess({WorkerBinary(), "--standalone", "--spec", spec, "--quiet"},
                           {std::string(kDataRootsEnv) + "=" + T().root}, log);
    int rc = WaitProcess(pid, std::chrono::seconds(120));
    return std::make_pair(rc, ReadText(log));
  };
  auto [bad_rc, bad_out] = run(T().root + "/escape.bin", "escape");
  EXPECT_EQ(bad_rc, 1) << bad_out;
  EXPECT_THAT(bad_out, HasSubstr("latchkey.data.tokens_file: " + T().root + "/escape.bin"));
  EXPECT_THAT(bad_out, HasSubstr("outside the data roots"));
  auto [ok_rc, ok_out] = run(T().root + "/tokens.bin", "inside");
  EXPECT_EQ(ok_rc, 0) << ok_out;
}

}  // namespace
}  // namespace latchkey::testing
