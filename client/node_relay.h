// The node agent's relay (`latchkey node`; docs/protocol.md "Node calls"). The agent's local
// ranks send their heartbeats and step reports here (LATCHKEY_NODE_RELAY, a unix socket in the
// agent's network namespace) instead of to the coordinator, and the relay forwards them as node
// calls: the local ranks' heartbeats in one NodeHeartbeat, their reports of one step in one
// ReportSteps. A node call goes once every local rank's entry is in, or `*_wait` after the first
// one, whichever comes first. Each rank is answered with its own entry's outcome (status,
// message and details), so its session hears what the coordinator said as if it had called
// itself; a node call that fails (the coordinator unreachable) fails each of its entries the
// same way, and the ranks retry as they would.
//
// Thread-safety: gRPC's threads call in; one forwarding thread per kind of call.
#ifndef LATCHKEY_CLIENT_NODE_RELAY_H_
#define LATCHKEY_CLIENT_NODE_RELAY_H_

#include <grpcpp/channel.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace latchkey {

struct NodeRelayOptions {
  std::string listen;  // e.g. "unix-abstract:latchkey-node-1234"
  std::string node;    // the agent's node identity
  int local_ranks = 1;
  // How long the first entry of a node call waits for the other local ranks' entries.
  absl::Duration heartbeat_wait = absl::Milliseconds(250);
  absl::Duration report_wait = absl::Milliseconds(100);
  absl::Duration call_timeout = absl::Seconds(30);  // each node call's deadline
};

struct NodeRelayCounts {
  int64_t node_heartbeats = 0;  // NodeHeartbeat calls made
  int64_t heartbeats = 0;       // rank heartbeats they carried
  int64_t report_calls = 0;     // ReportSteps calls made
  int64_t reports = 0;          // step reports they carried
};

class NodeRelay {
 public:
  // Serves on options.listen and forwards over `coordinator`. INTERNAL naming the address when
  // it cannot listen.
  static absl::StatusOr<std::unique_ptr<NodeRelay>> Start(
      NodeRelayOptions options, std::shared_ptr<grpc::Channel> coordinator);
  // Stops serving; entries still waiting are answered UNAVAILABLE.
  ~NodeRelay();
  NodeRelay(const NodeRelay&) = delete;
  NodeRelay& operator=(const NodeRelay&) = delete;

  NodeRelayCounts counts() const;

  struct Impl;

 private:
  explicit NodeRelay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace latchkey

#endif  // LATCHKEY_CLIENT_NODE_RELAY_H_
