// What a layout-independent checkpoint refuses, and version 1, with real worker processes:
// replicas that disagree at save (a test hook flips one bit on one rank) fail the save with the
// tensor and the ranks named and commit nothing; a truncated piece is refused at load naming
// the file; `latchkey checkpoint inspect` exits 0 on a good checkpoint and 8 naming the file on
// a damaged one; a version 1 checkpoint resumes, and converted to version 2 resumes to exactly
// the same numbers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/rank_threads.h"
#include "tests/support/temp_dir.h"
#include "tests/training/reshard_support.h"
#include "worker/checkpoint/checkpoint_tools.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/tensor_bytes.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/process_groups.h"
#include "worker/model/param_store.h"
#include "worker/train/engine.h"
#include "worker/train/optimizer.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;

// One uninterrupted TP 2 x DP 2 run (fp32, dropout 0) shared by the tests of this file.
class CheckpointRefusal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { straight_ = new WorkerRun(RunWorkers(MatrixSpec({}), 4)); }
  static void TearDownTestSuite() {
    delete straight_;
    straight_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(straight_->ok()) << straight_->Describe(); }
  static std::string Src() { return straight_->dir + "/ckpt/step-00000002"; }
  // A copy of the step-2 checkpoint under `root` (root/step-00000002).
  static std::string CopyOfSrc(const std::string& root) {
    fs::create_directories(root);
    const std::string dst = root + "/step-00000002";
    fs::copy(Src(), dst, fs::copy_options::recursive);
    return dst;
  }
  static WorkerRun* straight_;
};
WorkerRun* CheckpointRefusal::straight_ = nullptr;

std::string AllStderr(const WorkerRun& run) {
  std::string out;
  for (const std::string& s : run.stderr_text) out += s;
  return out;
}

TEST_F(CheckpointRefusal, ReplicasThatDisagreeFailTheSaveNamingTheTensorAndRanks) {
  nlohmann::json spec = MatrixSpec({});
  spec["latchkey"]["steps"] = 3;
  const WorkerRun run = RunWorkers(spec, 4, {"--test-perturb-replica-rank", "1"});
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(run.exit_codes[r], 0) << run.Describe();
    EXPECT_NE(run.stderr_text[r].find("checkpoint after step 2: checkpoint of step 2: replicas "
                                      "of param/transformer.wte.weight"),
              std::string::npos)
        << run.stderr_text[r];
    EXPECT_NE(run.stderr_text[r].find("disagree: rank(s) "), std::string::npos);
  }
  // Rank 1 holds the flipped copy; ranks 0, 2, 3 agree.
  const std::string all = AllStderr(run);
  EXPECT_NE(all.find("rank(s) 0,2,3 hold"), std::string::npos) << all;
  EXPECT_NE(all.find("rank(s) 1 hold"), std::string::npos) << all;
  EXPECT_FALSE(fs::exists(run.dir + "/ckpt/step-00000002/manifest.json"));
}

