// PeerProber (peer_prober.h) on real sockets: a peer that listens is reachable, one that refuses
// is reachable too (its host answered), an address that cannot be reached is not (and for
// longer and longer), and PeerBytes counts the bytes of connections to the peers' hosts only.
#include "worker/session/peer_prober.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "gtest/gtest.h"

namespace latchkey {
namespace {

std::unique_ptr<PeerProber> Started(const std::string& host = "127.0.0.1") {
  PeerProberOptions o;
  o.host = host;
  o.deadline = absl::Milliseconds(300);
  o.every = absl::Milliseconds(50);
  auto p = PeerProber::Start(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

// A port on 127.0.0.1 nothing listens on (bound, then closed).
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::optional<Reachability> WaitRound(PeerProber& p, uint64_t after) {
  for (int i = 0; i < 200 && p.rounds() <= after; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return p.Latest(absl::Seconds(5));
}

TEST(PeerProberTest, ListeningAndRefusingPeersAreReachableASilentAddressIsNot) {
  auto self = Started();
  auto other = Started();
  ASSERT_TRUE(self && other);
  PeerList peers;
  peers.version = 7;
  // A multicast address: TCP cannot connect to it (a routing error, as for a blackholed host;
  // the silent kind, a timeout, is what the simulated-host tests cut).
  peers.peers = {{0, "127.0.0.1", self->port()},
                 {1, "127.0.0.1", other->port()},
                 {2, "127.0.0.1", ClosedPort()},
                 {3, "224.0.0.1", 9}};
  self->SetPeers(0, peers);
  EXPECT_EQ(self->peers_version(), 7);
  EXPECT_FALSE(self->Latest(absl::Seconds(5)).has_value());
  self->SetActive(true);
  auto first = WaitRound(*self, 0);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->peers_version, 7);
  EXPECT_EQ(first->probed, 3);  // itself left out
  EXPECT_EQ(first->unreachable, std::vector<int>{3});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto later = WaitRound(*self, self->rounds());
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->unreachable, std::vector<int>{3});
  EXPECT_GT(later->unreachable_seconds, first->unreachable_seconds);
  EXPECT_GE(later->unreachable_seconds, 0.5);

  // Inactive: no more rounds.
  self->SetActive(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const uint64_t rounds = self->rounds();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(self->rounds(), rounds);
}

TEST(PeerProberTest, PeerBytesCountsConnectionsToThePeersHostsOnly) {
  auto self = Started();
  ASSERT_TRUE(self);
  EXPECT_FALSE(self->PeerBytes(0).has_value());  // no peers: nothing to count
  // A server socket and a connection to it, both in this process.
  const int server = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(server, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(server, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const int accepted = accept(server, nullptr, nullptr);
  ASSERT_GE(accepted, 0);

  PeerList peers;
  peers.version = 1;
  peers.peers = {{0, "127.0.0.1", self->port()}, {1, "127.0.0.1", port}};
  self->SetPeers(0, peers);
  self->SetActive(true);  // a round resolves the peers' hosts
  ASSERT_TRUE(WaitRound(*self, 0).has_value());
  const std::optional<uint64_t> before = self->PeerBytes(0);
  ASSERT_TRUE(before.has_value());
  std::vector<char> data(10000, 'x');
  ASSERT_EQ(write(client, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  std::vector<char> in(data.size());
  size_t got = 0;
  while (got < in.size()) {
    const ssize_t n = read(accepted, in.data() + got, in.size() - got);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  const std::optional<uint64_t> after = self->PeerBytes(0);
  ASSERT_TRUE(after.has_value());
  // Sent (acknowledged) by one end and received by the other: both ends are this process's.
  EXPECT_GE(*after - *before, 2 * data.size());
  // The coordinator's port left out: only the accepted end (its peer is the client's port)
  // counts... and the client's end (its peer port is `port`) does not.
  const std::optional<uint64_t> without = self->PeerBytes(port);
  ASSERT_TRUE(without.has_value());
  EXPECT_LT(*without, *after);
  close(client);
  close(accepted);
  close(server);
}

}  // namespace
}  // namespace latchkey
