// Partitions (docs/fault-tolerance.md "Partitions"), against an in-process coordinator on real
// SQLite with a ManualClock: a DP 2 x TP 2 job with ranks 0-1 on one host and 2-3 on another.
// The attempt forms only once every rank reached every other; a stall across a cut link names
// the link and spends no restart; the wait ends in failure after partition_timeout_seconds; a
// slow collective whose bytes move is not a stall; and a coordinator that hears from no rank
// of any job across hosts suspects its own network. FindPartition's wording, pure.
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/partition.h"
#include "server/sqlite_store.h"
#include "tests/support/specs.h"

namespace latchkey {
namespace {

using testing::SpecJson;
using testing::SpecParams;

const char* kHostA = "10.0.0.2";
const char* kHostB = "10.0.0.3";

struct Running {
  std::unique_ptr<Coordinator> c;
  std::string id;
  std::string token;
  std::vector<WorkerCall> calls;
  absl::Status last_join;  // a join that was refused
};

JobState State(const Running& r) { return r.c->GetJob(r.id, false)->record.state; }

// Four ranks joined (probe ports 7000 + rank), none has probed yet: on `hosts[rank]`, as node
// `nodes[rank]` ("" = no node identity: the host is the node). Every join must succeed unless
// `refused`: then the last one is refused (kept in last_join), since its layout ends the job.
Running Join4(ManualClock& clock, std::vector<std::string> hosts = {kHostA, kHostA, kHostB, kHostB},
              std::vector<std::string> nodes = {"", "", "", ""}, bool refused = false) {
  CoordinatorOptions opt;
  opt.clock = &clock;
  opt.heartbeat_interval = absl::Seconds(1);
  opt.liveness_timeout = absl::Seconds(10);
  auto store = SqliteStore::Open(":memory:");
  EXPECT_TRUE(store.ok()) << store.status();
  auto c = Coordinator::Create(*std::move(store), opt, nullptr);
  EXPECT_TRUE(c.ok()) << c.status();
  Running r{*std::move(c), "", "", {}, absl::OkStatus()};
  SpecParams p;
  p.world_size = 4;
  p.tp = 2;
  p.steps = 20;
  p.extra_latchkey["hang_timeout_seconds"] = 20;
  p.extra_latchkey["partition_timeout_seconds"] = 100;
  auto job = r.c->SubmitJob({SpecJson(p), "", "", 0});
  EXPECT_TRUE(job.ok()) << job.status();
  r.id = job->job.record.job_id;
  r.token = job->join_token;
  for (int i = 0; i < 4; ++i) {
    JoinArgs a;
    a.call = {r.id, r.token, "w" + std::to_string(i), -1, 0};
    a.requested_rank = i;
    a.advertise_host = hosts[static_cast<size_t>(i)];
    a.node = nodes[static_cast<size_t>(i)];
    a.probe_port = 7000 + i;
    auto joined = r.c->Join(a);
    if (!joined.ok()) {  // the last join of a refused layout hears that the job ended
      EXPECT_TRUE(refused && i == 3) << "join " << i << ": " << joined.status();
      r.last_join = joined.status();
      continue;
    }
    r.calls.push_back({r.id, r.token, a.call.worker_id, joined->rank, joined->attempt});
  }
  return r;
}

Reachability Reach(int64_t version, std::vector<int> unreachable, double seconds = 0) {
  Reachability out;
  out.peers_version = version;
  out.probed = 3;
  out.unreachable = std::move(unreachable);
  out.unreachable_seconds = seconds;
  return out;
}

// Every rank's heartbeat with its probe round: ranks 0-1 cannot reach 2-3 when `cut`.
void ReportAll(Running& r, int64_t version, bool cut, double seconds = 0,
               std::optional<RankPosition> position = {}) {
  for (int i = 0; i < 4; ++i) {
    HeartbeatArgs a;
    a.position = position;
    a.reach =
        Reach(version,
              cut ? (i < 2 ? std::vector<int>{2, 3} : std::vector<int>{0, 1}) : std::vector<int>{},
              seconds);
    ASSERT_TRUE(r.c->Heartbeat(r.calls[i], a).ok());
  }
}

int64_t PeersVersion(Running& r) {
  HeartbeatArgs a;
  a.want_peers = true;
  auto out = r.c->Heartbeat(r.calls[0], a);
  EXPECT_TRUE(out.ok()) << out.status();
  return out->peers.version;
}

RankPosition InDpReduceScatter(int64_t attempt, double seconds, double quiet = -1) {
  RankPosition p;
  p.attempt = attempt;
  p.window = 7;
  p.micro_batch = 1;
  p.phase = RankPhase::kCollective;
  p.op = "reduce_scatter";
  p.group = "dp";
  p.seq = 66;
  p.seconds = seconds;
  p.quiet_seconds = quiet;
  return p;
}

TEST(CoordinatorPartitionTest, TheAttemptFormsOnlyOnceEveryRankReachedEveryOther) {
  ManualClock clock;
  Running r = Join4(clock);
  EXPECT_EQ(State(r), JobState::kPending);  // joined, not yet probed

  HeartbeatArgs ask;
  ask.want_peers = true;
  auto peers = r.c->Heartbeat(r.calls[2], ask);
  ASSERT_TRUE(peers.ok());
  ASSERT_EQ(peers->peers.peers.size(), 4u);
  EXPECT_EQ(peers->peers.peers[1].host, kHostA);
  EXPECT_EQ(peers->peers.peers[3].host, kHostB);
  EXPECT_EQ(peers->peers.peers[3].port, 7003);
  const int64_t v = peers->peers.version;

  ReportAll(r, v, /*cut=*/true, 3);
  EXPECT_EQ(State(r), JobState::kPending);
  clock.Advance(absl::Seconds(6));
  ReportAll(r, v, /*cut=*/true, 9);
  r.c->CheckLiveness();
  const JobView waiting = *r.c->GetJob(r.id, false);
  EXPECT_EQ(waiting.record.state, JobState::kPending);
  EXPECT_NE(waiting.record.last_recovery_reason.find(
                "waiting for the link between 10.0.0.2 and 10.0.0.3 (unreachable for"),
            std::string::npos)
      << waiting.record.last_recovery_reason;
  EXPECT_EQ(waiting.attempts.size(), 1u);

  // A report of an older peer list does not count.
  ReportAll(r, v - 1, /*cut=*/false);
  EXPECT_EQ(State(r), JobState::kPending);
  ReportAll(r, v, /*cut=*/false);
  EXPECT_EQ(State(r), JobState::kRunning);
}

TEST(CoordinatorPartitionTest, AStallAcrossACutLinkNamesTheLinkAndSpendsNoRestart) {
  ManualClock clock;
  Running r = Join4(clock);
  const int64_t v = PeersVersion(r);
  ReportAll(r, v, false);
  ASSERT_EQ(State(r), JobState::kRunning);

  clock.Advance(absl::Seconds(12));
  ReportAll(r, v, /*cut=*/true, 9, InDpReduceScatter(1, 21, 21));
  r.c->CheckLiveness();
  const JobView v2 = *r.c->GetJob(r.id, false);
  EXPECT_EQ(v2.record.state, JobState::kRecovering);
  EXPECT_EQ(v2.record.restarts, 0);
  EXPECT_NE(v2.record.last_recovery_reason.find(
                "network partition: ranks 0,1 (10.0.0.2) cannot reach ranks 2,3 (10.0.0.3) for "
                "9 s (reduce_scatter/dp #66)"),
            std::string::npos)
      << v2.record.last_recovery_reason;
  EXPECT_TRUE(v2.record.stalled.empty());  // not a stalled rank
}

TEST(CoordinatorPartitionTest, AStallWithEveryPeerReachableIsAStallAsBefore) {
  ManualClock clock;
  Running r = Join4(clock);
  const int64_t v = PeersVersion(r);
  ReportAll(r, v, false);
  clock.Advance(absl::Seconds(12));
  ReportAll(r, v, /*cut=*/false, 0, InDpReduceScatter(1, 21, 21));
  r.c->CheckLiveness();
  const JobView after = *r.c->GetJob(r.id, false);
  EXPECT_EQ(after.record.state, JobState::kRecovering);
  EXPECT_EQ(after.record.restarts, 1);
  EXPECT_EQ(after.record.stalled.size(), 1u);
}

TEST(CoordinatorPartitionTest, ASlowCollectiveWhoseBytesStillMoveIsNotAStall) {
  ManualClock clock;
  Running r = Join4(clock);
  const int64_t v = PeersVersion(r);
  ReportAll(r, v, false);
  clock.Advance(absl::Seconds(12));
  ReportAll(r, v, false, 0, InDpReduceScatter(1, 40, 0.5));  // 40 s in, bytes moved 0.5 s ago
  r.c->CheckLiveness();
  EXPECT_EQ(State(r), JobState::kRunning);
  ReportAll(r, v, false, 0, InDpReduceScatter(1, 40, 25));  // quiet past the hang timeout
  r.c->CheckLiveness();
  EXPECT_EQ(State(r), JobState::kRecovering);
}

TEST(CoordinatorPartitionTest, ALinkCutPastThePartitionTimeoutFailsTheJobNamingIt) {
  ManualClock clock;
  Running r = Join4(clock);
  const int64_t v = PeersVersion(r);
  ReportAll(r, v, /*cut=*/true, 1);
  for (int s = 0; s < 95; s += 5) {
    clock.Advance(absl::Seconds(5));
    ReportAll(r, v, /*cut=*/true, 1 + s + 5);
    r.c->CheckLiveness();
    ASSERT_EQ(State(r), JobState::kPending) << s;
  }
  clock.Advance(absl::Seconds(10));
  ReportAll(r, v, /*cut=*/true, 106);
  r.c->CheckLiveness();
  const JobView failed = *r.c->GetJob(r.id, false);
  EXPECT_EQ(failed.record.state, JobState::kFailed);
  EXPECT_NE(failed.record.failure_reason.find("network partition: the link between 10.0.0.2 and "
                                              "10.0.0.3"),
            std::string::npos)
      << failed.record.failure_reason;
  EXPECT_NE(failed.record.failure_reason.find("latchkey.partition_timeout_seconds (100 s)"),
            std::string::npos)
      << failed.record.failure_reason;
  EXPECT_EQ(failed.record.restarts, 0);
}

TEST(CoordinatorPartitionTest, EveryRankSilentAcrossHostsSuspectsTheCoordinatorsOwnNetwork) {
  ManualClock clock;
  Running r = Join4(clock);
  const int64_t v = PeersVersion(r);
  ReportAll(r, v, false);
  ASSERT_EQ(State(r), JobState::kRunning);
  RankPosition latch;
  latch.attempt = 1;
  latch.window = 9;
  latch.phase = RankPhase::kLatch;
  ReportAll(r, v, false, 0, latch);
  // 40 s of silence from every rank: past the liveness (10 s) and hang (20 s) timeouts.
  for (int s = 0; s < 40; ++s) {
    clock.Advance(absl::Seconds(1));
    r.c->CheckLiveness();
    ASSERT_EQ(State(r), JobState::kRunning) << s + 1 << " s of silence";
  }
  // Heard again: judged on what they report (waiting 40 s for a latch is not a stall), with a
  // fresh grace.
  latch.seconds = 40;
  ReportAll(r, v, false, 0, latch);
  r.c->CheckLiveness();
  EXPECT_EQ(State(r), JobState::kRunning);
  for (int s = 0; s < 5; ++s) {
    clock.Advance(absl::Seconds(1));
    latch.seconds = 0.2;
    ReportAll(r, v, false, 0, latch);
    r.c->CheckLiveness();
  }
  EXPECT_EQ(State(r), JobState::kRunning);
  // One rank silent while the others beat: that rank is lost, as before (past the grace of two
  // liveness timeouts).
  for (int s = 0; s < 25 && State(r) == JobState::kRunning; ++s) {
    clock.Advance(absl::Seconds(1));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.c->Heartbeat(r.calls[i], latch).ok());
    r.c->CheckLiveness();
  }
  EXPECT_EQ(State(r), JobState::kRecovering);
}

// Topology (docs/deploy.md "One pod per node"): a tensor-parallel group across nodes is refused
// before any collective, naming the group, its ranks, their nodes and what to change.
TEST(CoordinatorTopologyTest, ATensorParallelGroupAcrossHostsFailsTheJobBeforeItStarts) {
  ManualClock clock;
  Running r = Join4(clock, {kHostA, kHostB, kHostA, kHostB}, {"", "", "", ""}, /*refused=*/true);
  EXPECT_EQ(State(r), JobState::kFailed);
  // The join that completed the ranks hears it as the others will.
  EXPECT_EQ(r.last_join.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.last_join.message().find("ended (failed) as rank 3 joined (tensor-parallel group 0"),
            std::string::npos)
      << r.last_join;
  EXPECT_EQ(r.calls.size(), 3u);
  const std::string why = r.c->GetJob(r.id, false)->record.failure_reason;
  EXPECT_EQ(why,
            "tensor-parallel group 0 (ranks 0..1) spans nodes: rank 0 on 10.0.0.2, rank 1 on "
            "10.0.0.3; a tensor-parallel group must be on one node (it all-reduces in every "
            "layer): run `latchkey node` with --nproc a multiple of "
            "tensor_parallel.autotp_size (2), or start each group's ranks on one host");
  EXPECT_EQ(r.c->GetJob(r.id, false)->record.attempt, 1);
}

TEST(CoordinatorTopologyTest, TheNodeIdentityDecidesOverTheHost) {
  ManualClock clock;
  // One host, two agents' node identities: groups inside a node form as usual.
  Running inside = Join4(clock, {kHostA, kHostA, kHostA, kHostA}, {"n0", "n0", "n1", "n1"});
  EXPECT_EQ(State(inside), JobState::kRunning);
  // One host, a group split between two node identities: refused, naming the nodes.
  EXPECT_TRUE(inside.last_join.ok()) << inside.last_join;
  Running across =
      Join4(clock, {kHostA, kHostA, kHostA, kHostA}, {"n0", "n0", "n0", "n1"}, /*refused=*/true);
  EXPECT_EQ(State(across), JobState::kFailed);
  EXPECT_NE(across.c->GetJob(across.id, false)
                ->record.failure_reason.find(
                    "tensor-parallel group 1 (ranks 2..3) spans nodes: rank 2 on n0, rank 3 on n1"),
            std::string::npos);
}

TEST(PartitionVerdictTest, NamesEachCutLinkWithBothSidesRanks) {
  const Reachability a = Reach(1, {2, 3}, 9);
  const Reachability b = Reach(1, {0}, 4);
  const std::vector<RankReach> ranks = {{0, "h2", &a, "reduce_scatter/dp #66"},
                                        {1, "h2", &a, "reduce_scatter/dp #66"},
                                        {2, "h3", &b, "all_reduce/tp #12"},
                                        {3, "h3", nullptr, ""},
                                        {4, "h4", nullptr, ""}};
  auto v = FindPartition(ranks);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->message,
            "ranks 0,1 (h2) cannot reach ranks 2,3 (h3) for 9 s (reduce_scatter/dp #66)");
  EXPECT_EQ(v->Links(), "the link between h2 and h3 (unreachable for 9 s)");
  EXPECT_EQ(v->pairs, 5);
  ASSERT_EQ(v->links.size(), 1u);
}

TEST(PartitionVerdictTest, SameHostPeersAndEmptyReportsNameNothing) {
  const Reachability self_host = Reach(1, {1}, 3);
  const Reachability none = Reach(1, {}, 0);
  EXPECT_FALSE(FindPartition({{0, "h2", &self_host, ""}, {1, "h2", &none, ""}}).has_value());
}

}  // namespace
}  // namespace latchkey
