// TcpStoreHost (tcp_store_host.h) against its oracle: the same queries from c10d's own client,
// answered by TcpStoreHost and by c10d's own host, must give the same answers; and a client
// that lies about a length loses its connection while the host serves the others on.
#include "worker/comm/tcp_store_host.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "tests/support/free_port.h"

namespace latchkey::comm {
namespace {

#if TORCH_VERSION_MAJOR < 2
constexpr bool kServesThisClient = true;
#else
constexpr bool kServesThisClient = false;  // 2.x clients open with a handshake it does not serve
#endif
constexpr char kOtherWire[] =
    "TcpStoreHost serves libtorch 1.x's store wire; this build's c10d client is 2.x";

std::vector<uint8_t> B(const std::string& s) { return {s.begin(), s.end()}; }
std::string S(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

c10::intrusive_ptr<c10d::TCPStore> Client(int port, bool is_server) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = is_server;
  opts.numWorkers = 2;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::milliseconds(5000);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
}

// Every query latchkey's host serves, as c10d's client issues them; the answers as one log.
std::string Script(c10d::TCPStore& a, c10d::TCPStore& b) {
  std::string log;
  auto put = [&](const std::string& what) { log += what + "\n"; };
  a.set("a", B("1"));
  put("get a=" + S(b.get("a")));
  put("cas a 1->2: " + S(a.compareSet("a", B("1"), B("2"))));
  put("cas a x->3: " + S(a.compareSet("a", B("x"), B("3"))));
  put("cas new ''->v: " + S(a.compareSet("new", B(""), B("v"))));
  put("cas gone e->v: " + S(a.compareSet("gone", B("e"), B("v"))));
  put("check a,new: " + std::to_string(b.check({"a", "new"})));
  put("check a,gone: " + std::to_string(b.check({"a", "gone"})));
  put("add n 5: " + std::to_string(a.add("n", 5)));
  put("add n -2: " + std::to_string(b.add("n", -2)));
  put("get n=" + S(a.get("n")));
  put("keys: " + std::to_string(a.getNumKeys()));
  put("delete a: " + std::to_string(a.deleteKey("a")));
  put("delete a again: " + std::to_string(b.deleteKey("a")));
  put("check a: " + std::to_string(a.check({"a"})));
  put("keys: " + std::to_string(b.getNumKeys()));
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    b.set("late", B("L"));
  });
  a.wait({"new", "late"});
  setter.join();
  put("after wait: " + S(a.get("late")));
  return log;
}

TEST(TcpStoreHost, AnswersEveryQueryAsC10dsOwnHostDoes) {
  if (!kServesThisClient) GTEST_SKIP() << kOtherWire;
  const int c10d_port = testing::FreePort();
  auto c10d_host = Client(c10d_port, true);
  auto c10d_other = Client(c10d_port, false);
  const std::string expected = Script(*c10d_host, *c10d_other);

  const int port = testing::FreePort();
  auto host = TcpStoreHost::Start(port);
  ASSERT_TRUE(host.ok()) << host.status();
  auto a = Client(port, false), b = Client(port, false);
  EXPECT_EQ(Script(*a, *b), expected);
  // The oracle's own answers, so that both agreeing on a wrong answer cannot pass.
  EXPECT_NE(expected.find("cas a 1->2: 2\ncas a x->3: 2\ncas new ''->v: v\ncas gone e->v: e\n"),
            std::string::npos)
      << expected;
  EXPECT_NE(expected.find("check a,new: 1\ncheck a,gone: 0\nadd n 5: 5\nadd n -2: 3\nget n=3\n"),
            std::string::npos)
      << expected;
  EXPECT_NE(expected.find("delete a: 1\ndelete a again: 0\ncheck a: 0\n"), std::string::npos)
      << expected;
}

// A raw connection sending `query` bytes: true when the host closes it within 3 s.
bool HostCloses(int port, const std::vector<uint8_t>& query) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  bool closed = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, query.data(), query.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(query.size())) {
    char c;
    closed = recv(fd, &c, 1, 0) == 0;
  }
  close(fd);
  return closed;
}

std::vector<uint8_t> Query(uint8_t type, std::initializer_list<uint64_t> lengths,
                           const std::string& tail = "") {
  std::vector<uint8_t> q = {type};
  for (uint64_t n : lengths) {
    const auto* p = reinterpret_cast<const uint8_t*>(&n);
    q.insert(q.end(), p, p + sizeof(n));
  }
  q.insert(q.end(), tail.begin(), tail.end());
  return q;
}

// Lying lengths: a GET of a 1 TiB key, a SET of a 1 GiB value (only its header sent), a WAIT
// for 4 billion keys. Each closes its connection at once, allocates nothing (the WAIT would
// have asked for 4 billion strings), and the host serves an honest client on.
TEST(TcpStoreHost, ALyingLengthClosesThatConnectionOnly) {
  if (!kServesThisClient) GTEST_SKIP() << kOtherWire;
  const int port = testing::FreePort();
  auto host = TcpStoreHost::Start(port);
  ASSERT_TRUE(host.ok()) << host.status();
  auto honest = Client(port, false);
  honest->set("k", B("before"));
  constexpr uint8_t kSet = 0, kGet = 2, kWait = 5;
  EXPECT_TRUE(HostCloses(port, Query(kGet, {uint64_t{1} << 40})));
  // SET "k" (its 1-byte key), then a value length of 1 GiB and no value.
  std::vector<uint8_t> set = Query(kSet, {1}, "k");
  const uint64_t vlen = uint64_t{1} << 30;
  const auto* v = reinterpret_cast<const uint8_t*>(&vlen);
  set.insert(set.end(), v, v + sizeof(vlen));
  EXPECT_TRUE(HostCloses(port, set));
  EXPECT_TRUE(HostCloses(port, Query(kWait, {uint64_t{1} << 32})));
  EXPECT_TRUE(HostCloses(port, {42}));  // not a query
  EXPECT_EQ(S(honest->get("k")), "before");
  honest->set("k", B("after"));
  EXPECT_EQ(S(honest->get("k")), "after");
}

// The port a new attempt's rank 0 listens on may still be held by the previous attempt's rank 0
// (another process, leaving its fenced attempt): without a wait the start fails UNAVAILABLE
// naming the port; with one it takes the port once the holder lets go.
TEST(TcpStoreHost, WaitsForAPortItsPreviousHolderStillListensOn) {
  const int port = testing::FreePort();
  auto first = TcpStoreHost::Start(port);
  ASSERT_TRUE(first.ok()) << first.status();
  auto refused = TcpStoreHost::Start(port);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find(std::to_string(port) + ": Address already in use"),
            std::string::npos)
      << refused.status();
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    first->reset();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto second = TcpStoreHost::Start(port, std::chrono::milliseconds(10000));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GE(waited, 0.4);
  EXPECT_LT(waited, 5.0);
}

}  // namespace
}  // namespace latchkey::comm
