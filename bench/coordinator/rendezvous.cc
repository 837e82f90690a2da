// Rendezvous at scale: the store pattern group formation uses (every rank sets its address and
// reads its group's) with N clients against one real TCP store, and the NCCL unique-id exchange
// of a job of R ranks that join a real latchkey-coordinator.
//
//   bench_rendezvous [--clients 1024,4096] [--groups dp,tp8] [--read each,gathered,mesh]
//                    [--unique-id-ranks 4096] [--per-process 1024] [--timeout-s 60]
//                    [--max-wall-s 0] [--coordinator-bin PATH]
//
// Store rows: the store is hosted by its own process (as rank 0 hosts it: ConnectTcpStore with
// is_host), the clients are threads in N / per-process child processes (a client is a c10d
// TCPStore: two sockets and a thread). "dp" is one group of all N ranks, "tpK" N/K groups of K.
// Every value read is checked against the address its rank published. Wall: first rank
// starting to connect -> last rank done (one clock: every process is on this machine).
// Unique-id row: R ranks (threads in R / per-process children) Join the coordinator, connect to
// the store it names (rank 0 hosts it) and run ExchangeNcclUniqueId; all R ids are checked
// to be the same 128 bytes. Exit 1 when a row fails (or takes longer than --max-wall-s > 0).
// Child processes: see rendezvous_roles.h (--role host|clients|ranks).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/coordinator/coordinator_process.h"
#include "bench/coordinator/rendezvous_roles.h"
#include "client/job_client.h"
#include "common/subprocess.h"
#include "tests/support/free_port.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace {

using latchkey::bench::LatencyHist;
using latchkey::bench::ProcessCpuSeconds;
using latchkey::bench::RankTimes;

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : "bench_rendezvous";
}

bool Connectable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// What the children of one row wrote, merged.
struct Results {
  std::vector<RankTimes> times;
  std::map<std::string, LatencyHist> hist;
  std::vector<std::string> ids;  // "<bytes> <sha256>" per rank, in rank order where known
  std::string error;
};

void ReadResults(const std::string& path, Results* r) {
  std::ifstream in(path);
  if (!in) {
    if (r->error.empty()) r->error = "no results in " + path;
    return;
  }
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string tag;
    s >> tag;
    if (tag == "t") {
      int i = 0, ok = 0;
      RankTimes t;
      s >> i >> t.start_ns >> t.connected_ns >> t.done_ns >> ok;
      t.ok = ok == 1;
      r->times.push_back(t);
    } else if (tag == "h") {
      std::string op;
      int bucket = 0;
      uint64_t n = 0;
      s >> op >> bucket >> n;
      r->hist[op].Add(bucket, n);
    } else if (tag == "id") {
      std::string rank, bytes, sha;
      s >> rank >> bytes >> sha;
      r->ids.push_back(bytes + " " + sha);
    } else if (tag == "err" && r->error.empty()) {
      r->error = line.substr(4);
    }
  }
}

// Starts `count` children (args + --first/--count/--out), waits up to `limit`, merges.
Results RunChildren(const std::vector<std::string>& args, int total, int per_process,
                    const std::string& dir, std::chrono::seconds limit) {
  Results r;
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  for (int first = 0, k = 0; first < total; first += per_process, ++k) {
    std::vector<std::string> a = args;
    const std::string out = dir + "/part" + std::to_string(k) + ".txt";
    for (const std::string& x :
         {std::string("--first"), std::to_string(first), std::string("--count"),
          std::to_string(std::min(per_process, total - first)), std::string("--out"), out}) {
      a.push_back(x);
    }
    auto pid = latchkey::Spawn({a, {}, dir + "/part" + std::to_string(k) + ".log"});
    if (!pid.ok()) {
      r.error = pid.status().ToString();
      break;
    }
    pids.push_back(*pid);
    outs.push_back(out);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (size_t k = 0; k < pids.size(); ++k) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int code = latchkey::WaitOrKill(pids[k], std::max(left, std::chrono::milliseconds(1)));
    if (code != 0) {  // the log goes with the temporary folder: its end goes to stderr
      std::ifstream log(dir + "/part" + std::to_string(k) + ".log");
      std::vector<std::string> lines;
      for (std::string l; std::getline(log, l);) lines.push_back(l);
      std::cerr << "bench_rendezvous: client process " << k << " (exit " << code << "), its log:\n";
      for (size_t i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i) {
        std::cerr << "  " << lines[i] << "\n";
      }
    }
    if (code != 0 && r.error.empty()) {
      r.error = "client process " + std::to_string(k) +
                (code == -1 ? " still running after " + std::to_string(limit.count()) + " s"
                            : " exited " + std::to_string(code)) +
                " (its log's end is on stderr)";
    }
    ReadResults(outs[k], &r);
  }
  return r;
}