TEST_F(CheckpointRefusal, TruncatedPieceIsRefusedAtLoadNamingTheFile) {
  const ScopedTempDir dir("reshard-trunc");
  const std::string step = CopyOfSrc(dir / "ckpt");
  const std::string victim = step + "/rank-00001.safetensors";
  const auto size = fs::file_size(victim);
  fs::resize_file(victim, size - 100);
  // Processes: the resume fails, naming the file.
  const WorkerRun run =
      RunWorkers(MatrixSpec({1, 1, 1, false, 0.0, 4}), 1, {"--resume-from", step});
  EXPECT_EQ(run.exit_codes[0], 1) << run.Describe();  // the run's error, not a usage error
  EXPECT_NE(run.stderr_text[0].find("--resume-from: "), std::string::npos) << run.stderr_text[0];
  EXPECT_NE(run.stderr_text[0].find("rank-00001.safetensors"), std::string::npos)
      << run.stderr_text[0];
  // In process: DATA_LOSS, also when the manifest is edited to the truncated size (the pieces
  // past the end cannot be read).
  absl::StatusOr<JobSpec> spec = ParseJobSpec(MatrixSpec({1, 1, 1}).dump(), dir.path());
  ASSERT_TRUE(spec.ok()) << spec.status();
  nlohmann::json manifest = nlohmann::json::parse(*ReadWholeFile(step + "/manifest.json"));
  for (int edited = 0; edited < 2; ++edited) {
    if (edited == 1) {
      manifest["files"][1]["bytes"] = size - 100;
      ASSERT_TRUE(WriteFileAtomically(step + "/manifest.json", manifest.dump(2)).ok());
    }
    ConfigureComputeThreads(1);
    RunRankThreads(1, 1, [&](comm::ProcessGroups& g) {
      auto engine = CreateEngine(*spec, &g);
      ASSERT_TRUE(engine.ok()) << engine.status();
      absl::Status st = LoadTrainingCheckpoint((*engine)->state(), step, "", "");
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
      EXPECT_NE(st.message().find("rank-00001.safetensors"), std::string::npos) << st;
      if (edited == 1) {
        EXPECT_NE(st.message().find("truncated"), std::string::npos) << st;
      }
    });
  }
}

#ifdef LATCHKEY_CLI_BIN
TEST_F(CheckpointRefusal, InspectVerifiesEveryChecksumExit8NamingTheFile) {
  const Captured good = RunAndCapture({LATCHKEY_CLI_BIN, "checkpoint", "inspect", Src()});
  EXPECT_EQ(good.exit_code, 0) << good.output;
  for (const char* want :
       {"format latchkey-checkpoint/2", "step 2", "tp 2 x dp 2", "zero_stage 1",
        "optimizer AdamW (step 3)", "param/transformer.wte.weight F32 [256, 64] 65536 bytes",
        "exp_avg_sq/transformer.ln_f.bias", "rank-00003.safetensors", "every piece's SHA-256"}) {
    EXPECT_NE(good.output.find(want), std::string::npos) << want << "\n" << good.output;
  }
  const ScopedTempDir dir("reshard-inspect");
  const std::string step = CopyOfSrc(dir / "ckpt");
  const std::string victim = step + "/rank-00002.safetensors";
  std::string bytes = *ReadWholeFile(victim);
  bytes[bytes.size() - 5] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomically(victim, bytes).ok());
  const Captured bad = RunAndCapture({LATCHKEY_CLI_BIN, "checkpoint", "inspect", step});
  EXPECT_EQ(bad.exit_code, 8) << bad.output;
  EXPECT_NE(bad.output.find("DATA_LOSS"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("rank-00002.safetensors"), std::string::npos) << bad.output;
  const Captured missing = RunAndCapture({LATCHKEY_CLI_BIN, "checkpoint", "inspect", dir / "no"});
  EXPECT_EQ(missing.exit_code, 4) << missing.output;
}
#endif

// Writes the state of `state` as version 1 wrote it (one flat file per rank) into `temp`.
CheckpointFileEntry WriteVersion1File(const TrainingState& s, const std::string& temp) {
  const comm::ProcessGroups& g = *s.groups;
  ParamStore& store = *s.params;
  StFile f;
  const at::Tensor& flat = s.bf16() ? store.flat_compute() : store.flat_params();
  f.tensors.push_back(
      RawStTensor("params", flat.narrow(0, 0, store.numel()).to(at::kFloat), StDtype::kF32));
  if (s.bf16()) f.tensors.push_back(RawStTensor("master", s.master, StDtype::kF32));
  for (const auto& [name, t] : s.optimizer->state()) {
    f.tensors.push_back(RawStTensor("optimizer." + name, t, StDtype::kF32));
  }
  // Version 1 carried generator states; a load ignores them.
  f.tensors.push_back(StTensor{"rng.local", StDtype::kU8, {4}, std::string("\1\2\3\4", 4)});
  f.metadata = {{"rank", std::to_string(g.rank)},
                {"tp_rank", std::to_string(g.tp_rank)},
                {"dp_rank", std::to_string(g.dp_rank)},
                {"step", std::to_string(s.position.step)},
                {"optimizer_step", std::to_string(s.optimizer->steps())}};
  absl::StatusOr<CheckpointFileEntry> e = WriteCheckpointRankFile(temp, g.rank, f);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : CheckpointFileEntry{};
}

