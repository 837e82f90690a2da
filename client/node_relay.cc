#include "client/node_relay.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "latchkey/v1/worker_service.grpc.pb.h"

namespace latchkey {
namespace {

namespace v1 = latchkey::v1;

// One rank's call, held until its node call is answered.
template <typename Request, typename Response>
struct Entry {
  Request req;
  Response* resp = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;
};
using HeartbeatEntry = Entry<v1::HeartbeatRequest, v1::HeartbeatResponse>;
using ReportEntry = Entry<v1::ReportStepRequest, v1::ReportStepResponse>;

// The entries of one node call still being gathered: since when, from which ranks.
template <typename E>
struct Gathering {
  std::vector<E> entries;
  std::set<int> ranks;
  absl::Time first = absl::InfiniteFuture();
};

grpc::Status FromCallStatus(const v1::CallStatus& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message(), s.details());
}

}  // namespace

struct NodeRelay::Impl final : public v1::WorkerService::CallbackService {
  NodeRelayOptions o;
  std::unique_ptr<v1::WorkerService::Stub> coordinator;
  std::unique_ptr<grpc::Server> server;

  mutable absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  Gathering<HeartbeatEntry> heartbeats ABSL_GUARDED_BY(mu);
  std::map<int64_t, Gathering<ReportEntry>> reports ABSL_GUARDED_BY(mu);  // by step
  NodeRelayCounts counts ABSL_GUARDED_BY(mu);
  absl::CondVar arrived;  // an entry came in, or the relay stops
  // The node calls in flight (cancelled when the relay stops).
  grpc::ClientContext* heartbeat_call ABSL_GUARDED_BY(mu) = nullptr;
  grpc::ClientContext* report_call ABSL_GUARDED_BY(mu) = nullptr;
  std::thread heartbeat_thread, report_thread;

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    absl::MutexLock lock(&mu);
    if (stopping) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node agent is stopping"));
      return reactor;
    }
    if (heartbeats.entries.empty()) heartbeats.first = absl::Now();
    heartbeats.entries.push_back({*req, resp, reactor});
    heartbeats.ranks.insert(req->rank());
    arrived.SignalAll();
    return reactor;
  }

  grpc::ServerUnaryReactor* ReportStep(grpc::CallbackServerContext* ctx,
                                       const v1::ReportStepRequest* req,
                                       v1::ReportStepResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    absl::MutexLock lock(&mu);
    if (stopping) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node agent is stopping"));
      return reactor;
    }
    Gathering<ReportEntry>& g = reports[req->step()];
    if (g.entries.empty()) g.first = absl::Now();
    g.entries.push_back({*req, resp, reactor});
    g.ranks.insert(req->rank());
    arrived.SignalAll();
    return reactor;
  }

  // Whether the gathering's node call is due; else when it will be at the latest (`*due`).
  template <typename E>
  bool Ready(const Gathering<E>& g, absl::Duration wait, absl::Time* due) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    if (g.entries.empty()) return false;
    if (static_cast<int>(g.ranks.size()) >= o.local_ranks || absl::Now() >= g.first + wait) {
      return true;
    }
    *due = std::min(*due, g.first + wait);
    return false;
  }

  // Waits until a node call of heartbeats is due (or the relay stops); takes its entries.
  std::vector<HeartbeatEntry> NextHeartbeats() {
    absl::MutexLock lock(&mu);
    while (!stopping) {
      absl::Time due = absl::Now() + absl::Seconds(1);
      if (Ready(heartbeats, o.heartbeat_wait, &due)) {
        std::vector<HeartbeatEntry> out = std::move(heartbeats.entries);
        heartbeats = {};
        return out;
      }
      arrived.WaitWithDeadline(&mu, due);
    }
    return {};
  }

  std::vector<ReportEntry> NextReports() {
    absl::MutexLock lock(&mu);
    while (!stopping) {
      absl::Time due = absl::Now() + absl::Seconds(1);
      for (auto it = reports.begin(); it != reports.end(); ++it) {
        if (Ready(it->second, o.report_wait, &due)) {
          std::vector<ReportEntry> out = std::move(it->second.entries);
          reports.erase(it);
          return out;
        }
      }
      arrived.WaitWithDeadline(&mu, due);
    }
    return {};
  }

  // The node call, cancelled if the relay stops meanwhile.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::ClientContext** slot,
                    grpc::Status (v1::WorkerService::Stub::*method)(grpc::ClientContext*,
                                                                    const Request&, Response*),
                    const Request& req, Response* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.call_timeout));
    {
      absl::MutexLock lock(&mu);
      if (stopping)
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node agent is stopping");
      *slot = &ctx;
    }
    const grpc::Status st = (coordinator.get()->*method)(&ctx, req, resp);
    absl::MutexLock lock(&mu);
    *slot = nullptr;
    return st;
  }

  void ForwardHeartbeats() {
    while (true) {
      std::vector<HeartbeatEntry> batch = NextHeartbeats();
      if (batch.empty()) return;
      v1::NodeHeartbeatRequest req;
      req.set_node(o.node);
      for (const HeartbeatEntry& e : batch) *req.add_heartbeats() = e.req;
      v1::NodeHeartbeatResponse resp;
      const grpc::Status st =
          Call(&heartbeat_call, &v1::WorkerService::Stub::NodeHeartbeat, req, &resp);
      {
        // Counted before the ranks hear back: a rank answered finds its call counted.
        absl::MutexLock lock(&mu);
        ++counts.node_heartbeats;
        counts.heartbeats += static_cast<int64_t>(batch.size());
      }
      Answer(batch, st, resp);
    }
  }

  void ForwardReports() {
    while (true) {
      std::vector<ReportEntry> batch = NextReports();
      if (batch.empty()) return;
      v1::ReportStepsRequest req;
      req.set_node(o.node);
      for (const ReportEntry& e : batch) *req.add_reports() = e.req;
      v1::ReportStepsResponse resp;
      const grpc::Status st = Call(&report_call, &v1::WorkerService::Stub::ReportSteps, req, &resp);
      {
        absl::MutexLock lock(&mu);
        ++counts.report_calls;
        counts.reports += static_cast<int64_t>(batch.size());
      }
      Answer(batch, st, resp);
    }
  }

  // Each entry gets its own outcome; all of them the node call's failure when it failed (or
  // when the coordinator answered fewer entries than it was sent).
  template <typename E, typename NodeResponse>
  static void Answer(std::vector<E>& batch, const grpc::Status& st, const NodeResponse& resp) {
    const bool whole = st.ok() && resp.statuses_size() == static_cast<int>(batch.size()) &&
                       resp.responses_size() == static_cast<int>(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!whole) {
        batch[i].reactor->Finish(st.ok() ? grpc::Status(grpc::StatusCode::INTERNAL,
                                                        "the coordinator answered a node call "
                                                        "with fewer entries than it was sent")
                                         : st);
        continue;
      }
      const int k = static_cast<int>(i);
      *batch[i].resp = resp.responses(k);
      batch[i].reactor->Finish(FromCallStatus(resp.statuses(k)));
    }
  }

  void FailWaiting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const grpc::Status gone(grpc::StatusCode::UNAVAILABLE, "the node agent is stopping");
    for (HeartbeatEntry& e : heartbeats.entries) e.reactor->Finish(gone);
    heartbeats = {};
    for (auto& [step, g] : reports) {
      for (ReportEntry& e : g.entries) e.reactor->Finish(gone);
    }
    reports.clear();
  }
};

absl::StatusOr<std::unique_ptr<NodeRelay>> NodeRelay::Start(
    NodeRelayOptions options, std::shared_ptr<grpc::Channel> coordinator) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  impl->coordinator = v1::WorkerService::NewStub(coordinator);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(impl->o.listen, grpc::InsecureServerCredentials());
  builder.RegisterService(impl.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server) {
    return absl::InternalError("the node relay cannot listen on " + impl->o.listen);
  }
  Impl* p = impl.get();
  impl->heartbeat_thread = std::thread([p] { p->ForwardHeartbeats(); });
  impl->report_thread = std::thread([p] { p->ForwardReports(); });
  return std::unique_ptr<NodeRelay>(new NodeRelay(std::move(impl)));
}

NodeRelay::NodeRelay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NodeRelay::~NodeRelay() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
    impl_->FailWaiting();
    impl_->arrived.SignalAll();
    if (impl_->heartbeat_call) impl_->heartbeat_call->TryCancel();
    if (impl_->report_call) impl_->report_call->TryCancel();
  }
  impl_->heartbeat_thread.join();
  impl_->report_thread.join();
  impl_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

NodeRelayCounts NodeRelay::counts() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->counts;
}

}  // namespace latchkey
