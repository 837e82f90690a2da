// The coordinator's HTTP port as the real latchkey-coordinator serves it: every contract series
// at 0 from the start (promtool check metrics), the status page's auth rules (a token on a
// non-loopback port with auth on, none on loopback, never for /metrics), HTTPS with a CA made
// here and plaintext refused; and the page's pieces (escaping, charts, the token check) and the
// worker's planned K/V count.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/synchronization/notification.h"
#include "server/coordinator.h"
#include "server/security.h"
#include "server/sqlite_store.h"
#include "server/status_page.h"
#include "tests/support/coordinator_process.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tools.h"
#include "worker/metrics/worker_metrics.h"

namespace latchkey::testing {
namespace {

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// `promtool check metrics` on an exposition; "" when clean, else its output.
std::string Promtool(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/metrics.txt";
  std::ofstream(path) << text;
  const Captured lint = RunAndCapture({"/bin/sh", "-c", "promtool check metrics < " + path});
  return lint.exit_code == 0 ? "" : lint.output + "\n" + text;
}

// A latchkey-coordinator on loopback gRPC; its HTTP port binds `http_host` (port 0): port().
class HttpCoordinator {
 public:
  HttpCoordinator(const std::string& dir, const std::string& http_host,
                  const std::vector<std::string>& extra)
      : c_(LATCHKEY_COORDINATOR_BIN, dir, Options(dir, http_host, extra)) {}
  int port() const { return c_.metrics_port(); }
  std::string log() const { return c_.Log(); }

 private:
  static CoordinatorOptions Options(const std::string& dir, const std::string& http_host,
                                    const std::vector<std::string>& extra) {
    CoordinatorOptions o;
    o.extra = extra;
    o.db = dir + "/c.db";
    o.log = dir + "/coordinator.log";
    o.metrics_host = http_host;
    o.metrics_port = 0;
    return o;
  }
  ScopedCoordinator c_;
};

// GET over plain HTTP to 127.0.0.1; status 0 when no response came.
std::pair<int, std::string> Get(int port, const std::string& path,
                                const httplib::Headers& headers = {}) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5);
  c.set_read_timeout(10);
  auto res = c.Get(path.c_str(), headers);
  if (!res) return {0, ""};
  return {res->status, res->body};
}

const char kReadToken[] = "read-token-for-the-status-page";

std::string WriteTokens(const std::string& dir) {
  const std::string path = dir + "/tokens";
  std::ofstream(path) << "# role name sha256\nread viewer " << Sha256Hex(kReadToken) << "\n";
  return path;
}

TEST(HttpPort, CoordinatorSeriesExistAtZeroFromTheStart) {
  ScopedTempDir dir("obs-coord-metrics");
  HttpCoordinator c(dir.path(), "127.0.0.1", {});
  ASSERT_GT(c.port(), 0) << c.log();
  const auto [status, text] = Get(c.port(), "/metrics");
  ASSERT_EQ(status, 200);
  for (const char* state :
       {"pending", "running", "succeeded", "failed", "cancelled", "recovering"}) {
    EXPECT_TRUE(Has(text, std::string("latchkey_jobs{state=\"") + state + "\"} 0")) << text;
  }
  for (const char* state : {"joined", "active", "done", "lost", "failed"}) {
    EXPECT_TRUE(Has(text, std::string("latchkey_workers{state=\"") + state + "\"} 0")) << text;
  }
  for (const char* mode : {"per_micro_batch", "deferred", "coalesced"}) {
    EXPECT_TRUE(
        Has(text, std::string("latchkey_latches_published_total{kv_mode=\"") + mode + "\"} 0"))
        << text;
  }
  for (const char* series : {"latchkey_stalled_ranks 0", "latchkey_job_restarts_total 0",
                             "latchkey_boundary_arrival_lag_seconds_count 0"}) {
    EXPECT_TRUE(Has(text, series)) << series << "\n" << text;
  }
  EXPECT_EQ(Promtool(dir.path(), text), "");
}