TEST_F(CheckpointRefusal, Version1ResumesAndConvertedResumesToTheSameNumbers) {
  const ScopedTempDir dir("reshard-v1");
  // The step-2 state, loaded into a TP 2 x DP 2 engine and written as version 1.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(MatrixSpec({}).dump(), dir.path());
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string temp = dir / "v1/.step-00000002.a1.tmp";
  std::vector<CheckpointFileEntry> files(4);
  ConfigureComputeThreads(4);
  RunRankThreads(4, 2, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(*spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE(LoadTrainingCheckpoint((*engine)->state(), Src(), "", "").ok());
    files[g.rank] = WriteVersion1File((*engine)->state(), temp);
  });
  absl::StatusOr<CheckpointManifest> v2 = VerifyCheckpoint(Src(), "");
  ASSERT_TRUE(v2.ok()) << v2.status();
  CheckpointManifest v1 = *v2;
  v1.version = 1;
  v1.tensors.clear();
  v1.files = files;
  ASSERT_TRUE(CommitCheckpoint(dir / "v1", temp, v1).ok());
  const std::string v1_step = dir / "v1/step-00000002";
  EXPECT_NE(ReadWholeFile(v1_step + "/manifest.json")->find("latchkey-checkpoint/1"),
            std::string::npos);
  // Its logical tensors are the version 2 checkpoint's, byte for byte.
  EXPECT_TRUE(LogicalTensors(v1_step) == LogicalTensors(Src()));
  absl::StatusOr<std::string> converted = ConvertCheckpoint(v1_step, dir / "v2");
  ASSERT_TRUE(converted.ok()) << converted.status();
  EXPECT_TRUE(LogicalTensors(*converted) == LogicalTensors(Src()));
  const std::vector<nlohmann::json>& want = straight_->steps[0];
  // Resumed at TP 2 x DP 2 from each, and at TP 1 x DP 1 from version 1.
  const WorkerRun from_v1 = RunWorkers(MatrixSpec({}), 4, {"--resume-from", v1_step});
  const WorkerRun from_converted = RunWorkers(MatrixSpec({}), 4, {"--resume-from", *converted});
  const WorkerRun v1_tp1 =
      RunWorkers(MatrixSpec({1, 1, 1, false, 0.0, 4}), 1, {"--resume-from", v1_step});
  ASSERT_TRUE(from_v1.ok()) << from_v1.Describe();
  ASSERT_TRUE(from_converted.ok()) << from_converted.Describe();
  ASSERT_TRUE(v1_tp1.ok()) << v1_tp1.Describe();
  ASSERT_EQ(from_v1.steps[0].size(), 3u);
  ASSERT_EQ(from_converted.steps[0].size(), 3u);
  ASSERT_EQ(v1_tp1.steps[0].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& a = from_v1.steps[0][i];
    const nlohmann::json& b = from_converted.steps[0][i];
    EXPECT_EQ(a["step"], 3 + i);
    EXPECT_EQ(a["loss"].get<double>(), b["loss"].get<double>()) << "step " << 3 + i;
    EXPECT_EQ(a["grad_norm"].get<double>(), b["grad_norm"].get<double>()) << "step " << 3 + i;
    EXPECT_LE(RelativeDeviation(a["loss"], want[3 + i]["loss"]), 1e-5);
    EXPECT_LE(RelativeDeviation(v1_tp1.steps[0][i]["loss"], want[3 + i]["loss"]), 1e-5);
    EXPECT_LE(RelativeDeviation(v1_tp1.steps[0][i]["grad_norm"], want[3 + i]["grad_norm"]), 1e-5);
  }
  // Converting twice is refused: it is version 2 already.
  EXPECT_EQ(ConvertCheckpoint(*converted, dir / "v3").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace latchkey::testing
