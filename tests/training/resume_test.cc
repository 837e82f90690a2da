// Resuming from a checkpoint is bit-exact: a run that saves after step 2 and continues in brand
// new process groups and a brand new engine (loaded from the checkpoint alone) reports the same
// losses and gradient norms and ends with byte-identical parameters, optimizer state and master
// as an uninterrupted run; for DP 2 x TP 2 with clipping under ZeRO-1 AdamW (fp32 and bf16) and
// ZeRO-0 (SGD fp32, AdamW bf16), each without dropout and with dropout 0.1 (a checkpoint carries
// the seed, not generator states: with dropout this holds where masks are a function of the
// seed and the stream position, docs/model.md). A damaged checkpoint, and one of another job or
// optimizer, are refused; one of another layout loads. The engine's straggler measure
// (boundary_wait_seconds) is checked here too. Ranks run as threads (tests/support/rank_threads.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "common/latch.h"
#include "tests/support/launch.h"
#include "tests/support/rank_threads.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/flight_recorder.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace latchkey::testing {
namespace {

constexpr int kWorld = 4;
constexpr int kTp = 2;
constexpr int kSteps = 6;
constexpr int64_t kSaveAfter = 2;

struct Variant {
  const char* name;
  bool bf16;
  int zero;
  const char* optimizer;
  double dropout = 0.1;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

JobSpec MakeSpec(const Variant& v, int tp = kTp, int world = kWorld) {
  SpecParams p;  // synthetic data
  p.tp = tp;
  p.world_size = world;
  p.clip = 0.5;
  p.steps = kSteps;
  p.seed = 7;
  p.zero_stage = v.zero;
  p.optimizer = v.optimizer;
  p.lr = std::string(v.optimizer) == "SGD" ? 0.05 : 0.001;
  p.model["resid_pdrop"] = v.dropout;
  p.model["attn_pdrop"] = v.dropout;
  p.model["embd_pdrop"] = v.dropout;
  nlohmann::json spec = SpecObject(p);
  if (v.bf16) spec["bf16"] = {{"enabled", true}};
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(spec.dump(), "/");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

// latch(window) as a standalone gate makes it: first_sample is the stream position of M_s.
Latch LatchFor(const JobSpec& spec, int64_t window) {
  Latch l = DecideLatch(spec, InitialPolicy(spec), window, spec.FirstMicroBatch(window));
  l.first_sample = l.first_micro_batch * (spec.world_size / spec.tp) * spec.micro_batch_size;
  return l;
}

// What every rank reported, by rank then step.
struct Reports {
  std::mutex mu;
  std::map<int, std::map<int64_t, StepReport>> by_rank;
  std::map<int, CheckpointCommit> commits;

  void Add(int rank, const StepReport& r) {
    std::lock_guard<std::mutex> lock(mu);
    by_rank[rank][r.step] = r;
  }
};

// Runs windows [from, to) on `engine`, recording the reports.
void RunWindows(Engine& engine, const JobSpec& spec, int rank, int64_t from, int64_t to,
                Reports& out) {
  for (int64_t s = from; s < to; ++s) {
    absl::StatusOr<StepReport> r = engine.RunWindow(LatchFor(spec, s));
    ASSERT_TRUE(r.ok()) << "rank " << rank << " step " << s << ": " << r.status();
    EXPECT_GE(r->boundary_wait_seconds, 0.0);
    out.Add(rank, *r);
  }
}

// Saves after window `step` on every rank; records each rank's commit.
void Save(Engine& engine, comm::ProcessGroups& g, const JobSpec& spec, const std::string& root,
          int64_t step, Reports& out) {
  ASSERT_EQ(engine.state().position.step, step);
  ASSERT_EQ(engine.state().position.next_first_micro_batch, spec.FirstMicroBatch(step + 1));
  TrainingCheckpointRequest req;
  req.root = root;
  absl::StatusOr<CheckpointCommit> c = SaveTrainingCheckpoint(engine.state(), req);
  ASSERT_TRUE(c.ok()) << "rank " << g.rank << ": " << c.status();
  std::lock_guard<std::mutex> lock(out.mu);
  out.commits[g.rank] = *c;
}

// The tensors of every rank file of a committed checkpoint: "rank/tensor" -> bytes.
std::map<std::string, std::string> StateBytes(const std::string& step_dir) {
  std::map<std::string, std::string> out;
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<StFile> f = ReadCheckpointRankFile(step_dir, r);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) continue;
    for (const StTensor& t : f->tensors) out[std::to_string(r) + "/" + t.name] = t.data;
  }
  return out;
}

class Resume : public ::testing::TestWithParam<Variant> {
 protected:
  static void SetUpTestSuite() { ConfigureComputeThreads(kWorld); }
};

TEST_P(Resume, SaveLoadAndContinueIsBitExact) {
  const JobSpec spec = MakeSpec(GetParam());
  const ScopedTempDir dir("resume");
  // Uninterrupted: steps 0..5, then the final state (HF weights and a checkpoint).
  Reports straight;
  RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    RunWindows(**engine, spec, g.rank, 0, kSteps, straight);
    ASSERT_TRUE(SaveHfCheckpoint((*engine)->state(), dir / "straight-hf").ok());
    Save(**engine, g, spec, dir / "straight", kSteps - 1, straight);
  });
  // Interrupted: steps 0..2 and a checkpoint; the engine and groups are then destroyed.
  Reports first;
  RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    RunWindows(**engine, spec, g.rank, 0, kSaveAfter + 1, first);
    Save(**engine, g, spec, dir / "ckpt", kSaveAfter, first);
  });
  ASSERT_EQ(first.commits.size(), static_cast<size_t>(kWorld));
  const CheckpointCommit commit = first.commits[0];
  for (const auto& [rank, c] : first.commits) {
    EXPECT_EQ(c.manifest_sha256, commit.manifest_sha256) << "rank " << rank;
    EXPECT_EQ(c.dir, commit.dir) << "rank " << rank;
    EXPECT_EQ(c.bytes, commit.bytes) << "rank " << rank;
  }
  EXPECT_EQ(commit.dir, dir / "ckpt/step-00000002");
  absl::StatusOr<CheckpointManifest> manifest = VerifyCheckpoint(commit.dir, "");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->job_id, "standalone");
  EXPECT_EQ(manifest->next_window, 3);
  EXPECT_EQ(manifest->next_first_micro_batch, spec.FirstMicroBatch(3));
  EXPECT_EQ(manifest->dp, 2);
  EXPECT_EQ(manifest->version, 2);
  EXPECT_EQ(manifest->optimizer_step, 3);
  EXPECT_EQ(manifest->seed, 7u);
  EXPECT_EQ(manifest->next_first_sample,
            spec.FirstMicroBatch(3) * manifest->dp * spec.micro_batch_size);
  // Rank 3 is dp_rank 1, tp_rank 1; its file holds only F32 pieces of logical tensors.
  absl::StatusOr<StFile> rank3 = ReadCheckpointRankFile(commit.dir, 3);
  ASSERT_TRUE(rank3.ok()) << rank3.status();
  EXPECT_EQ(rank3->metadata.at("rank"), "3");
  EXPECT_EQ(rank3->metadata.at("tp_rank"), "1");
  EXPECT_EQ(rank3->metadata.at("dp_rank"), "1");
  EXPECT_EQ(rank3->metadata.at("step"), "2");
  ASSERT_FALSE(rank3->tensors.empty());
  for (const StTensor& t : rank3->tensors) {
    EXPECT_EQ(t.dtype, StDtype::kF32) << t.name;
    EXPECT_EQ(t.name.rfind("rng", 0), std::string::npos) << t.name;
  }
  // Every parameter as param/*, and with AdamW exp_avg/* and exp_avg_sq/*, each tiled by its
  // pieces in global index space.
  std::map<std::string, int> kinds;
  for (const CheckpointTensor& t : manifest->tensors) {
    ++kinds[t.kind];
    int64_t full = 1, covered = 0;
    for (int64_t d : t.shape) full *= d;
    for (const CheckpointPiece& p : t.pieces) {
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      covered += n;
      EXPECT_EQ(p.sha256.size(), 64u);
    }
    EXPECT_EQ(covered, full) << t.kind << "/" << t.param;
  }
  const int n_params = 2 + 12 * spec.model.n_layer + 2;
  EXPECT_EQ(kinds["param"], n_params);
  const bool adamw = std::string(GetParam().optimizer) == "AdamW";
  EXPECT_EQ(kinds["exp_avg"], adamw ? n_params : 0);
  EXPECT_EQ(kinds["exp_avg_sq"], adamw ? n_params : 0);
  int64_t total = 0;
  for (const CheckpointFileEntry& f : manifest->files) total += f.bytes;
  EXPECT_EQ(total, commit.bytes);
  // Resumed: new groups, a new engine that loads the checkpoint, steps 3..5.
  Reports resumed;
  RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
    g.recorder = std::make_shared<comm::FlightRecorder>();
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::Status st = LoadTrainingCheckpoint((*engine)->state(), commit.dir, "standalone",
                                             commit.manifest_sha256);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(g.recorder->Snapshot().phase, RankPhase::kCheckpoint);
    RunWindows(**engine, spec, g.rank, kSaveAfter + 1, kSteps, resumed);
    const RankPosition pos = g.recorder->Snapshot();
    EXPECT_EQ(pos.window, kSteps - 1);
    EXPECT_EQ(pos.micro_batch, LatchFor(spec, kSteps - 1).n - 1);
    ASSERT_TRUE(SaveHfCheckpoint((*engine)->state(), dir / "resumed-hf").ok());
    Save(**engine, g, spec, dir / "resumed", kSteps - 1, resumed);
  });
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t s = 0; s < kSteps; ++s) {
      const StepReport& want = straight.by_rank[r].at(s);
      const StepReport& got = s <= kSaveAfter ? first.by_rank[r].at(s) : resumed.by_rank[r].at(s);
      EXPECT_EQ(got.loss, want.loss) << "rank " << r << " step " << s;
      EXPECT_EQ(got.grad_norm, want.grad_norm) << "rank " << r << " step " << s;
      EXPECT_EQ(got.lr, want.lr) << "rank " << r << " step " << s;
    }
  }
  // The losses move from step to step.
  EXPECT_NE(straight.by_rank[0].at(3).loss, straight.by_rank[0].at(4).loss);
  const std::string a = *ReadWholeFile(dir / "straight-hf/model.safetensors");
  const std::string b = *ReadWholeFile(dir / "resumed-hf/model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "final weights differ";
  const auto want = StateBytes(dir / "straight/step-00000005");
  const auto got = StateBytes(dir / "resumed/step-00000005");
  ASSERT_EQ(want.size(), got.size());
  // Every piece of every logical tensor (params, AdamW's two moments), each stored once.
  auto written = ReadCheckpointManifest(dir / "straight/step-00000005", "");
  ASSERT_TRUE(written.ok()) << written.status();
  size_t pieces = 0;
  for (const CheckpointTensor& t : written->tensors) pieces += t.pieces.size();
  const size_t n_kinds = std::string(GetParam().optimizer) == "AdamW" ? 3 : 1;
  EXPECT_GE(pieces, n_kinds * (2 + 12 * spec.model.n_layer + 2));
  EXPECT_EQ(want.size(), pieces);
  for (const auto& [name, bytes] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Resume,
                         ::testing::Values(Variant{"zero1_adamw_fp32", false, 1, "AdamW", 0.0},
                                           Variant{"zero1_adamw_bf16", true, 1, "AdamW", 0.0},
                                           Variant{"zero0_sgd_fp32", false, 0, "SGD", 0.0},
                                           Variant{"zero0_adamw_bf16", true, 0, "AdamW", 0.0},
                                           Variant{"zero1_adamw_fp32_dropout", false, 1, "AdamW"},
                                           Variant{"zero1_adamw_bf16_dropout", true, 1, "AdamW"},
                                           Variant{"zero0_sgd_fp32_dropout", false, 0, "SGD"},
                                           Variant{"zero0_adamw_bf16_dropout", true, 0, "AdamW"}),
                         [](const auto& info) { return std::string(info.param.name); });

// A checkpoint after step 0 of the fp32 ZeRO-1 AdamW job, under `root`; with `hf_dir`, its
// weights exported there too.
CheckpointCommit SaveOneStep(const std::string& root, const std::string& hf_dir = "") {
  const JobSpec spec = MakeSpec(Variant{"zero1", false, 1, "AdamW"});
  Reports reports;
  RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    RunWindows(**engine, spec, g.rank, 0, 1, reports);
    Save(**engine, g, spec, root, 0, reports);
    if (!hf_dir.empty()) {
      ASSERT_TRUE(SaveHfCheckpoint((*engine)->state(), hf_dir).ok());
    }
  });
  return reports.commits[0];
}

