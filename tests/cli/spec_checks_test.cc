// What `validate`, `submit` and `up` check of a spec before anything runs, and what the workers
// check once they have it, with real processes: a Megatron dataset's files and index cache
// folder, what `validate` says the data is, a spec file that is not there, `--json` after the
// command, and a worker whose coordinator never answers its join.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_support.h"
#include "tests/support/free_port.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using json = nlohmann::json;
using std::chrono::seconds;

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

json WithData(const json& data) {
  json spec = BuiltInSpec();
  spec["latchkey"]["data"] = data;
  return spec;
}

// A dataset whose .idx or .bin is missing, or an index cache folder that cannot be made, is
// named with its field by validate, submit and up, before anything is sent or started.
TEST(SpecChecks, AMegatronDatasetsFilesAreCheckedBeforeAnythingStarts) {
  const ScopedTempDir dir("spec-megatron-files");
  Touch(dir / "a.idx");
  Touch(dir / "a.bin");
  Touch(dir / "only-idx.idx");
  Touch(dir / "a-file");
  const struct {
    json data;
    std::string names;
  } cases[] = {
      {{{"format", "megatron"}, {"path_prefix", "corpus"}},
       "latchkey.data.path_prefix: cannot read '" + dir / "corpus.idx" +
           "': No such file or directory"},
      {{{"format", "megatron"}, {"path_prefix", "only-idx"}},
       "latchkey.data.path_prefix: cannot read '" + dir / "only-idx.bin" + "'"},
      {{{"format", "megatron"},
        {"blend",
         {{{"weight", 0.7}, {"path_prefix", "a"}}, {{"weight", 0.3}, {"path_prefix", "b"}}}}},
       "latchkey.data.blend[1].path_prefix: cannot read '" + dir / "b.idx" + "'"},
      {{{"format", "megatron"}, {"path_prefix", "a"}, {"cache_dir", "a-file/cache"}},
       "latchkey.data.cache_dir: cannot write '" + dir / "a-file/cache" + "'"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string spec = WriteSpec(dir.path(), WithData(c.data), std::to_string(n++) + ".json");
    for (const std::vector<std::string>& args : {std::vector<std::string>{"validate", spec},
                                                 {"submit", spec},
                                                 {"submit", "--dry-run", spec}}) {
      const Captured r = Cli(args, {"--coordinator", "127.0.0.1:1"});
      EXPECT_EQ(r.exit_code, 3) << args[0] << " " << spec << "\n" << r.output;
      EXPECT_TRUE(Has(r.output, c.names)) << r.output;
      EXPECT_FALSE(Has(r.output, "every file the spec names is readable here")) << r.output;
    }
    const Captured up = Cli({"up", "--spec", spec, "--run-dir", dir / "run"}, {}, seconds(30));
    EXPECT_EQ(up.exit_code, 3) << up.output;
    EXPECT_TRUE(Has(up.output, c.names)) << up.output;
    EXPECT_FALSE(Has(up.output, "coordinator  ")) << "started something\n" << up.output;
  }
}

// The workers' own check: a dataset missing where they run fails the job at once naming the
// field, as a configuration error, without spending a restart.
TEST(SpecChecks, AMissingMegatronDatasetFailsTheJobAtOnce) {
  const ScopedTempDir dir("spec-megatron-missing");
  json spec = WithData({{"format", "megatron"}, {"path_prefix", "corpus"}});
  spec["latchkey"]["max_restarts"] = 3;
  const std::string path = WriteSpec(dir.path(), spec);
  const auto start = std::chrono::steady_clock::now();
  const Captured up =
      Cli({"up", "--no-file-check", "--spec", path, "--run-dir", dir / "run"}, {}, seconds(120));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(up.exit_code, 10) << up.output;
  EXPECT_TRUE(Has(up.output, "latchkey.data.path_prefix: cannot read '" + dir / "corpus.idx" +
                                 "': No such file or directory"))
      << up.output;
  EXPECT_TRUE(Has(up.output, "a configuration error: not retried")) << up.output;
  EXPECT_FALSE(Has(up.output, "recovery     attempt")) << up.output;
  EXPECT_LT(took, 60) << up.output;
}

// The same with a coordinator and a worker of our own: the job fails with no restart spent and a
// cause naming the field.
TEST(SpecChecks, AMissingMegatronDatasetSpendsNoRestart) {
  const ScopedTempDir dir("spec-megatron-restarts");
  Coordinator c(dir.path());
  ASSERT_TRUE(c.ok()) << c.log();
  const std::vector<std::string> at = {"--json", "--coordinator", c.address()};
  json spec = WithData({{"format", "megatron"}, {"path_prefix", "corpus"}});
  spec["tensor_parallel"]["autotp_size"] = 1;
  spec["latchkey"]["world_size"] = 1;
  spec["latchkey"]["max_restarts"] = 3;
  const Captured submitted =
      Cli({"submit", "--no-file-check", WriteSpec(dir.path(), spec)}, at, seconds(30));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const json sub = json::parse(submitted.output, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(sub.is_object()) << submitted.output;
  const std::string job = sub["job_id"];
  const Captured w =
      Worker({"--coordinator", c.address(), "--job", job},
             {"LATCHKEY_JOIN_TOKEN=" + sub["join_token"].get<std::string>()}, seconds(60));
  EXPECT_EQ(w.exit_code, 1) << w.output;
  EXPECT_TRUE(Has(w.output, "latchkey.data.path_prefix: cannot read")) << w.output;
  const Captured status = Cli({"status", job}, at);
  ASSERT_EQ(status.exit_code, 0) << status.output;
  std::istringstream lines(status.output);
  std::string first;
  std::getline(lines, first);
  const json j = json::parse(first, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << status.output;
  EXPECT_EQ(j["state"], "JOB_STATE_FAILED") << status.output;
  EXPECT_EQ(j["restarts"], 0) << status.output;
  EXPECT_EQ(j["attempt"], 1) << status.output;
  EXPECT_TRUE(Has(j["failure_reason"].get<std::string>(),
                  "latchkey.data.path_prefix: cannot read '" + dir / "corpus.idx" +
                      "': No such file or directory"))
      << status.output;
}

// validate (and submit --dry-run) print the data and the evaluation as the spec says them.
TEST(SpecChecks, ValidateSaysWhatTheDataIs) {
  const ScopedTempDir dir("spec-describe");
  for (const char* f : {"corpus.idx", "corpus.bin", "b.idx", "b.bin", "t.bin", "e.bin"}) {
    Touch(dir / f);
  }
  json demo = WithData({{"format", "megatron"}, {"path_prefix", "corpus"}, {"split", "85,15,0"}});
  demo["latchkey"]["eval"] = {{"split", "validation"}, {"every_steps", 10}, {"samples", 8}};
  const std::string demo_path = WriteSpec(dir.path(), demo, "demo.json");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"validate", demo_path}, {"submit", "--dry-run", demo_path}}) {
    const Captured r = Cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    // 40 steps x 4 micro-batches x DP 1 x MB 4.
    EXPECT_TRUE(Has(r.output, "data:         megatron " + dir / "corpus" +
                                  " (split 85,15,0, seed 1, 640 samples)\n"))
        << r.output;
    EXPECT_TRUE(Has(r.output, "index cache:  " + dir / "latchkey-index-cache" + "\n")) << r.output;
    EXPECT_TRUE(Has(r.output,
                    "eval:         the validation split of the data, every 10 steps, 8 samples\n"))
        << r.output;
    EXPECT_FALSE(Has(r.output, "synthetic")) << r.output;
  }
  json blend = WithData(
      {{"format", "megatron"},
       {"blend",
        {{{"weight", 0.7}, {"path_prefix", "corpus"}}, {{"weight", 0.3}, {"path_prefix", "b"}}}},
       {"seed", 5},
       {"num_samples", 100}});
  const Captured b = Cli({"validate", WriteSpec(dir.path(), blend, "blend.json")});
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_TRUE(Has(b.output, "data:         megatron blend 0.7 " + dir / "corpus" + ", 0.3 " +
                                dir / "b" + " (split 100,0,0, seed 5, 100 samples)\n"))
      << b.output;
  json tokens = WithData({{"tokens_file", "t.bin"}, {"dtype", "uint32"}});
  tokens["latchkey"]["eval"] = {{"tokens_file", "e.bin"}, {"every_steps", 1}, {"samples", 2}};
  const Captured t = Cli({"validate", WriteSpec(dir.path(), tokens, "tokens.json")});
  EXPECT_EQ(t.exit_code, 0) << t.output;
  EXPECT_TRUE(Has(t.output, "data:         " + dir / "t.bin" + " (uint32)\n")) << t.output;
  EXPECT_TRUE(
      Has(t.output, "eval:         " + dir / "e.bin" + " (uint16), every 1 step, 2 samples\n"))
      << t.output;
  const Captured synthetic = Cli({"validate", WriteSpec(dir.path(), BuiltInSpec(), "s.json")});
  EXPECT_TRUE(Has(synthetic.output, "data:         synthetic (seed 1)\n")) << synthetic.output;
  EXPECT_FALSE(Has(synthetic.output, "eval:")) << synthetic.output;
}

