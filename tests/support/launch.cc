#include "tests/support/launch.h"

#include <sys/types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "common/subprocess.h"
#include "tests/support/free_port.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

}  // namespace

std::string SourceDir() { return LATCHKEY_SOURCE_DIR; }
std::string FixtureDir() { return SourceDir() + "/testdata/gptbigcode-tiny"; }
std::string WorkerBinary() { return LATCHKEY_WORKER_BIN; }

bool WorkerRun::ok() const {
  for (int c : exit_codes) {
    if (c != 0) return false;
  }
  return !exit_codes.empty();
}

std::string WorkerRun::Describe() const {
  std::string out = "run in " + dir + ":";
  for (size_t r = 0; r < exit_codes.size(); ++r) {
    out += "\n  rank " + std::to_string(r) + " exit " + std::to_string(exit_codes[r]) + ": " +
           stderr_text[r];
  }
  return out;
}

WorkerRun RunWorkers(const nlohmann::json& spec, int world,
                     const std::vector<std::string>& extra_args, std::chrono::seconds deadline,
                     int local_world_size) {
  return WaitWorkers(StartWorkers(spec, world, extra_args, local_world_size), deadline);
}

std::string RankStderr(const WorkerGroup& group, int rank) {
  return ReadText(group.run.dir + "/stderr-" + std::to_string(rank) + ".txt");
}

WorkerGroup StartWorkers(const nlohmann::json& spec, int world,
                         const std::vector<std::string>& extra_args, int local_world_size) {
  WorkerGroup group;
  WorkerRun& run = group.run;
  run.dir = MakeTempDir("workers");
  std::ofstream(run.dir + "/spec.json") << spec.dump(2);
  const int port = FreePort();

  std::vector<pid_t> pids(world, -1);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {WorkerBinary(),    "--standalone",
                                     "--spec",          run.dir + "/spec.json",
                                     "--metrics-jsonl", run.dir + "/steps-{rank}.jsonl",
                                     "--quiet"};
    for (const std::string& a : extra_args) args.push_back(Replace(a, "{dir}", run.dir));
    // Our entries come first in the environment, so they win over inherited ones.
    const std::vector<std::string> env = {
        "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
        "LOCAL_WORLD_SIZE=" + std::to_string(local_world_size > 0 ? local_world_size : world),
        "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
    pids[r] = StartProcess(args, env, run.dir + "/stderr-" + std::to_string(r) + ".txt");
  }
  group.pids.assign(pids.begin(), pids.end());
  return group;
}

WorkerRun WaitWorkers(WorkerGroup group, std::chrono::seconds deadline) {
  WorkerRun run = std::move(group.run);
  std::vector<pid_t> pids(group.pids.begin(), group.pids.end());
  const int world = static_cast<int>(pids.size());
  run.exit_codes.assign(world, -1);
  const auto until = std::chrono::steady_clock::now() + deadline;
  int remaining = 0;
  for (pid_t p : pids) remaining += p > 0 ? 1 : 0;  // a rank that never started stays -1
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] <= 0) continue;
      if (std::optional<int> code = WaitFor(pids[r], std::chrono::milliseconds(0))) {
        run.exit_codes[r] = *code;
        pids[r] = 0;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > until) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] > 0) run.exit_codes[r] = WaitOrKill(pids[r], std::chrono::milliseconds(0));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  run.steps.resize(world);
  run.stderr_text.resize(world);
  for (int r = 0; r < world; ++r) {
    run.stderr_text[r] = ReadText(run.dir + "/stderr-" + std::to_string(r) + ".txt");
    std::ifstream in(run.dir + "/steps-" + std::to_string(r) + ".jsonl");
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) run.steps[r].push_back(nlohmann::json::parse(line));
    }
  }
  return run;
}

std::vector<nlohmann::json> StepRecords(const std::string& jsonl_path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(jsonl_path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step")) rows.push_back(std::move(j));
  }
  return rows;
}

std::vector<double> TensorValues(const StTensor& t) {
  std::vector<double> out(t.data.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    float f;
    std::memcpy(&f, t.data.data() + 4 * i, 4);
    out[i] = f;
  }
  return out;
}

std::map<std::string, std::vector<double>> TensorsOf(const std::string& path) {
  std::map<std::string, std::vector<double>> out;
  auto file = ReadSafetensorsFile(path);
  if (!file.ok()) return out;
  for (const StTensor& t : file->tensors) out[t.name] = TensorValues(t);
  return out;
}

double L2(const std::vector<double>& values) {
  double sq = 0.0;
  for (double v : values) sq += v * v;
  return std::sqrt(sq);
}

std::map<std::string, double> TensorNorms(const std::string& path) {
  std::map<std::string, double> out;
  for (const auto& [name, values] : TensorsOf(path)) out[name] = L2(values);
  return out;
}

double MaxWeightDiff(const std::string& a, const std::string& b) {
  auto fa = ReadSafetensorsFile(a);
  auto fb = ReadSafetensorsFile(b);
  if (!fa.ok() || !fb.ok()) return INFINITY;
  double d = 0.0;
  for (const StTensor& t : fa->tensors) {
    const StTensor* u = fb->Find(t.name);
    if (u == nullptr) return INFINITY;
    const auto x = TensorValues(t), y = TensorValues(*u);
    for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  }
  return d;
}

double MaxParamDiff(const WorkerRun& a, const WorkerRun& b) {
  return MaxWeightDiff(a.dir + "/final/model.safetensors", b.dir + "/final/model.safetensors");
}

}  // namespace latchkey::testing