// Connections that send nothing (a stalled client, a browser's spare keep-alive sockets) hold
// a server thread each until the read timeout; a scrape behind 64 of them (twice the endpoint's
// standing threads) still answers at once.
TEST(HttpPort, IdleConnectionsDoNotDelayAScrape) {
  ScopedTempDir dir("obs-idle-conns");
  HttpCoordinator c(dir.path(), "127.0.0.1", {});
  ASSERT_GT(c.port(), 0) << c.log();
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(c.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // every one accepted
  const auto t0 = std::chrono::steady_clock::now();
  const auto [status, text] = Get(c.port(), "/metrics");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int fd : idle) close(fd);
  EXPECT_EQ(status, 200);
  // Without spare threads the scrape waits until the endpoint's 2 s read timeout frees one: at
  // least 1.8 s after the 200 ms above. 1.5 s stays below that and leaves a loaded machine room.
  EXPECT_LT(secs, 1.5) << "a scrape behind 64 idle connections took " << secs << " s";
}

TEST(HttpPort, WorkerSeriesExistAtZeroFromTheStart) {
  ScopedTempDir dir("obs-worker-metrics");
  const std::string text = WorkerMetrics().Serialize();
  for (const char* mode : {"per_micro_batch", "deferred", "coalesced"}) {
    EXPECT_TRUE(Has(text, std::string("latchkey_kv_allreduce_total{mode=\"") + mode + "\"} 0"));
    EXPECT_TRUE(
        Has(text, std::string("latchkey_kv_allreduce_planned_total{mode=\"") + mode + "\"} 0"))
        << text;
    EXPECT_TRUE(Has(
        text, std::string("latchkey_replicated_allreduce_calls_total{mode=\"") + mode + "\"} 0"))
        << text;
    EXPECT_TRUE(Has(
        text, std::string("latchkey_replicated_allreduce_planned_total{mode=\"") + mode + "\"} 0"))
        << text;
  }
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"}) {
    for (const char* group : {"world", "tp", "dp"}) {
      const std::string labels = std::string("{group=\"") + group + "\",op=\"" + op + "\"}";
      EXPECT_TRUE(Has(text, "latchkey_collective_calls_total" + labels + " 0")) << labels;
      EXPECT_TRUE(Has(text, "latchkey_collective_bytes_total" + labels + " 0")) << labels;
      EXPECT_TRUE(Has(text, "latchkey_collective_seconds_count" + labels + " 0")) << labels;
    }
  }
  for (const char* series :
       {"latchkey_step_seconds_count 0", "latchkey_optimizer_steps_total 0",
        "latchkey_tokens_total 0", "latchkey_loss 0", "latchkey_grad_norm 0",
        "latchkey_optimizer_state_bytes 0", "latchkey_peak_memory_bytes 0",
        "latchkey_activation_memory_bytes 0", "latchkey_reserved_memory_bytes 0",
        "latchkey_latch_wait_seconds_count 0", "latchkey_learning_rate 0", "latchkey_eval_loss 0",
        "latchkey_eval_collective_calls_total 0", "latchkey_checkpoint_seconds_count 0",
        "latchkey_checkpoint_bytes_total 0", "latchkey_last_checkpoint_timestamp_seconds 0",
        "latchkey_checkpoint_failures_total 0"}) {
    EXPECT_TRUE(Has(text, series)) << series << "\n" << text;
  }
  EXPECT_EQ(Promtool(dir.path(), text), "");
}

