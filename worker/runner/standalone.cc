#include "worker/runner/standalone.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include <chrono>
#include <thread>

#include "absl/strings/str_replace.h"
#ifdef LATCHKEY_WITH_METRICS
#include "worker/metrics/worker_metrics.h"
#endif
#include "common/latch.h"
#include "worker/comm/gloo/gloo_groups.h"
#include "worker/train/step_jsonl.h"
#include "worker/train/threads.h"

namespace latchkey {
namespace {

absl::StatusOr<int> EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != 0 || x < 0) {
    return absl::InvalidArgumentError(std::string(name) + ": '" + v + "' is not a non-negative integer");
  }
  return static_cast<int>(x);
}

}  // namespace

absl::Status RunStandalone(const StandaloneOptions& options) {
  auto spec = LoadJobSpecFile(options.spec_path);
  if (!spec.ok()) return spec.status();
  for (const std::string& w : spec->warnings) std::cerr << "latchkey-worker: warning: " << w << "\n";

  auto rank = EnvInt("RANK", 0);
  auto world = EnvInt("WORLD_SIZE", 1);
  auto port = EnvInt("MASTER_PORT", 29500);
  if (!rank.ok()) return rank.status();
  if (!world.ok()) return world.status();
  if (!port.ok()) return port.status();
  auto local = EnvInt("LOCAL_WORLD_SIZE", *world);
  if (!local.ok()) return local.status();
  if (*world != spec->world_size) {
    return absl::InvalidArgumentError("latchkey.world_size: the spec asks for " +
                                      std::to_string(spec->world_size) +
                                      " ranks but WORLD_SIZE is " + std::to_string(*world));
  }
  ConfigureComputeThreads(*local);

  comm::RendezvousConfig rdv;
  const char* addr = std::getenv("MASTER_ADDR");
  rdv.host = addr && *addr ? addr : "127.0.0.1";
  rdv.port = *port;
  rdv.rank = *rank;
  rdv.world_size = *world;
  rdv.tp = spec->tp;
  auto groups = comm::CreateGlooProcessGroups(rdv);
  if (!groups.ok()) return groups.status();

  auto engine = CreateEngine(*spec, &*groups, options.engine);
  if (!engine.ok()) return engine.status();

#ifdef LATCHKEY_WITH_METRICS
  WorkerMetrics metrics;
  std::unique_ptr<MetricsEndpoint> endpoint;
  if (options.metrics_port >= 0) {
    auto started = MetricsEndpoint::Start(options.metrics_host, options.metrics_port, &metrics);
    if (!started.ok()) return started.status();
    endpoint = *std::move(started);
    // One line per rank that scripts can parse.
    std::fprintf(stderr, "rank %d metrics: http://%s:%d/metrics\n", *rank,
                 options.metrics_host.c_str(), endpoint->port());
    groups->stats->SetListener([&metrics](const std::string& op, const std::string& group,
                                          const std::string& tag, int64_t bytes, double secs) {
      metrics.ObserveCollective(op, group, tag, bytes, secs);
    });
  }
#else
  if (options.metrics_port >= 0) {
    return absl::UnimplementedError("--metrics-port: this build has no metrics (LATCHKEY_CORE_ONLY)");
  }
#endif

  std::ofstream jsonl;
  if (!options.metrics_jsonl.empty()) {
    const std::string path =
        absl::StrReplaceAll(options.metrics_jsonl, {{"{rank}", std::to_string(*rank)}});
    jsonl.open(path, std::ios::trunc);
    if (!jsonl) return absl::PermissionDeniedError("--metrics-jsonl: cannot write '" + path + "'");
  }
  const LatchPolicy policy = InitialPolicy(*spec);
  int64_t first_micro_batch = 0;
  for (int64_t s = 0; s < spec->steps; ++s) {
    const Latch latch = DecideLatch(*spec, policy, s, first_micro_batch);
    auto report = (*engine)->RunWindow(latch);
    if (!report.ok()) return report.status();
    first_micro_batch += latch.n;
#ifdef LATCHKEY_WITH_METRICS
    metrics.ObserveLatchWait(0.0);  // standalone: every rank decides its latch locally
    metrics.ObserveStep(*report, static_cast<int64_t>(latch.n) * spec->micro_batch_size *
                                     spec->seq_len);
#endif
    if (jsonl.is_open()) {
      jsonl << StepReportJson(*rank, *report) << "\n";
      jsonl.flush();
    }
    if (*rank == 0 && !options.quiet) {
      std::fprintf(stderr, "step %lld/%lld  loss %.6f  grad_norm %.4f  kv %s x%lld  %.3fs\n",
                   static_cast<long long>(s + 1), static_cast<long long>(spec->steps),
                   report->loss, report->grad_norm, KvModeName(report->kv_mode),
                   static_cast<long long>(report->kv_allreduce_calls), report->step_seconds);
    }
  }
  if (!options.save_dir.empty()) {
    if (absl::Status st = (*engine)->SaveCheckpoint(options.save_dir); !st.ok()) {
      return absl::Status(st.code(), "--save: " + std::string(st.message()));
    }
    if (*rank == 0 && !options.quiet) std::cerr << "saved " << options.save_dir << "\n";
  }
#ifdef LATCHKEY_WITH_METRICS
  if (endpoint && options.linger_seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(options.linger_seconds));
  }
  groups->stats->SetListener(nullptr);
#endif
  return absl::OkStatus();
}

}  // namespace latchkey