struct Summary {
  int ok_ranks = 0;
  double wall_s = 0, connect_wall_s = 0, rank_p50_ms = 0, rank_p99_ms = 0;
};

Summary Summarize(const Results& r) {
  Summary s;
  int64_t start = INT64_MAX, done = 0, connected = 0;
  LatencyHist per_rank;
  for (const RankTimes& t : r.times) {
    if (!t.ok) continue;
    s.ok_ranks++;
    start = std::min(start, t.start_ns);
    done = std::max(done, t.done_ns);
    connected = std::max(connected, t.connected_ns);
    per_rank.Add(static_cast<double>(t.done_ns - t.start_ns) / 1e3);
  }
  if (s.ok_ranks > 0) {
    s.wall_s = static_cast<double>(done - start) / 1e9;
    s.connect_wall_s = static_cast<double>(connected - start) / 1e9;
  }
  s.rank_p50_ms = per_rank.QuantileMs(0.50);
  s.rank_p99_ms = per_rank.QuantileMs(0.99);
  return s;
}

std::string Ms(const std::map<std::string, LatencyHist>& h, const std::string& op) {
  auto it = h.find(op);
  if (it == h.end() || it->second.count() == 0) return "-";
  return absl::StrFormat("%.2f / %.2f", it->second.QuantileMs(0.50), it->second.QuantileMs(0.99));
}

struct Options {
  std::string clients = "1024,4096";
  std::string groups = "dp,tp8";
  std::string read = "each,gathered,mesh";
  int unique_id_ranks = 4096;
  int per_process = 1024;
  int timeout_s = 60;
  double max_wall_s = 0;
  std::string coordinator_bin = LATCHKEY_COORDINATOR_BIN;
};

// One store row; returns whether it passed.
bool StoreRow(const Options& o, int n, const std::string& grouping, const std::string& read) {
  const int group = grouping == "dp" ? n : std::atoi(grouping.c_str() + 2);
  const std::string label = absl::StrFormat("| %d | %s | %s |", n, grouping, read);
  if (group <= 0 || n % group != 0) {
    std::printf("%s error: %d ranks do not split into groups of %d |\n", label.c_str(), n, group);
    return false;
  }
  const latchkey::testing::ScopedTempDir dir("rendezvous-bench");
  const int port = latchkey::testing::FreePort();
  const std::string self = SelfExe();
  auto host = latchkey::Spawn({{self, "--role", "host", "--port", std::to_string(port), "--world",
                                std::to_string(n), "--timeout-s", std::to_string(o.timeout_s)},
                               {},
                               dir.path() + "/host.log"});
  if (!host.ok()) {
    std::printf("%s error: %s |\n", label.c_str(), host.status().ToString().c_str());
    return false;
  }
  for (int i = 0; i < 300 && !Connectable(port); ++i) absl::SleepFor(absl::Milliseconds(100));
  const double cpu0 = ProcessCpuSeconds(*host);
  Results r = RunChildren({self, "--role", "clients", "--port", std::to_string(port), "--world",
                           std::to_string(n), "--group", std::to_string(group), "--read", read,
                           "--timeout-s", std::to_string(o.timeout_s)},
                          n, o.per_process, dir.path(), std::chrono::seconds(o.timeout_s + 60));
  const double host_cpu = ProcessCpuSeconds(*host) - cpu0;
  kill(*host, SIGTERM);
  latchkey::WaitOrKill(*host, std::chrono::seconds(10));
  const Summary s = Summarize(r);
  uint64_t ops = 0;
  for (const auto& [op, h] : r.hist) ops += h.count();
  bool ok = r.error.empty() && s.ok_ranks == n;
  std::string verdict = ok ? "ok" : "FAILED: " + (r.error.empty() ? "ranks missing" : r.error);
  if (ok && o.max_wall_s > 0 && s.wall_s > o.max_wall_s) {
    ok = false;
    verdict = absl::StrFormat("FAILED: over %.0f s", o.max_wall_s);
  }
  std::printf("%s %d/%d | %.2f | %.2f | %s | %s | %s | %s | %.2f / %.2f | %llu | %.2f | %s |\n",
              label.c_str(), s.ok_ranks, n, s.wall_s, s.connect_wall_s,
              Ms(r.hist, "connect").c_str(), Ms(r.hist, "set").c_str(), Ms(r.hist, "wait").c_str(),
              Ms(r.hist, "get").c_str(), s.rank_p50_ms, s.rank_p99_ms,
              static_cast<unsigned long long>(ops), host_cpu, verdict.c_str());
  std::fflush(stdout);
  return ok;
}

