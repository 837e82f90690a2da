// Asynchronous vs synchronous resumable checkpoints: the training time a save blocks, for a
// 24-layer n_embd 256 model (8 heads, MHA, vocabulary 12288, seq 32: 22.1 M parameters, ~253
// MiB of fp32 parameters and AdamW moments) on one rank, fp32, micro-batch 1.
//
//   bench_checkpoint_async [--reps N] [--gas N] [--dir DIR]
//
// Both modes go through the runner's driver (worker/checkpoint/checkpoint_saver.h), alternating per
// repetition after one warm-up of each, into the same folder:
//   sync   window, then the synchronous save (Stage, Write, Commit on the training thread):
//          "sync total" is its wall time, all of it blocked;
//   async  window s, the staging (blocked), the background write started, window s + 1 beside
//          it, then the commit at that boundary (waiting for the write if unfinished: blocked).
// Columns, median (min-max) over the repetitions: sync total; async stage (the JSONL's
// checkpoint_seconds); async commit (the training thread at the commit boundary, the wait for
// the write included); async blocked = stage + commit; async background = the background
// thread's write (files, fsync, SHA-256); the window beside the write vs alone. The last line
// says whether the median async blocked is at most 20% of the median sync total.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/stats.h"
#include "common/job_spec.h"
#include "common/latch.h"
#include "tests/support/free_port.h"
#include "worker/checkpoint/checkpoint_saver.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/training_state.h"
#include "worker/comm/process_groups.h"
#include "worker/train/engine.h"
#include "worker/train/threads.h"

namespace {

using Clock = std::chrono::steady_clock;
using latchkey::bench::Max;
using latchkey::bench::Median;
using latchkey::bench::Min;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

latchkey::JobSpec Spec(const std::string& root, int gas) {
  latchkey::JobSpec s;
  s.model = latchkey::ModelConfig{24,
                                  256,
                                  8,
                                  /*n_inner=*/0,
                                  /*vocab_size=*/12288,
                                  /*n_positions=*/32,
                                  /*multi_query=*/false};
  s.micro_batch_size = 1;
  s.gradient_accumulation_steps = gas;
  s.zero_stage = 0;
  s.optimizer.type = latchkey::OptimizerType::kAdamW;
  s.optimizer.lr = 0.001;
  s.tp = 1;
  s.world_size = 1;
  s.seq_len = 32;
  s.steps = 1000000;
  s.data.synthetic_seed = 1;
  s.checkpoint.dir = root;
  s.checkpoint.every_steps = 1;
  s.checkpoint.keep = 1;
  return s;
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "bench_checkpoint_async: %s\n", std::string(st.message()).c_str());
  return 1;
}

