// PeerProber: this rank's side of partition detection (docs/fault-tolerance.md "Partitions",
// common/reachability.h). It listens on a probe port (every connection accepted and closed at
// once), and while active probes its peers' probe ports: a TCP connect within a deadline, where
// an answer or a refusal means the host is reachable and a timeout or a routing error means it
// is not. It also measures how many bytes the process's TCP connections to its peers' hosts
// have moved (the kernel's tcp_info), which tells a slow collective from a stalled one.
//
// Thread contract: one prober thread of its own accepts and probes; SetPeers, SetActive,
// Latest, port and PeerBytes may be called from any thread (under the prober's mutex).
#ifndef LATCHKEY_WORKER_SESSION_PEER_PROBER_H_
#define LATCHKEY_WORKER_SESSION_PEER_PROBER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/reachability.h"

namespace latchkey {

struct PeerProberOptions {
  std::string host;                                // listen address; "": every address
  absl::Duration deadline = absl::Seconds(1);      // one probe's connect deadline
  absl::Duration every = absl::Milliseconds(500);  // between rounds while active
};

class PeerProber {
 public:
  static absl::StatusOr<std::unique_ptr<PeerProber>> Start(PeerProberOptions options);
  ~PeerProber();
  PeerProber(const PeerProber&) = delete;
  PeerProber& operator=(const PeerProber&) = delete;

  int port() const { return port_; }
  // The peers to probe from now on; `self` (this rank) is left out.
  void SetPeers(int self, const PeerList& peers);
  int64_t peers_version() const;  // of the list set (0: none)
  // Rounds run while active (the first at once).
  void SetActive(bool active);
  // The newest round of the current peers if it ended within `max_age`; nullopt otherwise.
  std::optional<Reachability> Latest(absl::Duration max_age) const;
  // Rounds completed so far (a heartbeat goes out at once after a new one).
  uint64_t rounds() const;
  // Bytes this process's TCP connections to the peers' hosts moved so far (acknowledged sent
  // plus received), except connections to `exclude_port` (the coordinator's); nullopt when
  // there are none (the rank's collectives run over shared memory).
  std::optional<uint64_t> PeerBytes(int exclude_port) const;

 private:
  explicit PeerProber(PeerProberOptions options) : opt_(std::move(options)) {}
  void Loop();
  void Round();
  void Accept();

  const PeerProberOptions opt_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};  // a pipe: SetActive and the destructor wake the loop

  mutable absl::Mutex mu_;
  std::vector<PeerAddress> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> peer_ips_ ABSL_GUARDED_BY(mu_);  // resolved by Round
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Reachability> latest_ ABSL_GUARDED_BY(mu_);
  absl::Time latest_time_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, absl::Time> unreachable_since_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_PEER_PROBER_H_