// Every rank's LoadTrainingCheckpoint status for `spec` on a dp x tp grid; with `hf_dir`, the
// loaded weights exported there (every rank takes part; only when every rank loaded).
std::vector<absl::Status> LoadEverywhere(const JobSpec& spec, int tp, const std::string& step_dir,
                                         const std::string& job_id = "",
                                         const std::string& hf_dir = "") {
  std::vector<absl::Status> out(kWorld);
  RunRankThreads(kWorld, tp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    out[g.rank] = LoadTrainingCheckpoint((*engine)->state(), step_dir, job_id, "");
    if (!hf_dir.empty() && out[g.rank].ok()) {
      ASSERT_TRUE(SaveHfCheckpoint((*engine)->state(), hf_dir).ok());
    }
  });
  return out;
}

// The tensors of an exported model.safetensors, exactly equal to the saved run's.
void ExpectSameWeights(const std::string& want_hf, const std::string& got_hf) {
  const auto want = TensorsOf(want_hf + "/model.safetensors");
  const auto got = TensorsOf(got_hf + "/model.safetensors");
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, values] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    EXPECT_TRUE(got.at(name) == values) << name << " loaded other values";
  }
}

TEST(ResumeRefusal, CorruptedRankFileIsDataLoss) {
  ConfigureComputeThreads(kWorld);
  const ScopedTempDir dir("resume");
  const CheckpointCommit c = SaveOneStep(dir / "ckpt");
  // A flipped byte inside a piece every rank reads (the replicated embedding's weights): every
  // rank checks that piece's SHA-256 and refuses, naming its file.
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(c.dir, "");
  ASSERT_TRUE(m.ok()) << m.status();
  const CheckpointPiece* piece = nullptr;
  for (const CheckpointTensor& t : m->tensors) {
    if (t.kind == "param" && t.param == "transformer.wte.weight") piece = &t.pieces[0];
  }
  ASSERT_NE(piece, nullptr);
  const std::string victim = c.dir + "/" + piece->file;
  std::string bytes = *ReadWholeFile(victim);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(bytes[i]);
  const nlohmann::json entries = nlohmann::json::parse(bytes.substr(8, header));
  const int64_t at = 8 + header + entries.at(piece->key).at("data_offsets")[0].get<int64_t>();
  bytes[at + 17] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(victim, bytes).ok());
  const JobSpec spec = MakeSpec(Variant{"zero1", false, 1, "AdamW"});
  for (const absl::Status& st : LoadEverywhere(spec, kTp, c.dir)) {
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find(piece->file), std::string::npos) << st;
  }
  // And it is never chosen as the one to resume from.
  absl::StatusOr<std::optional<FoundCheckpoint>> newest = NewestValidCheckpoint(dir / "ckpt", "");
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_FALSE(newest->has_value());
}

