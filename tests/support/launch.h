// Starts N real latchkey-worker processes (torchrun-style env) for multi-process tests and
// collects what they wrote. Every run has a deadline; stragglers are killed.
#ifndef LATCHKEY_TESTS_SUPPORT_LAUNCH_H_
#define LATCHKEY_TESTS_SUPPORT_LAUNCH_H_

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/checkpoint/safetensors.h"

namespace latchkey::testing {

struct WorkerRun {
  std::string dir;                                 // scratch folder of this run
  std::vector<int> exit_codes;                     // per rank (-1: killed at the deadline)
  std::vector<std::vector<nlohmann::json>> steps;  // per rank, the JSONL records
  std::vector<std::string> stderr_text;            // per rank
  bool ok() const;
  std::string Describe() const;  // exit codes and stderr, for assertion messages
};

// Writes `spec` to <dir>/spec.json and runs `world` ranks of
//   latchkey-worker --standalone --spec spec.json --metrics-jsonl steps-{rank}.jsonl --quiet ARGS
// `extra_args` may contain "{dir}" (replaced by the run folder). `local_world_size` (0: world)
// is the LOCAL_WORLD_SIZE the ranks are given: it sets their compute threads (the usable cores
// / it), on which ATen's and OpenBLAS's float32 rounding depends.
WorkerRun RunWorkers(const nlohmann::json& spec, int world,
                     const std::vector<std::string>& extra_args = {},
                     std::chrono::seconds deadline = std::chrono::seconds(300),
                     int local_world_size = 0);

// The same in two halves, for tests that talk to the ranks while they run.
struct WorkerGroup {
  WorkerRun run;
  std::vector<int> pids;
};
WorkerGroup StartWorkers(const nlohmann::json& spec, int world,
                         const std::vector<std::string>& extra_args = {}, int local_world_size = 0);
// Waits for every rank (killing stragglers at the deadline) and collects the outputs.
WorkerRun WaitWorkers(WorkerGroup group, std::chrono::seconds deadline = std::chrono::seconds(300));
// The stderr a rank has written so far.
std::string RankStderr(const WorkerGroup& group, int rank);

// The step records of a steps JSONL (docs/observability.md), in file order: each line that is a
// JSON object with a "step"; a line a writer has not finished yet is skipped.
std::vector<nlohmann::json> StepRecords(const std::string& jsonl_path);
// Every tensor of a safetensors file of F32 tensors, as doubles (empty if it does not read).
std::map<std::string, std::vector<double>> TensorsOf(const std::string& safetensors_path);
// L2 norm (fp64) of every tensor of such a file.
std::map<std::string, double> TensorNorms(const std::string& safetensors_path);
double L2(const std::vector<double>& values);
// F32 tensor data as doubles.
std::vector<double> TensorValues(const StTensor& t);
// Largest absolute difference between the tensors of two safetensors files of F32 tensors; +Inf
// when either does not read or a tensor of `a` is missing from `b`.
double MaxWeightDiff(const std::string& a, const std::string& b);
// The same for the final weights of two runs (each saved with --save {dir}/final).
double MaxParamDiff(const WorkerRun& a, const WorkerRun& b);

std::string SourceDir();
std::string FixtureDir();    // testdata/gptbigcode-tiny
std::string WorkerBinary();  // the latchkey-worker this build made

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_LAUNCH_H_
