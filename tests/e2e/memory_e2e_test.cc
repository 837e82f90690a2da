// Memory you can see, end to end (docs/memory.md "Measuring memory"):
//  - two real worker ranks (TP 2) write peak_memory_bytes >= activation_memory_bytes > 0 in
//    every JSONL record, and the activation bytes of seq 32 and 64 are the formula's (the
//    layers' terms plus the logits') within 15%, so their ratio is too;
//  - under `latchkey up` the workers export the two gauges, the coordinator stores the three
//    columns (SQLite schema v8) and its status page shows each rank's peak, and the summary
//    `up` ends with shows the peak per rank.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sqlite3.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/memory/activation_formula.h"

namespace latchkey::testing {
namespace {

using std::chrono::seconds;

SpecParams MemoryParams(int seq_len, int steps) {
  SpecParams p;
  p.micro_batch = 1;
  p.gas = 2;
  p.tp = 2;
  p.world_size = 2;
  p.zero_stage = 0;
  p.optimizer = "SGD";
  p.seq_len = seq_len;
  p.steps = steps;
  return p;
}

// The tiny model (2 layers, n_embd 64, 8 heads, vocab 256) at `seq`, MB 1, TP 2, fp32.
double ExpectedActivationBytes(int seq) {
  memory::FormulaShape f;
  f.s = seq;
  f.b = 1;
  f.h = 64;
  f.a = 8;
  f.t = 2;
  return 2 * memory::ActivationBytesPerLayer(f, memory::FormulaMode::kNone, false) +
         memory::OutsideLayersBytes(f, 256);
}

TEST(MemoryEndToEnd, RanksReportPeakAndActivationBytesGrowingWithSeqLenAsTheFormula) {
  std::map<int, double> activation;  // seq -> rank 0's last step
  for (int seq : {32, 64}) {
    const WorkerRun run = RunWorkers(SpecObject(MemoryParams(seq, 3)), 2);
    ASSERT_TRUE(run.ok()) << run.Describe();
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(run.steps[rank].size(), 3u) << run.Describe();
      for (const nlohmann::json& r : run.steps[rank]) {
        ASSERT_TRUE(r.contains("peak_memory_bytes") && r.contains("activation_memory_bytes"))
            << r.dump();
        const int64_t peak = r["peak_memory_bytes"].get<int64_t>();
        const int64_t act = r["activation_memory_bytes"].get<int64_t>();
        EXPECT_GT(act, 0) << r.dump();
        EXPECT_GE(peak, act) << r.dump();
        EXPECT_FALSE(r.contains("reserved_memory_bytes")) << "CPU ranks reserve nothing";
      }
      // The same window shape every step: the same bytes on both ranks (TP shards are equal).
      EXPECT_EQ(run.steps[rank].back()["activation_memory_bytes"],
                run.steps[0].back()["activation_memory_bytes"]);
    }
    activation[seq] = run.steps[0].back()["activation_memory_bytes"].get<double>();
    const double want = ExpectedActivationBytes(seq);
    EXPECT_NEAR(activation[seq] / want, 1.0, 0.15)
        << "seq " << seq << ": measured " << activation[seq] << ", formula " << want;
  }
  const double ratio = activation[64] / activation[32];
  const double want = ExpectedActivationBytes(64) / ExpectedActivationBytes(32);
  EXPECT_GT(ratio, 2.0) << "the attention scores grow with seq^2";
  EXPECT_NEAR(ratio / want, 1.0, 0.05) << "measured " << ratio << ", formula " << want;
}

int PortFrom(const std::string& file) {
  const auto j = nlohmann::json::parse(ReadText(file), nullptr, false);
  return j.is_discarded() ? 0 : j.value("metrics_port", 0);
}

std::string Get(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto res = c.Get(path.c_str());
  return res ? res->body : "";
}

// The value of an unlabelled gauge in a text exposition (-1 when absent).
double Gauge(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\n" + name + " ([0-9.e+]+)"))) return -1;
  return std::stod(m[1]);
}

TEST(MemoryEndToEnd, UpExportsStoresAndShowsThePeakPerRank) {
  ScopedTempDir dir("memory-up");
  const std::string d = dir.path();
  std::ofstream(d + "/spec.json") << SpecJson(MemoryParams(32, 100000));
  const int up =
      StartProcess({LATCHKEY_CLI_BIN, "up", "--spec", d + "/spec.json", "--run-dir", d + "/run"},
                   {"XDG_CONFIG_HOME=" + d}, d + "/up.log");
  const std::string steps = WaitForFile(
      d + "/run/steps-1.jsonl",
      [](const std::string& t) { return std::count(t.begin(), t.end(), '\n') >= 4; }, seconds(180));
  ASSERT_GE(std::count(steps.begin(), steps.end(), '\n'), 4) << ReadText(d + "/up.log");
  std::smatch m;
  const std::string log_so_far = ReadText(d + "/up.log");
  ASSERT_TRUE(std::regex_search(log_so_far, m, std::regex("\njob +([^ ]+) "))) << log_so_far;
  const std::string job = m[1];
  // The workers' gauges.
  for (int rank = 0; rank < 2; ++rank) {
    const int port = PortFrom(d + "/run/worker-" + std::to_string(rank) + ".port.json");
    ASSERT_GT(port, 0);
    const std::string metrics = Get(port, "/metrics");
    EXPECT_GT(Gauge(metrics, "latchkey_peak_memory_bytes"), 0) << metrics;
    EXPECT_GT(Gauge(metrics, "latchkey_activation_memory_bytes"), 0) << metrics;
    EXPECT_GE(Gauge(metrics, "latchkey_peak_memory_bytes"),
              Gauge(metrics, "latchkey_activation_memory_bytes"));
  }
  // The status page: each rank's peak of the last completed step, in MiB.
  const int coordinator = PortFrom(d + "/run/ports.json");
  ASSERT_GT(coordinator, 0);
  const std::string page = Get(coordinator, "/jobs/" + job);
  EXPECT_NE(page.find("peak memory MiB (last step)"), std::string::npos) << page;
  const std::regex cell("class=\"peak-memory\">([0-9.]+)</td>");
  int cells = 0;
  for (std::sregex_iterator it(page.begin(), page.end(), cell), end; it != end; ++it) {
    EXPECT_GT(std::stod((*it)[1]), 0.0) << page;
    ++cells;
  }
  EXPECT_EQ(cells, 2) << page;
  EXPECT_NE(page.find("MiB (largest rank)"), std::string::npos) << page;

  kill(up, SIGINT);
  WaitProcess(up, seconds(60));
  const std::string log = ReadText(d + "/up.log");
  EXPECT_TRUE(std::regex_search(log, std::regex("\n  peak memory, rank 0 +[0-9.]+ MiB"))) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("\n  peak memory, rank 1 +[0-9.]+ MiB"))) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("\n  activation memory \\(last step\\) +[0-9.]+")))
      << log;
  // The coordinator's database: every stored report of both ranks carries its memory.
  sqlite3* db = nullptr;
  ASSERT_EQ(
      sqlite3_open_v2((d + "/run/coordinator.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr),
      SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "SELECT COUNT(*), COUNT(DISTINCT rank), SUM(peak_memory_bytes >= "
                               "activation_memory_bytes AND activation_memory_bytes > 0), "
                               "SUM(reserved_memory_bytes) FROM step_reports WHERE job_id = ?",
                               -1, &st, nullptr),
            SQLITE_OK);
  sqlite3_bind_text(st, 1, job.c_str(), -1, SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  const int64_t rows = sqlite3_column_int64(st, 0);
  EXPECT_GE(rows, 8);  // 4 steps or more, 2 ranks
  EXPECT_EQ(sqlite3_column_int64(st, 1), 2);
  EXPECT_EQ(sqlite3_column_int64(st, 2), rows);
  EXPECT_EQ(sqlite3_column_int64(st, 3), 0);  // CPU ranks
  sqlite3_finalize(st);
  sqlite3_close(db);
}

}  // namespace
}  // namespace latchkey::testing
