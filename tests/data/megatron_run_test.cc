// Training on a Megatron dataset in real worker processes: a DP 2 x TP 2 run on the oracle's
// 3-way blend (testdata/megatron) dumps (--dump-samples) exactly megatron-core's samples at the
// positions of docs/data.md; a one-rank layout of the same global batch reads the same samples
// per window; evaluation on the validation split runs on both; a corrupt .idx fails the job naming
// the file and field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/support/launch.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using nlohmann::json;

std::string MegatronDir() { return SourceDir() + "/testdata/megatron"; }

json Fixture() {
  std::ifstream in(MegatronDir() + "/expected.json");
  return json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

const json& Case(const json& f, const std::string& name) {
  for (const json& c : f["cases"]) {
    if (c["name"] == name) return c;
  }
  throw std::runtime_error("no fixture case " + name);
}

// The fixture's "blend-s7-n300": weights 0.5/0.3/0.2 over the three datasets, seq_len 7,
// 300 samples, seed 1234, split 90,5,5.
json BlendSpec(int dp, int tp, int mb, int gas, int steps) {
  SpecParams p;
  ModelShape m;
  m.vocab_size = 1000;  // the fixture's ids are < 1000
  p.model = ModelJson(m);
  p.micro_batch = mb;
  p.gas = gas;
  p.tp = tp;
  p.world_size = dp * tp;
  p.seq_len = 7;
  p.steps = steps;
  p.zero_stage = 0;
  json blend = json::array();
  const std::vector<std::string> names = {"a_uint16", "b_int32", "c_uint8"};
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  for (size_t i = 0; i < names.size(); ++i) {
    blend.push_back({{"weight", weights[i]}, {"path_prefix", MegatronDir() + "/" + names[i]}});
  }
  p.data = {{"format", "megatron"}, {"blend", blend},     {"split", "90,5,5"},
            {"seed", 1234},         {"num_samples", 300}, {"cache_dir", "index-cache"}};
  p.extra_latchkey = {{"eval", {{"split", "validation"}, {"every_steps", steps}, {"samples", 11}}}};
  return SpecObject(p);
}

std::vector<json> ReadDump(const std::string& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

TEST(MegatronRun, Dp2Tp2DumpsMegatronCoresSamples) {
  const json f = Fixture();
  const json& expected = Case(f, "blend-s7-n300")["train"]["tokens"];
  const int dp = 2, tp = 2, mb = 2, gas = 2, steps = 3;
  WorkerRun run =
      RunWorkers(BlendSpec(dp, tp, mb, gas, steps), dp * tp, {"--dump-samples", "{dir}/dump", "6"});
  ASSERT_TRUE(run.ok()) << run.Describe();
  for (int rank = 0; rank < dp * tp; ++rank) {
    const std::vector<json> lines = ReadDump(run.dir + "/dump.rank" + std::to_string(rank));
    ASSERT_EQ(lines.size(), 6u) << rank;  // N = 6 micro-batches: all of 3 windows x GAS 2
    for (const json& l : lines) {
      const int d = l["dp_rank"].get<int>();
      EXPECT_EQ(l["tp_rank"].get<int>(), rank % tp);  // TP ranks of a replica read the same
      EXPECT_EQ(d, rank / tp);
      const int64_t s = l["window"].get<int64_t>(), m = l["micro_batch"].get<int64_t>();
      for (int b = 0; b < mb; ++b) {
        // docs/data.md: p = F_s + (m·DP + d)·MB + b, F_s = s·GAS·DP·MB with one layout.
        const int64_t p = s * gas * dp * mb + (m * dp + d) * mb + b;
        ASSERT_EQ(l["positions"][b].get<int64_t>(), p);
        ASSERT_EQ(l["samples"][b].get<int64_t>(), p % 300);
        ASSERT_EQ(l["tokens"][b], expected[p % 300]) << "rank " << rank << " position " << p;
      }
    }
    ASSERT_EQ(run.steps[rank].size(), static_cast<size_t>(steps));
    EXPECT_TRUE(run.steps[rank].back().contains("eval_loss")) << run.steps[rank].back().dump();
  }
  // The indices were built once and cached beside the spec.
  int cached = 0;
  for (const auto& e : std::filesystem::directory_iterator(run.dir + "/index-cache")) {
    cached += e.path().extension() == ".lkidx";
  }
  EXPECT_EQ(cached, 6);  // 3 datasets x (train, validation)

  // One rank, GAS 4, the same global batch of 8: each window reads the same samples.
  WorkerRun one =
      RunWorkers(BlendSpec(1, 1, mb, 2 * gas, steps), 1, {"--dump-samples", "{dir}/dump", "12"});
  ASSERT_TRUE(one.ok()) << one.Describe();
  std::map<int64_t, std::multiset<int64_t>> by_window_one, by_window_four;
  for (const json& l : ReadDump(one.dir + "/dump.rank0")) {
    for (const json& k : l["samples"]) by_window_one[l["window"]].insert(k.get<int64_t>());
  }
  for (int rank = 0; rank < dp * tp; rank += tp) {
    for (const json& l : ReadDump(run.dir + "/dump.rank" + std::to_string(rank))) {
      for (const json& k : l["samples"]) by_window_four[l["window"]].insert(k.get<int64_t>());
    }
  }
  EXPECT_EQ(by_window_one, by_window_four);
  EXPECT_EQ(by_window_one.size(), static_cast<size_t>(steps));
  EXPECT_TRUE(one.steps[0].back().contains("eval_loss"));
}

TEST(MegatronRun, CorruptIndexFailsTheJobNamingFileAndField) {
  ScopedTempDir tmp("megatron-corrupt");
  for (const char* ext : {".idx", ".bin"}) {
    std::filesystem::copy_file(MegatronDir() + "/c_uint8" + ext, tmp / (std::string("c") + ext));
  }
  {
    std::fstream idx(tmp / "c.idx", std::ios::binary | std::ios::in | std::ios::out);
    idx.seekp(9);
    idx.put('\x02');  // version 2
  }
  SpecParams p = SingleRankParams();
  p.seq_len = 7;
  p.data = {{"format", "megatron"}, {"path_prefix", tmp / "c"}};
  WorkerRun run = RunWorkers(SpecObject(p), 1);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.stderr_text[0].find(tmp / "c.idx: version: 2 is not supported"), std::string::npos)
      << run.Describe();
}

}  // namespace
}  // namespace latchkey::testing