TEST(HttpPort, PlannedKvAllReducesFollowTheLatch) {
  JobSpec spec;
  spec.model.n_layer = 24;
  spec.model.multi_query = true;
  spec.tp = 2;
  Latch latch;
  latch.n = 32;
  latch.kv_mode = KvMode::kPerMicroBatch;
  EXPECT_EQ(PlannedKvAllReduces(spec, latch), 1536);
  latch.kv_mode = KvMode::kDeferred;
  EXPECT_EQ(PlannedKvAllReduces(spec, latch), 48);
  latch.kv_mode = KvMode::kCoalesced;
  EXPECT_EQ(PlannedKvAllReduces(spec, latch), 1);
  spec.tp = 1;  // no TP group: nothing to reduce
  EXPECT_EQ(PlannedKvAllReduces(spec, latch), 0);
  spec.tp = 2;
  spec.model.multi_query = false;  // MHA shards its K/V heads: no replicated rows
  latch.kv_mode = KvMode::kPerMicroBatch;
  EXPECT_EQ(PlannedKvAllReduces(spec, latch), 0);
}

// Every TP reduction of replicated-parameter gradients: K/V's 2 tensors per layer (MQA) and,
// under sequence parallelism, 6 per layer + ln_f's 2, per tensor or one coalesced
// (docs/memory.md, "Sequence parallelism").
TEST(HttpPort, PlannedReplicatedAllReducesFollowTheLatch) {
  JobSpec spec;
  spec.model.n_layer = 24;
  spec.model.multi_query = true;
  spec.tp = 2;
  Latch latch;
  latch.n = 32;
  // Without sequence parallelism the replicated reductions are the K/V ones.
  for (KvMode mode : {KvMode::kPerMicroBatch, KvMode::kDeferred, KvMode::kCoalesced}) {
    latch.kv_mode = mode;
    EXPECT_EQ(PlannedReplicatedAllReduces(spec, latch), PlannedKvAllReduces(spec, latch));
  }
  spec.sequence_parallel = true;
  latch.kv_mode = KvMode::kPerMicroBatch;
  EXPECT_EQ(PlannedReplicatedAllReduces(spec, latch), (48 + 146) * 32);
  latch.kv_mode = KvMode::kDeferred;
  EXPECT_EQ(PlannedReplicatedAllReduces(spec, latch), 48 + 146);
  latch.kv_mode = KvMode::kCoalesced;
  EXPECT_EQ(PlannedReplicatedAllReduces(spec, latch), 1);
  spec.model.multi_query = false;  // MHA: SP's tensors alone
  latch.kv_mode = KvMode::kDeferred;
  EXPECT_EQ(PlannedReplicatedAllReduces(spec, latch), 146);
  EXPECT_EQ(PlannedKvAllReduces(spec, latch), 0);
  spec.tp = 1;
  EXPECT_EQ(PlannedReplicatedAllReduces(spec, latch), 0);
}

TEST(HttpPort, StatusPageNeedsTheReadTokenOnANonLoopbackPortWithAuth) {
  ScopedTempDir dir("obs-auth");
  HttpCoordinator c(dir.path(), "0.0.0.0", {"--auth-tokens", WriteTokens(dir.path())});
  ASSERT_GT(c.port(), 0) << c.log();
  for (const char* path : {"/", "/jobs/some-job"}) {
    const auto [status, body] = Get(c.port(), path);
    EXPECT_EQ(status, 401) << path << " " << body;
    httplib::Client cl("127.0.0.1", c.port());
    auto res = cl.Get(path);
    ASSERT_TRUE(res);
    EXPECT_TRUE(Has(res->get_header_value("WWW-Authenticate"), "Basic")) << path;
    EXPECT_EQ(Get(c.port(), path, {{"Authorization", "Bearer wrong-token"}}).first, 401) << path;
    EXPECT_EQ(Get(c.port(), path, {{"Authorization", "Bearer "}}).first, 401) << path;
  }
  EXPECT_EQ(Get(c.port(), "/", {{"Authorization", std::string("Bearer ") + kReadToken}}).first,
            200);
  const std::string basic = "Basic " + absl::Base64Escape(std::string("anyone:") + kReadToken);
  EXPECT_EQ(Get(c.port(), "/", {{"Authorization", basic}}).first, 200);
  const std::string wrong_basic = "Basic " + absl::Base64Escape(std::string(kReadToken) + ":x");
  EXPECT_EQ(Get(c.port(), "/", {{"Authorization", wrong_basic}}).first, 401);
  // An unknown job with the token: 404, not 401.
  EXPECT_EQ(
      Get(c.port(), "/jobs/nope", {{"Authorization", std::string("Bearer ") + kReadToken}}).first,
      404);
  // /metrics never needs a token.
  const auto [status, text] = Get(c.port(), "/metrics");
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(Has(text, "latchkey_jobs{state=\"running\"}")) << text;
}