bool UniqueIdRow(const Options& o, int ranks) {
  const latchkey::testing::ScopedTempDir dir("rendezvous-bench-id");
  const latchkey::bench::CoordinatorProcess coord = latchkey::bench::StartCoordinator(
      o.coordinator_bin, dir.path(), {"--liveness-timeout", "600"},
      dir.path() + "/coordinator.log");
  auto fail = [&](const std::string& why) {
    std::printf("| %d | FAILED: %s |\n", ranks, why.c_str());
    return false;
  };
  auto stop = [&] { latchkey::bench::StopCoordinator(coord); };
  if (coord.port == 0) {
    stop();
    return fail("coordinator did not start (" + dir.path() + "/coordinator.log)");
  }
  const int grpc_port = coord.port;
  const std::string address = "127.0.0.1:" + std::to_string(grpc_port);
  latchkey::JobClient client({address, absl::Seconds(30)});
  latchkey::testing::SpecParams p;
  p.world_size = ranks;
  p.tp = 1;
  latchkey::JobSubmission req;
  req.spec_json = latchkey::testing::SpecJson(p);
  req.rendezvous_host = "127.0.0.1";
  req.rendezvous_port = latchkey::testing::FreePort();
  auto job = client.SubmitJob(req);
  if (!job.ok()) {
    stop();
    return fail(job.status().ToString());
  }
  const double cpu0 = ProcessCpuSeconds(coord.pid);
  Results r =
      RunChildren({SelfExe(), "--role", "ranks", "--coordinator", address, "--job", job->job_id,
                   "--token", job->join_token, "--timeout-s", std::to_string(o.timeout_s)},
                  ranks, o.per_process, dir.path(), std::chrono::seconds(o.timeout_s + 60));
  const double coord_cpu = ProcessCpuSeconds(coord.pid) - cpu0;
  stop();
  const Summary s = Summarize(r);
  std::set<std::string> distinct(r.ids.begin(), r.ids.end());
  std::string verdict = "ok";
  if (!r.error.empty()) {
    verdict = "FAILED: " + r.error;
  } else if (s.ok_ranks != ranks || static_cast<int>(r.ids.size()) != ranks) {
    verdict = absl::StrFormat("FAILED: %d of %d ranks hold an id", r.ids.size(), ranks);
  } else if (distinct.size() != 1 || distinct.begin()->rfind("128 ", 0) != 0) {
    verdict = absl::StrFormat("FAILED: %d distinct ids (%s)", distinct.size(), *distinct.begin());
  } else if (o.max_wall_s > 0 && s.wall_s > o.max_wall_s) {
    verdict = absl::StrFormat("FAILED: over %.0f s", o.max_wall_s);
  }
  std::printf("| %d | %d/%d | %.2f | %.2f | %s | %s | %s | %.2f / %.2f | %.2f | %s |\n", ranks,
              s.ok_ranks, ranks, s.wall_s, s.connect_wall_s, Ms(r.hist, "join").c_str(),
              Ms(r.hist, "connect").c_str(), Ms(r.hist, "exchange").c_str(), s.rank_p50_ms,
              s.rank_p99_ms, coord_cpu, verdict.c_str());
  std::fflush(stdout);
  return verdict == "ok";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"latchkey rendezvous benchmark: the TCP store and the NCCL unique-id exchange"};
  Options o;
  std::string role;
  latchkey::bench::StoreClientArgs sc;
  latchkey::bench::UniqueIdArgs ui;
  app.add_option("--clients", o.clients, "store clients per row (comma-separated; '' none)")
      ->capture_default_str();
  app.add_option("--groups", o.groups, "groupings: dp (one group of all), tpK (groups of K)")
      ->capture_default_str();
  app.add_option("--read", o.read, "read patterns: each, gathered, mesh")->capture_default_str();
  app.add_option("--unique-id-ranks", o.unique_id_ranks, "ranks of the unique-id row (0: none)")
      ->capture_default_str();
  app.add_option("--per-process", o.per_process, "simulated ranks per child process")
      ->capture_default_str();
  app.add_option("--timeout-s", o.timeout_s, "store timeout and row deadline")
      ->capture_default_str();
  app.add_option("--max-wall-s", o.max_wall_s, "fail a row whose wall exceeds this (0: never)")
      ->capture_default_str();
  app.add_option("--coordinator-bin", o.coordinator_bin, "latchkey-coordinator binary")
      ->capture_default_str();
  // Child processes (rendezvous_roles.h).
  app.add_option("--role", role, "internal: host, clients or ranks")->group("");
  for (auto* opt : {app.add_option("--port", sc.port), app.add_option("--world", sc.world),
                    app.add_option("--group", sc.group), app.add_option("--out", sc.out),
                    app.add_option("--first", sc.first), app.add_option("--count", sc.count),
                    app.add_option("--coordinator", ui.coordinator),
                    app.add_option("--job", ui.job_id), app.add_option("--token", ui.join_token)}) {
    opt->group("");
  }
  CLI11_PARSE(app, argc, argv);
  // Every store client holds two sockets: 2,048 descriptors per 1,024 clients of a child.
  latchkey::bench::RaiseOpenFileLimit();
  if (role == "host") return latchkey::bench::RunStoreHost(sc.port, sc.world, o.timeout_s);
  if (role == "clients") {
    sc.read = o.read;
    sc.timeout_s = o.timeout_s;
    return latchkey::bench::RunStoreClients(sc);
  }
  if (role == "ranks") {
    ui.first = sc.first;
    ui.count = sc.count;
    ui.out = sc.out;
    ui.timeout_s = o.timeout_s;
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // see server/main.cc
    return latchkey::bench::RunUniqueIdRanks(ui);
  }
  latchkey::bench::RaiseFdLimit();
  bool ok = true;
  std::vector<std::string> clients = absl::StrSplit(o.clients, ',', absl::SkipEmpty());
  if (!clients.empty()) {
    std::printf("\nTCP store: every rank sets its address and reads its group's (%u cores)\n",
                std::thread::hardware_concurrency());
    std::printf(
        "| clients | groups | read | ranks ok | wall s | connect wall s | connect p50/p99 ms |"
        " set p50/p99 ms | wait p50/p99 ms | get p50/p99 ms | rank p50/p99 ms | store calls |"
        " store host CPU s | result |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
    for (const std::string& c : clients) {
      for (absl::string_view g : absl::StrSplit(o.groups, ',', absl::SkipEmpty())) {
        for (absl::string_view r : absl::StrSplit(o.read, ',', absl::SkipEmpty())) {
          ok = StoreRow(o, std::atoi(c.c_str()), std::string(g), std::string(r)) && ok;
        }
      }
    }
  }
  if (o.unique_id_ranks > 0) {
    std::printf(
        "\nNCCL unique id: Join at the coordinator, ExchangeNcclUniqueId on the world group\n");
    std::printf(
        "| ranks | ranks ok | wall s | join+connect wall s | join p50/p99 ms | connect p50/p99 ms"
        " | exchange p50/p99 ms | rank p50/p99 ms | coordinator CPU s | result |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
    ok = UniqueIdRow(o, o.unique_id_ranks) && ok;
  }
  return ok ? 0 : 1;
}
