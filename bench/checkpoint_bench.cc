// Resumable checkpoints: size, save time, training time blocked and load time, for the demo model
// (client/cli/builtin_spec.h: 4 layers, n_embd 128) and a 24-layer n_embd 256 model (n_head 8,
// MQA), on 4 ranks (DP 2 x TP 2, ZeRO-1, AdamW, seq 128, micro-batch 1), standalone.
//
//   bench_checkpoint [--reps N] [--dir DIR]
//
// Started without RANK it launches itself once per rank (RANK/WORLD_SIZE/MASTER_PORT env, all
// ranks on this machine) and rank 0 prints the table. Per model: one engine trains, a second one
// (built the same way) loads; each repetition runs one window, saves the checkpoint after it
// (SaveTrainingCheckpoint of the first engine's state: the collective commit) and loads it into
// the second one's (LoadTrainingCheckpoint: verification of every file's SHA-256 included).
// The first repetition is warm-up. Times are rank 0's (it also writes the manifest and commits):
//   save s     wall time of the SaveTrainingCheckpoint call;
//   blocked s  the training time the save blocked (CheckpointCommit::blocked_seconds, the JSONL's
//              checkpoint_seconds; the save is synchronous, so it is the save's time as the
//              engine measures it);
//   load s     wall time of LoadTrainingCheckpoint.
// Size: all ranks' files of one checkpoint.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/self_ranks.h"
#include "bench/stats.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "tests/support/tiny_model.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/comm/process_groups.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace {

constexpr int kWorld = 4;
constexpr int kTp = 2;

using Clock = std::chrono::steady_clock;
using latchkey::bench::Max;
using latchkey::bench::Median;
using latchkey::bench::Min;

struct Model {
  const char* name;
  int layers, embd, heads, positions;
};

// The demo's model block (builtin_spec.h), and the larger one.
const Model kModels[] = {{"demo (4 x 128)", 4, 128, 8, 128}, {"24 x 256", 24, 256, 8, 128}};

latchkey::JobSpec Spec(const Model& m, const std::string& root) {
  latchkey::JobSpec s;
  s.model = latchkey::testing::SmallModel(m.layers, m.embd, m.heads, m.positions);
  s.micro_batch_size = 1;
  s.gradient_accumulation_steps = 1;
  s.zero_stage = 1;
  s.optimizer.type = latchkey::OptimizerType::kAdamW;
  s.optimizer.lr = 0.001;
  s.tp = kTp;
  s.world_size = kWorld;
  s.seq_len = m.positions;
  s.steps = 1000;
  s.data.synthetic_seed = 1;
  s.checkpoint.dir = root;
  s.checkpoint.every_steps = 1;
  s.checkpoint.keep = 1;
  return s;
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "bench_checkpoint: %s\n", std::string(st.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--reps") {
      reps = std::atoi(v.c_str());
    } else if (k == "--dir") {
      dir = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  if (std::getenv("RANK") == nullptr) {
    if (dir.empty()) {
      char tmpl[] = "/tmp/latchkey-bench-checkpoint-XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) return 1;
      const std::vector<std::string> extra = {"--dir", tmpl};
      std::vector<char*> args(argv, argv + argc);
      for (const std::string& e : extra) args.push_back(const_cast<char*>(e.c_str()));
      const int rc =
          latchkey::bench::RunSelfAsRanks(static_cast<int>(args.size()), args.data(), kWorld);
      std::filesystem::remove_all(tmpl);
      return rc;
    }
    return latchkey::bench::RunSelfAsRanks(argc, argv, kWorld);
  }
  const int rank = std::atoi(std::getenv("RANK"));
  const int threads = latchkey::ConfigureComputeThreads(kWorld);
  latchkey::comm::RendezvousConfig rdv;
  rdv.port = std::atoi(std::getenv("MASTER_PORT"));
  rdv.rank = rank;
  rdv.world_size = kWorld;
  rdv.tp = kTp;
  auto groups = latchkey::comm::CreateProcessGroups(latchkey::CommBackend::kAuto, rdv);
  if (!groups.ok()) return Fail(groups.status());
  if (rank == 0) {
    std::printf(
        "Resumable checkpoints: DP 2 x TP 2, ZeRO-1, AdamW, fp32, seq 128, micro-batch 1, %d "
        "compute thread(s) per rank, %d measured repetitions after one warm-up; rank 0's times, "
        "median (min-max)\n\n",
        threads, reps);
    std::printf("| model | checkpoint bytes | save s | blocked s | load s |\n");
    std::printf("|---|---|---|---|---|\n");
  }
  for (const Model& model : kModels) {
    const std::string root =
        dir + "/" + std::to_string(model.layers) + "x" + std::to_string(model.embd);
    const latchkey::JobSpec spec = Spec(model, root);
    auto trainer = latchkey::CreateEngine(spec, &*groups);
    if (!trainer.ok()) return Fail(trainer.status());
    auto loader = latchkey::CreateEngine(spec, &*groups);
    if (!loader.ok()) return Fail(loader.status());
    const latchkey::LatchPolicy policy = latchkey::InitialPolicy(spec);
    std::vector<double> save, blocked, load;
    int64_t bytes = 0;
    int64_t m = 0;
    for (int rep = 0; rep <= reps; ++rep) {
      const latchkey::Latch latch = latchkey::DecideLatch(spec, policy, rep, m);
      m += latch.n;
      auto report = (*trainer)->RunWindow(latch);
      if (!report.ok()) return Fail(report.status());
      latchkey::TrainingCheckpointRequest req;
      req.root = root;
      req.job_id = "standalone";
      req.job_uid = "00000000b0b0b0b0";  // one job: every rank the same, pruned as its own
      req.compute_threads = threads;
      const auto t0 = Clock::now();
      auto commit = latchkey::SaveTrainingCheckpoint((*trainer)->state(), req);
      const double save_s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!commit.ok()) return Fail(commit.status());
      const auto t1 = Clock::now();
      absl::Status st = latchkey::LoadTrainingCheckpoint((*loader)->state(), commit->dir, "",
                                                         commit->manifest_sha256);
      const double load_s = std::chrono::duration<double>(Clock::now() - t1).count();
      if (!st.ok()) return Fail(st);
      // Nobody reads a folder rank 0 prunes.
      if (st = groups->world->Barrier(); !st.ok()) return Fail(st);
      if (rank == 0) {
        if (st = latchkey::PruneCheckpoints(root, {req.job_id, req.job_uid}, 1, -1); !st.ok())
          return Fail(st);
      }
      if (st = groups->world->Barrier(); !st.ok()) return Fail(st);
      if (rep == 0) continue;  // warm-up
      save.push_back(save_s);
      blocked.push_back(commit->blocked_seconds);
      load.push_back(load_s);
      bytes = commit->bytes;
    }
    if (rank == 0) {
      std::printf(
          "| %s | %lld (%.1f MiB) | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) |\n",
          model.name, static_cast<long long>(bytes), bytes / 1048576.0, Median(save), Min(save),
          Max(save), Median(blocked), Min(blocked), Max(blocked), Median(load), Min(load),
          Max(load));
      std::fflush(stdout);
    }
  }
  return 0;
}