TEST(HttpPort, StatusPageIsOpenOnLoopbackWithAuth) {
  ScopedTempDir dir("obs-loopback");
  HttpCoordinator c(dir.path(), "127.0.0.1", {"--auth-tokens", WriteTokens(dir.path())});
  ASSERT_GT(c.port(), 0) << c.log();
  const auto [status, body] = Get(c.port(), "/");
  EXPECT_EQ(status, 200) << body;
  EXPECT_TRUE(Has(body, "latchkey jobs")) << body;
  EXPECT_TRUE(Has(body, "http-equiv=\"refresh\"")) << body;
}

TEST(HttpPort, StatusPageEscapesTheJobIdOfAnUnknownJob) {
  ScopedTempDir dir("obs-escape");
  HttpCoordinator c(dir.path(), "127.0.0.1", {});
  ASSERT_GT(c.port(), 0) << c.log();
  // The path is decoded before routing: an id without a slash reaches the page.
  const auto [status, body] = Get(c.port(), "/jobs/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E");
  EXPECT_EQ(status, 404) << body;
  EXPECT_FALSE(Has(body, "<img")) << body;
  EXPECT_TRUE(Has(body, "job &lt;img src=x onerror=alert(1)&gt;")) << body;
}

TEST(HttpPort, HttpsWithTheGrpcCertificateAndPlaintextRefused) {
  LATCHKEY_REQUIRE_TOOL("openssl", "Debian package openssl");
  LATCHKEY_REQUIRE_TOOL("curl", "Debian package curl");
  ScopedTempDir dir("obs-tls");
  const std::string script =
      "set -e; cd " + dir.path() +
      "; K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'"
      "; openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=latchkey-test-ca"
      "; openssl req $K -keyout server.key -out server.csr -subj /CN=localhost"
      "; printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext"
      "; openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
      " -out server.pem -days 2 -extfile san.ext";
  Captured made = RunAndCapture({"sh", "-c", script});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  HttpCoordinator c(
      dir.path(), "127.0.0.1",
      {"--tls-cert", dir.path() + "/server.pem", "--tls-key", dir.path() + "/server.key"});
  ASSERT_GT(c.port(), 0) << c.log();
  EXPECT_TRUE(Has(c.log(), "(https, status page at /)")) << c.log();
  const std::string https = "https://127.0.0.1:" + std::to_string(c.port());
  // curl verifying against the CA made here.
  Captured ok = RunAndCapture(
      {"curl", "-sS", "--max-time", "10", "--cacert", dir.path() + "/ca.pem", https + "/metrics"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(Has(ok.output, "latchkey_jobs{state=\"running\"} 0")) << ok.output;
  Captured page =
      RunAndCapture({"curl", "-sS", "--max-time", "10", "--cacert", dir.path() + "/ca.pem", "-o",
                     "/dev/null", "-w", "%{http_code}", https + "/"});
  EXPECT_EQ(page.output, "200") << page.output;
  // httplib's SSL client verifying the same CA.
  httplib::SSLClient ssl("127.0.0.1", c.port());
  ssl.set_ca_cert_path((dir.path() + "/ca.pem").c_str());
  ssl.enable_server_certificate_verification(true);
  ssl.set_connection_timeout(5);
  auto res = ssl.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  // Without the CA the certificate does not verify; plaintext HTTP gets no HTTP answer.
  Captured no_ca = RunAndCapture({"curl", "-sS", "--max-time", "10", https + "/metrics"});
  EXPECT_NE(no_ca.exit_code, 0) << no_ca.output;
  Captured plain =
      RunAndCapture({"curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}",
                     "http://127.0.0.1:" + std::to_string(c.port()) + "/metrics"});
  EXPECT_TRUE(plain.exit_code != 0 || plain.output.rfind("000", 0) == 0 ||
              plain.output.rfind("400", 0) == 0)
      << plain.exit_code << " " << plain.output;
  EXPECT_FALSE(Has(plain.output, "latchkey_jobs")) << plain.output;
}

// A SqliteStore in a file whose audit reads wait until released: a job page caught inside its
// audit read, to see what else may run meanwhile.
class GatedAuditStore : public JobStore, public AuditReader {
 public:
  explicit GatedAuditStore(std::unique_ptr<SqliteStore> inner) : inner_(std::move(inner)) {}
  absl::Notification& entered() { return entered_; }
  void Release() { release_.Notify(); }

  AuditReader* audit_reader() override { return this; }
  absl::StatusOr<AuditRows> ReadAudit(const std::string& job_id, int64_t start_window,
                                      int64_t limit) override {
    if (!entered_.HasBeenNotified()) entered_.Notify();
    release_.WaitForNotification();
    return inner_->audit_reader()->ReadAudit(job_id, start_window, limit);
  }

  absl::Status CreateJob(const JobRecord& j) override { return inner_->CreateJob(j); }
  absl::Status UpdateJob(const JobRecord& j) override { return inner_->UpdateJob(j); }
  absl::Status UpdateJobWithEvent(const JobRecord& j, const JobEventRecord& e) override {
    return inner_->UpdateJobWithEvent(j, e);
  }
  absl::Status AppendEvent(const JobEventRecord& e) override { return inner_->AppendEvent(e); }
  absl::Status PutCheckpoint(const CheckpointRecord& c, const JobRecord& j,
                             const JobEventRecord& e) override {
    return inner_->PutCheckpoint(c, j, e);
  }
  absl::Status BeginAttempt(const JobRecord& j, const AttemptRecord& a, const PolicyChangeRecord* c,
                            const JobEventRecord& e) override {
    return inner_->BeginAttempt(j, a, c, e);
  }
  absl::Status PutWorker(const WorkerRecord& w) override { return inner_->PutWorker(w); }
  absl::Status AppendLatches(const std::string& id, const std::vector<PublishedLatch>& l,
                             int64_t next_window, int64_t next_m,
                             int64_t next_first_sample) override {
    return inner_->AppendLatches(id, l, next_window, next_m, next_first_sample);
  }
  absl::Status AppendPolicyChange(const PolicyChangeRecord& c) override {
    return inner_->AppendPolicyChange(c);
  }
  absl::StatusOr<bool> InsertStepReport(const StepReportRecord& r) override {
    return inner_->InsertStepReport(r);
  }
  absl::StatusOr<std::vector<JobRecord>> LoadJobs() override { return inner_->LoadJobs(); }
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() override { return inner_->LoadWorkers(); }
  absl::StatusOr<std::vector<RankProgress>> LoadProgress() override {
    return inner_->LoadProgress();
  }
  absl::StatusOr<std::vector<PublishedLatch>> LoadLatches(const std::string& id, int64_t start,
                                                          int64_t limit) override {
    return inner_->LoadLatches(id, start, limit);
  }
  absl::StatusOr<std::vector<PolicyChangeRecord>> LoadPolicyChanges(
      const std::string& id) override {
    return inner_->LoadPolicyChanges(id);
  }
  absl::StatusOr<std::vector<StepReportRecord>> LoadStepReports(const std::string& id,
                                                                int64_t from_step) override {
    return inner_->LoadStepReports(id, from_step);
  }
  absl::StatusOr<StepReportRecord> LoadStepReport(const std::string& id, int rank,
                                                  int64_t step) override {
    return inner_->LoadStepReport(id, rank, step);
  }
  absl::StatusOr<std::vector<CheckpointRecord>> LoadCheckpoints(const std::string& id) override {
    return inner_->LoadCheckpoints(id);
  }
  absl::StatusOr<std::vector<AttemptRecord>> LoadAttempts(const std::string& id) override {
    return inner_->LoadAttempts(id);
  }
  absl::StatusOr<std::vector<JobEventRecord>> LoadEvents(const std::string& id) override {
    return inner_->LoadEvents(id);
  }

 private:
  std::unique_ptr<SqliteStore> inner_;
  absl::Notification entered_;
  absl::Notification release_;
};

// While a job page is inside its audit read, the coordinator's calls (a read, a submission, which
// writes the store) still complete: the page holds no coordinator lock around the store.
TEST(StatusPagePieces, JobPageReadsTheAuditWithoutHoldingTheCoordinator) {
  ScopedTempDir dir;
  auto sqlite = SqliteStore::Open(dir.path() + "/c.db");
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  ASSERT_NE((*sqlite)->audit_reader(), nullptr);
  auto owned = std::make_unique<GatedAuditStore>(*std::move(sqlite));
  GatedAuditStore* store = owned.get();
  auto core = Coordinator::Create(std::move(owned), {}, nullptr);
  ASSERT_TRUE(core.ok()) << core.status();
  auto job = (*core)->SubmitJob({SpecJson(), "", "", 0});
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job.record.job_id;
  StatusPage page(core->get(), nullptr);

  HttpResponse response;
  std::thread reader([&] { response = page.Job(HttpRequest{"/jobs/" + id, {id}, ""}); });
  const bool in_read = store->entered().WaitForNotificationWithTimeout(absl::Seconds(30));
  absl::Notification calls_done;
  std::thread calls([&] {
    EXPECT_TRUE((*core)->GetJob(id, true).ok());
    EXPECT_TRUE((*core)->SubmitJob({SpecJson(), "", "", 0}).ok());
    calls_done.Notify();
  });
  // Behind a held coordinator lock they would wait for the release below.
  const bool calls_ran = calls_done.WaitForNotificationWithTimeout(absl::Seconds(30));
  store->Release();
  calls.join();
  reader.join();
  EXPECT_TRUE(in_read);
  EXPECT_TRUE(calls_ran);
  EXPECT_EQ(response.status, 200) << response.body;
  EXPECT_TRUE(Has(response.body, "<h2>latch audit</h2><p>0 latch(es) published")) << response.body;
  EXPECT_TRUE(Has(response.body, "<table id=\"events\">")) << response.body;
}

TEST(StatusPagePieces, EscapesMarkup) {
  EXPECT_EQ(HtmlEscape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
}

TEST(StatusPagePieces, TokenCheckTakesBearerAndBasic) {
  auto table = TokenTable::Parse("read viewer " + Sha256Hex(kReadToken) + "\n", "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(StatusPageAuthorized(*table, std::string("Bearer ") + kReadToken));
  EXPECT_TRUE(
      StatusPageAuthorized(*table, "Basic " + absl::Base64Escape(std::string("u:") + kReadToken)));
  EXPECT_TRUE(
      StatusPageAuthorized(*table, "basic " + absl::Base64Escape(std::string(":") + kReadToken)));
  EXPECT_FALSE(StatusPageAuthorized(*table, ""));
  EXPECT_FALSE(StatusPageAuthorized(*table, "Bearer nope"));
  EXPECT_FALSE(StatusPageAuthorized(*table, "Basic !!!not-base64"));
  EXPECT_FALSE(StatusPageAuthorized(*table, "Basic " + absl::Base64Escape(kReadToken)));
}

TEST(StatusPagePieces, ChartDrawsEveryPointAndThinsLongHistories) {
  ChartSeries s{"loss <1>", "#123456", {0, 1, 2, 3}, {4.0, 3.0, 2.5, 2.0}};
  const std::string svg = SvgChart("loss", {s});
  EXPECT_TRUE(Has(svg, "<svg")) << svg;
  EXPECT_TRUE(Has(svg, "loss &lt;1&gt;")) << svg;
  const std::regex circle("<circle ");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(svg.begin(), svg.end(), circle), std::sregex_iterator()),
      4 + 1);  // a marker per point and the legend's
  ChartSeries big{"k", "#000", {}, {}};
  for (int i = 0; i < 5000; ++i) {
    big.x.push_back(i);
    big.y.push_back(i % 7);
  }
  const std::string thin = SvgChart("kv", {big});
  const auto dots =
      std::distance(std::sregex_iterator(thin.begin(), thin.end(), circle), std::sregex_iterator());
  EXPECT_GT(dots, 300);
  EXPECT_LE(dots, 401 + 1);
  EXPECT_TRUE(Has(SvgChart("empty", {}), "no data yet"));
}

// The labels of one tick group ("tick-x" or "tick-y") of a chart, in order.
std::vector<std::string> TickLabels(const std::string& svg, const std::string& group) {
  const size_t from = svg.find("<g class=\"" + group + "\"");
  if (from == std::string::npos) return {};
  const std::string g = svg.substr(from, svg.find("</g>", from) - from);
  std::vector<std::string> out;
  const std::regex text(">([^<]+)</text>");
  for (std::sregex_iterator it(g.begin(), g.end(), text), end; it != end; ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

TEST(StatusPagePieces, ChartTicksAreNiceValuesCoveringTheData) {
  ChartSeries loss{"loss", "#1f77b4", {0, 3, 7, 10}, {4.0, 3.0, 2.5, 2.0}};
  ChartSeries eval{"eval loss", "#d62728", {3, 7}, {3.2, 2.7}, ChartMarker::kDiamond, true};
  const std::string svg = SvgChart("loss per step", {loss, eval}, "loss");
  EXPECT_EQ(TickLabels(svg, "tick-x"), (std::vector<std::string>{"0", "2", "4", "6", "8", "10"}));
  EXPECT_EQ(TickLabels(svg, "tick-y"),
            (std::vector<std::string>{"2.0", "2.5", "3.0", "3.5", "4.0"}));
  // Steps are whole: a short job's axis does not tick at fractions.
  ChartSeries two{"kv", "#000", {5, 6}, {1, 1}};
  EXPECT_EQ(TickLabels(SvgChart("kv", {two}), "tick-x"), (std::vector<std::string>{"5", "6"}));
  // A constant series gets a range around it.
  EXPECT_EQ(TickLabels(SvgChart("kv", {two}), "tick-y"),
            (std::vector<std::string>{"0.4", "0.6", "0.8", "1.0", "1.2", "1.4", "1.6"}));
  // The eval loss: its own marker (diamonds), dashed, in the legend under the title.
  EXPECT_TRUE(Has(svg,
                  "data-series=\"eval loss\" fill=\"none\" stroke=\"#d62728\" "
                  "stroke-width=\"1.5\" stroke-dasharray=\"4 2\""))
      << svg;
  const std::regex diamond("<path class=\"marker\"");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(svg.begin(), svg.end(), diamond), std::sregex_iterator()),
      2 + 1);  // its two points and its legend entry
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(svg, m, std::regex("class=\"chart-title\" x=\"[0-9.]+\" y=\"([0-9.]+)\"")));
  const double title_y = std::stod(m[1]);
  ASSERT_TRUE(
      std::regex_search(svg, m, std::regex("class=\"legend\" x=\"[0-9.]+\" y=\"([0-9.]+)\"")));
  EXPECT_GE(std::stod(m[1]) - title_y, 15.0) << svg;  // a line of its own
  EXPECT_TRUE(Has(svg, ">step</text>")) << svg;
  EXPECT_TRUE(Has(svg, "transform=\"rotate(-90 14 ")) << svg;  // the y label along the axis
}

}  // namespace
}  // namespace latchkey::testing
