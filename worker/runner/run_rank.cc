#include "worker/runner/run_rank.h"

#include <chrono>
#include <iostream>
#include <stdexcept>

#include "worker/comm/collective_error.h"
#include "worker/train/threads.h"

namespace latchkey {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status Prefixed(const absl::Status& st, const std::string& prefix) {
  return absl::Status(st.code(), prefix + std::string(st.message()));
}

absl::Status RunWindows(const RankJob& job, LatchSource& source, const RunOptions& options) {
  const JobSpec& spec = job.spec;
  ConfigureComputeThreads(job.local_ranks);
  auto plan = source.Begin();
  if (!plan.ok()) return plan.status();
  auto groups = comm::CreateProcessGroups(job.backend, plan->rendezvous);
  if (!groups.ok()) return groups.status();
  auto engine = CreateEngine(spec, &*groups, options.engine);
  if (!engine.ok()) return engine.status();
  auto outputs = RankOutputs::Open(options.outputs, groups->rank, groups->stats.get());
  if (!outputs.ok()) return outputs.status();

  for (int64_t s = plan->first_window(); s < spec.steps; ++s) {
    const auto wait_start = Clock::now();
    auto latch = source.Await(s);
    if (!latch.ok()) return latch.status();
    const double waited = std::chrono::duration<double>(Clock::now() - wait_start).count();
    if (s == options.throw_at_window_for_testing) {
      throw std::logic_error("injected fault in window " + std::to_string(s));
    }
    auto report = (*engine)->RunWindow(*latch);
    if (!report.ok()) return report.status();
    report->latch_wait_seconds = waited;
    (*outputs)->OnStep(spec, *latch, *report, waited);
    if (absl::Status st = source.StepDone(*report); !st.ok()) {
      return Prefixed(st, "ReportStep: ");
    }
  }
  if (!options.save_dir.empty()) {
    if (absl::Status st = (*engine)->SaveCheckpoint(options.save_dir); !st.ok()) {
      return Prefixed(st, "--save: ");
    }
    if (groups->rank == 0 && !options.outputs.quiet) {
      std::cerr << "saved " << options.save_dir << "\n";
    }
  }
  (*outputs)->Linger();
  return absl::OkStatus();
}

}  // namespace

absl::Status StatusFromException(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const comm::CollectiveError*>(&e)) return ce->status();
  std::string what = e.what();
  if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  return absl::InternalError("internal error: " + what);
}

absl::Status RunRank(const RankJob& job, LatchSource& source, const RunOptions& options) {
  absl::Status st;
  try {
    st = RunWindows(job, source, options);
  } catch (const std::exception& e) {
    st = StatusFromException(e);
  }
  if (st.ok()) {
    source.Finished();
    return st;
  }
  // The job ended elsewhere: nothing of this rank's to report.
  if (st.code() == absl::StatusCode::kCancelled) return st;
  return source.Recover(std::move(st)).status();
}

}  // namespace latchkey