// A spec file that is not there is NOT_FOUND, a usage error (exit 2), for validate, submit and
// up alike (docs/job-spec.md "Validation errors").
TEST(SpecChecks, AMissingSpecFileIsNotFound) {
  const ScopedTempDir dir("spec-missing");
  const std::string path = dir / "nope.json";
  for (const std::vector<std::string>& args : {std::vector<std::string>{"validate", path},
                                               {"submit", path},
                                               {"submit", "--dry-run", path},
                                               {"up", "--spec", path, "--run-dir", dir / "run"}}) {
    const Captured r = Cli(args, {"--coordinator", "127.0.0.1:1"}, seconds(30));
    EXPECT_EQ(r.exit_code, 2) << args[0] << "\n" << r.output;
    EXPECT_TRUE(Has(r.output, "NOT_FOUND: " + std::string(args[0] == "up" ? "--spec " : "") + path +
                                  ": cannot open the job spec: No such file or directory"))
        << r.output;
  }
}

// --json (and the other global options) after the command, as before it.
TEST(SpecChecks, JsonIsTakenAfterTheCommand) {
  const ScopedTempDir dir("spec-json-after");
  const std::string spec = WriteSpec(dir.path(), BuiltInSpec());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"validate", spec, "--json"}, {"validate", "--json", spec}}) {
    const Captured r = Cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::istringstream lines(r.output);
    std::string first;
    std::getline(lines, first);
    const json j = json::parse(first, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << r.output;
    EXPECT_EQ(j["valid"], true);
    EXPECT_EQ(j["world_size"], 2);
  }
  // A global option with its value after the command's argument.
  const Captured list = Cli({"list", "--coordinator", "127.0.0.1:1", "--timeout", "2", "--json"});
  EXPECT_EQ(list.exit_code, 6) << list.output;
  EXPECT_TRUE(Has(list.output, "nothing is listening at 127.0.0.1:1")) << list.output;
  // What neither the command nor the global options know is still a usage error.
  const Captured unknown = Cli({"validate", spec, "--no-such-flag"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  const Captured extra = Cli({"validate", spec, "extra-argument"});
  EXPECT_EQ(extra.exit_code, 2) << extra.output;
}

// A worker whose coordinator never answers says what it waits for while it waits, and gives up
// after --join-timeout naming the address and the timeout.
TEST(SpecChecks, AWorkerGivesUpItsJoinAfterJoinTimeout) {
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const auto start = std::chrono::steady_clock::now();
  const Captured w =
      Worker({"--coordinator", address, "--job", "job-000001", "--join-timeout", "6"},
             {"LATCHKEY_JOIN_TOKEN=0123456789abcdef"}, seconds(60));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(w.exit_code, 1) << w.output;
  EXPECT_GE(took, 6) << w.output;
  EXPECT_LT(took, 30) << w.output;  // its start (libtorch) included; the default is 120 s
  EXPECT_TRUE(Has(w.output, "coordinator " + address + " not answering, retrying for up to 6s"))
      << w.output;
  EXPECT_TRUE(Has(w.output, "still waiting for coordinator " + address +
                                " to answer the join of job job-000001: 5s so far"))
      << w.output;
  EXPECT_TRUE(Has(w.output, "join job-000001 at " + address +
                                ": no answer within the join timeout of 6s; the last try: "
                                "UNAVAILABLE"))
      << w.output;
  // A timeout that is not a positive number is a usage error.
  const Captured bad =
      Worker({"--coordinator", address, "--job", "job-000001", "--join-timeout", "0"},
             {"LATCHKEY_JOIN_TOKEN=0123456789abcdef"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(Has(bad.output, "--join-timeout needs seconds > 0, got '0'")) << bad.output;
}

}  // namespace
}  // namespace latchkey::testing