TEST(ResumeRefusal, AnotherJobOrOptimizerIsRefusedNamingTheFieldAnotherLayoutLoads) {
  ConfigureComputeThreads(kWorld);
  const ScopedTempDir dir("resume");
  const CheckpointCommit c = SaveOneStep(dir / "ckpt", dir / "saved-hf");
  // DP 4 x TP 1 and ZeRO-0: same world size, another layout; each loads the saved weights.
  for (const absl::Status& st :
       LoadEverywhere(MakeSpec({"tp1", false, 1, "AdamW"}, 1), 1, c.dir, "", dir / "tp1-hf")) {
    EXPECT_TRUE(st.ok()) << st;
  }
  ExpectSameWeights(dir / "saved-hf", dir / "tp1-hf");
  for (const absl::Status& st :
       LoadEverywhere(MakeSpec({"z0", false, 0, "AdamW"}), kTp, c.dir, "", dir / "z0-hf")) {
    EXPECT_TRUE(st.ok()) << st;
  }
  ExpectSameWeights(dir / "saved-hf", dir / "z0-hf");
  for (const absl::Status& st : LoadEverywhere(MakeSpec({"sgd", false, 1, "SGD"}), kTp, c.dir)) {
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("optimizer AdamW, this job has SGD"), std::string::npos) << st;
  }
  const JobSpec same = MakeSpec({"zero1", false, 1, "AdamW"});
  for (const absl::Status& st : LoadEverywhere(same, kTp, c.dir, "job-other")) {
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("job_id standalone, this job has job-other"), std::string::npos)
        << st;
  }
  // A manifest SHA-256 other than the committed one.
  std::string wrong = c.manifest_sha256;
  wrong[5] = wrong[5] == 'a' ? 'b' : 'a';
  RunRankThreads(kWorld, kTp, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(same, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::Status st = LoadTrainingCheckpoint((*engine)->state(), c.dir, "standalone", wrong);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_TRUE(
        LoadTrainingCheckpoint((*engine)->state(), c.dir, "standalone", c.manifest_sha256).ok());
  });
}