std::string Cell(const std::vector<double>& v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f (%.3f-%.3f)", Median(v), Min(v), Max(v));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  int gas = 4;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--reps") {
      reps = std::atoi(v.c_str());
    } else if (k == "--gas") {
      gas = std::atoi(v.c_str());
    } else if (k == "--dir") {
      dir = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  if (gas < 1) gas = 1;
  bool remove_dir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/latchkey-bench-checkpoint-async-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    dir = tmpl;
    remove_dir = true;
  }
  const int threads = latchkey::ConfigureComputeThreads(1);
  latchkey::comm::RendezvousConfig rdv;
  rdv.port = latchkey::testing::FreePort();
  auto groups = latchkey::comm::CreateProcessGroups(latchkey::CommBackend::kAuto, rdv);
  if (!groups.ok()) return Fail(groups.status());
  const latchkey::JobSpec spec = Spec(dir + "/ckpt", gas);
  auto engine = latchkey::CreateEngine(spec, &*groups);
  if (!engine.ok()) return Fail(engine.status());
  latchkey::TrainingState& state = (*engine)->state();
  const latchkey::LatchPolicy policy = latchkey::InitialPolicy(spec);
  int64_t window = 0;
  int64_t m = 0;
  double window_s = 0;
  const auto run_window = [&]() -> absl::Status {
    const latchkey::Latch latch = latchkey::DecideLatch(spec, policy, window++, m);
    m += latch.n;
    const auto t = Clock::now();
    auto report = (*engine)->RunWindow(latch);
    window_s = Since(t);
    return report.status();
  };
  latchkey::TrainingCheckpointRequest req;
  req.root = spec.checkpoint.dir;
  req.job_id = "standalone";
  req.job_uid = "00000000b0b0b0b0";  // one job: every rank the same, pruned as its own
  req.compute_threads = threads;
  latchkey::CheckpointSaver sync_saver(/*async=*/false);
  latchkey::CheckpointSaver async_saver(/*async=*/true);
  std::vector<double> sync_total, stage, commit, blocked, background, alone, beside;
  int64_t bytes = 0, staged_bytes = 0;
  for (int rep = 0; rep <= reps; ++rep) {
    // Synchronous: one window, then the whole save.
    if (absl::Status st = run_window(); !st.ok()) return Fail(st);
    const double window_alone = window_s;
    double b = 0;
    auto s = sync_saver.Start(state, req, 0, &b);
    if (!s.ok()) return Fail(s.status());
    if (absl::Status st = latchkey::PruneCheckpoints(req.root, {req.job_id, req.job_uid}, 1, -1);
        !st.ok())
      return Fail(st);
    // Asynchronous: the staging, then the next window beside the write, then the commit.
    if (absl::Status st = run_window(); !st.ok()) return Fail(st);
    double staged_s = 0;
    auto a = async_saver.Start(state, req, 0, &staged_s);
    if (!a.ok()) return Fail(a.status());
    async_saver.Launch();
    if (absl::Status st = run_window(); !st.ok()) return Fail(st);
    auto c = async_saver.CommitDue(state, state.position.step, spec.steps);
    if (!c.ok()) return Fail(c.status());
    if (!c->has_value()) return Fail(absl::InternalError("the async save did not commit"));
    if (absl::Status st = latchkey::PruneCheckpoints(req.root, {req.job_id, req.job_uid}, 1, -1);
        !st.ok())
      return Fail(st);
    if (rep == 0) continue;  // warm-up
    sync_total.push_back((*s)->commit.blocked_seconds);
    stage.push_back(staged_s);
    commit.push_back((*c)->commit_seconds);
    blocked.push_back(staged_s + (*c)->commit_seconds);
    background.push_back((*c)->write_seconds);
    alone.push_back(window_alone);
    beside.push_back(window_s);
    bytes = (*c)->commit.bytes;
    staged_bytes = async_saver.staged().bytes();
  }
  std::printf(
      "Resumable checkpoints, synchronous vs asynchronous: 24 layers, n_embd 256, 8 heads (MHA), "
      "vocabulary 12288, seq 32, micro-batch 1, %d micro-batches per window, AdamW fp32, one "
      "rank, %d compute thread(s); checkpoint %lld bytes (%.1f MiB; %.1f MiB staged); %d "
      "repetitions after one warm-up, seconds, median (min-max)\n\n",
      gas, threads, static_cast<long long>(bytes), bytes / 1048576.0, staged_bytes / 1048576.0,
      reps);
  std::printf(
      "| sync total | async stage | async commit | async blocked | async background | "
      "window alone | window beside the write |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", Cell(sync_total).c_str(),
              Cell(stage).c_str(), Cell(commit).c_str(), Cell(blocked).c_str(),
              Cell(background).c_str(), Cell(alone).c_str(), Cell(beside).c_str());
  const double ratio = Median(blocked) / Median(sync_total);
  std::printf("\nasync blocked / sync total = %.1f%% (goal <= 20%%): %s\n", 100 * ratio,
              ratio <= 0.2 ? "ok" : "NOT MET");
  if (remove_dir) std::filesystem::remove_all(dir);
  return 0;
}
