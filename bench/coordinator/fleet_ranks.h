// bench_fleet's simulated ranks: N ranks of one job in this process, each speaking WorkerService
// as latchkey-worker does, over gRPC's callback API (a few channels, one latch stream per rank):
// Join, WatchLatches from window 0, a heartbeat with its position at the interval the
// coordinator said at Join, and per window hold latch(s), "compute" T s +-10%, ReportStep(s)
// without waiting for the answer, go on with latch(s+1). Each rank records its latch waits and
// its calls' latencies. (fleet.cc runs them against a coordinator and prints the table.)
//
// Thread-safety: the callbacks run on gRPC's threads and the timer thread; a Rank's fields are
// guarded by its mu, the Fleet's counters by Fleet::mu.
#ifndef LATCHKEY_BENCH_COORDINATOR_FLEET_RANKS_H_
#define LATCHKEY_BENCH_COORDINATOR_FLEET_RANKS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/coordinator/timers.h"
#include "latchkey/v1/worker_service.grpc.pb.h"

namespace latchkey::bench {

namespace v1 = latchkey::v1;

struct Options {
  int ranks = 0;
  double step_seconds = 2;
  int steps = 10;
  int channels = 16;
  int join_window = 1024;  // Joins in flight at once
  // Heartbeat period; zero: the interval the coordinator said at Join (as latchkey-worker).
  absl::Duration heartbeat_every = absl::ZeroDuration();
  // > 0: node mode. Ranks k*node_size .. (k+1)*node_size-1 form node k, and their calls go as
  // its agent makes them (client/node_relay.h): one NodeHeartbeat per interval with the node's
  // joined ranks, one ReportSteps per step once every rank of the node finished it. The ranks
  // of a node compute each window for the same time (their collectives keep them together).
  int node_size = 0;
};

// Node mode: one simulated agent's state, guarded by mu.
struct Node {
  int id = 0;
  absl::Mutex mu;
  bool heartbeating = false;
  std::map<int64_t, std::vector<v1::ReportStepRequest>> reports;  // by step, until all are in
};

struct Fleet;

// One simulated rank. Its fields are guarded by mu.
struct Rank {
  int id = 0;
  Fleet* fleet = nullptr;
  absl::Mutex mu;
  int64_t attempt = 0;
  absl::Duration heartbeat_every = absl::Seconds(1);
  std::vector<v1::Latch> latches;  // by window; window w present when latches.size() > w
  int64_t next_step = 0;           // the step it computes next
  bool computing = false;
  bool done = false;                           // its stream ended
  absl::Time phase_start;                      // when it began computing or waiting
  absl::Time finished = absl::InfinitePast();  // when it finished step next_step - 1
  std::vector<double> latch_wait_ms, report_ms, heartbeat_ms;
};

struct Fleet {
  Options o;
  std::string job_id, token;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<std::unique_ptr<Node>> nodes;  // node mode
  Timers timers;
  std::mt19937 rng{12345};
  absl::Mutex mu;  // below
  int joined = 0, next_join = 0, ended = 0;
  absl::Time last_join;
  std::string first_error;
  std::atomic<int> in_flight{0};  // unary calls whose callback has not run yet

  v1::WorkerService::Stub* Stub(int rank) { return stubs[rank % stubs.size()].get(); }
  void Fail(const std::string& what) {
    absl::MutexLock lock(&mu);
    if (first_error.empty()) first_error = what;
  }
  // One window's compute time: T +-10%; in node mode the same for every rank of a node.
  absl::Duration Jittered(const Rank& r) {
    std::uniform_real_distribution<double> d(0.9 * o.step_seconds, 1.1 * o.step_seconds);
    if (o.node_size > 0) {
      std::mt19937 node_rng(static_cast<uint32_t>((r.id / o.node_size) * 1000003 + r.next_step));
      return absl::Seconds(d(node_rng));
    }
    absl::MutexLock lock(&mu);
    return absl::Seconds(d(rng));
  }
  void Identity(Rank& r, v1::WorkerIdentity* id) {
    id->set_job_id(job_id);
    id->set_join_token(token);
    id->set_worker_id("fleet-" + std::to_string(r.id));
    absl::MutexLock lock(&r.mu);
    id->set_attempt(r.attempt);
  }

  void StartJoins() {
    std::vector<int> first;
    {
      absl::MutexLock lock(&mu);
      while (next_join < o.ranks && next_join < o.join_window) first.push_back(next_join++);
    }
    for (int i : first) Join(*ranks[i], 0);
  }
  void Join(Rank& r, int tries);
  void Joined(Rank& r, const v1::JoinResponse& resp);
  void OnLatch(Rank& r, const v1::Latch& latch);
  void StartCompute(Rank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu);
  void ComputeDone(Rank& r);
  void Report(Rank& r, const v1::Latch& latch);
  void Heartbeat(Rank& r);
  void NodeHeartbeat(Node& n);
  void NodeReport(Rank& r, v1::ReportStepRequest req);
  bool Position(Rank& r, v1::HeartbeatRequest* req);
  void StreamEnded(Rank& r, const grpc::Status& s, const std::string& state);
};

}  // namespace latchkey::bench

#endif  // LATCHKEY_BENCH_COORDINATOR_FLEET_RANKS_H_