// The straggler measure: a DP rank that starts its window late makes the other wait in the
// window's first boundary collective (the ZeRO-1 reduce-scatter; DP 2 x TP 1, every micro-batch
// but the last no_sync, so nothing meets before it).
TEST(EngineBoundary, BoundaryWaitIsTheTimeSpentWaitingForTheLateRank) {
  ConfigureComputeThreads(2);
  const JobSpec spec = MakeSpec(Variant{"dp2", false, 1, "AdamW"}, /*tp=*/1, /*world=*/2);
  std::vector<StepReport> reports(2);
  RunRankThreads(2, 1, [&](comm::ProcessGroups& g) {
    auto engine = CreateEngine(spec, &g);
    ASSERT_TRUE(engine.ok()) << engine.status();
    if (g.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    absl::StatusOr<StepReport> r = (*engine)->RunWindow(LatchFor(spec, 0));
    ASSERT_TRUE(r.ok()) << r.status();
    reports[g.rank] = *r;
  });
  EXPECT_GE(reports[0].boundary_wait_seconds, 0.5);
  EXPECT_LT(reports[1].boundary_wait_seconds, reports[0].boundary_wait_seconds);
  EXPECT_LT(reports[0].boundary_wait_seconds, reports[0].step_seconds);
}

}  // namespace
}  // namespace latchkey::testing
