#include "worker/comm/mesh_exchange.h"

#include <cstring>
#include <map>
#include <string>

namespace latchkey::comm {
namespace {

constexpr size_t kMaxHostBytes = 1024;

// Little-endian fixed-width fields, appended and read back with bounds checks.
void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU16(std::vector<uint8_t>* out, uint16_t v) {
  out->push_back(static_cast<uint8_t>(v));
  out->push_back(static_cast<uint8_t>(v >> 8));
}

class Cursor {
 public:
  explicit Cursor(const std::vector<uint8_t>& in) : in_(in) {}
  bool U32(uint32_t* v) {
    if (in_.size() - at_ < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<uint32_t>(in_[at_ + i]) << (8 * i);
    at_ += 4;
    return true;
  }
  bool U16(uint16_t* v) {
    if (in_.size() - at_ < 2) return false;
    *v = static_cast<uint16_t>(in_[at_] | (in_[at_ + 1] << 8));
    at_ += 2;
    return true;
  }
  bool Bytes(size_t n, std::vector<uint8_t>* v) {
    if (in_.size() - at_ < n) return false;
    v->assign(in_.begin() + static_cast<std::ptrdiff_t>(at_),
              in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return true;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  const std::vector<uint8_t>& in_;
  size_t at_ = 0;
};

std::string RecKey(int rank) { return "mesh/rec/" + std::to_string(rank); }
std::string ToKey(int rank) { return "mesh/to/" + std::to_string(rank); }
constexpr char kHostsKey[] = "mesh/hosts";

absl::Status Malformed(const std::string& what) {
  return absl::DataLossError("mesh address exchange: " + what + " is malformed");
}

struct Record {
  std::vector<uint8_t> host;
  std::vector<uint16_t> ports;
};

absl::StatusOr<Record> ParseRecord(const std::vector<uint8_t>& in, int size, int rank) {
  Cursor c(in);
  Record r;
  uint32_t host_len = 0, n = 0;
  if (!c.U32(&host_len) || host_len > kMaxHostBytes || !c.Bytes(host_len, &r.host) || !c.U32(&n) ||
      n != static_cast<uint32_t>(size)) {
    return Malformed("rank " + std::to_string(rank) + "'s record (" + std::to_string(in.size()) +
                     " bytes, for a group of " + std::to_string(size) + ")");
  }
  r.ports.resize(n);
  for (uint16_t& p : r.ports) {
    if (!c.U16(&p)) return Malformed("rank " + std::to_string(rank) + "'s record");
  }
  if (!c.done()) return Malformed("rank " + std::to_string(rank) + "'s record (trailing bytes)");
  return r;
}

std::vector<uint8_t> EncodeHosts(const std::vector<std::vector<uint8_t>>& hosts) {
  std::vector<uint8_t> out;
  PutU32(&out, static_cast<uint32_t>(hosts.size()));
  for (const auto& h : hosts) {
    PutU32(&out, static_cast<uint32_t>(h.size()));
    out.insert(out.end(), h.begin(), h.end());
  }
  return out;
}

absl::Status ParseHosts(const std::vector<uint8_t>& in, std::vector<std::vector<uint8_t>>* hosts) {
  Cursor c(in);
  uint32_t n = 0;
  if (!c.U32(&n) || n > in.size()) return Malformed("the hosts value");
  hosts->resize(n);
  for (auto& h : *hosts) {
    uint32_t len = 0;
    if (!c.U32(&len) || len > kMaxHostBytes || !c.Bytes(len, &h)) {
      return Malformed("the hosts value");
    }
  }
  return c.done() ? absl::OkStatus() : Malformed("the hosts value (trailing bytes)");
}

absl::Status ParseTo(const std::vector<uint8_t>& in, int size, size_t hosts, MeshPeers* out) {
  Cursor c(in);
  uint32_t n = 0;
  if (!c.U32(&n) || n != static_cast<uint32_t>(size)) return Malformed("this rank's value");
  out->host.resize(n);
  out->port.resize(n);
  for (uint32_t j = 0; j < n; ++j) {
    if (!c.U32(&out->host[j]) || !c.U16(&out->port[j]) || out->host[j] >= hosts) {
      return Malformed("this rank's value");
    }
  }
  return c.done() ? absl::OkStatus() : Malformed("this rank's value (trailing bytes)");
}

// Rank 0: gathers the records, publishes the hosts and every rank's transposed value.
absl::StatusOr<MeshPeers> Gather(Store& store, int size, Record own,
                                 std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int j = 1; j < size; ++j) keys.push_back(RecKey(j));
  if (absl::Status st = store.Wait(keys, timeout); !st.ok()) return st;
  std::vector<Record> recs(size);
  recs[0] = std::move(own);
  for (int j = 1; j < size; ++j) {
    auto v = store.Get(RecKey(j), timeout);
    if (!v.ok()) return v.status();
    auto r = ParseRecord(*v, size, j);
    if (!r.ok()) return r.status();
    recs[j] = *std::move(r);
  }
  MeshPeers peers;
  std::map<std::vector<uint8_t>, uint32_t> index;
  std::vector<uint32_t> host_of(size);
  for (int j = 0; j < size; ++j) {
    auto [it, added] = index.emplace(recs[j].host, static_cast<uint32_t>(peers.hosts.size()));
    if (added) peers.hosts.push_back(recs[j].host);
    host_of[j] = it->second;
  }
  if (absl::Status st = store.Set(kHostsKey, EncodeHosts(peers.hosts)); !st.ok()) return st;
  for (int i = 1; i < size; ++i) {
    std::vector<uint8_t> to;
    to.reserve(4 + 6 * static_cast<size_t>(size));
    PutU32(&to, static_cast<uint32_t>(size));
    for (int j = 0; j < size; ++j) {
      PutU32(&to, host_of[j]);
      PutU16(&to, j == i ? 0 : recs[j].ports[i]);
    }
    if (absl::Status st = store.Set(ToKey(i), to); !st.ok()) return st;
  }
  peers.host = host_of;
  peers.port.resize(size);
  for (int j = 1; j < size; ++j) peers.port[j] = recs[j].ports[0];
  return peers;
}

}  // namespace

absl::StatusOr<MeshPeers> ExchangeMeshAddresses(Store& store, int rank, int size,
                                                const std::vector<uint8_t>& host,
                                                const std::vector<uint16_t>& ports,
                                                std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size || ports.size() != static_cast<size_t>(size) ||
      host.size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        "mesh address exchange: rank " + std::to_string(rank) + " of " + std::to_string(size) +
        " with " + std::to_string(ports.size()) + " ports and a host of " +
        std::to_string(host.size()) + " bytes (at most " + std::to_string(kMaxHostBytes) + ")");
  }
  if (rank == 0) return Gather(store, size, Record{host, ports}, timeout);
  std::vector<uint8_t> rec;
  rec.reserve(8 + host.size() + 2 * ports.size());
  PutU32(&rec, static_cast<uint32_t>(host.size()));
  rec.insert(rec.end(), host.begin(), host.end());
  PutU32(&rec, static_cast<uint32_t>(size));
  for (uint16_t p : ports) PutU16(&rec, p);
  if (absl::Status st = store.Set(RecKey(rank), rec); !st.ok()) return st;
  // Rank 0 publishes the hosts before any rank's value: once this rank's value is there, so
  // are the hosts.
  auto to = store.Get(ToKey(rank), timeout);
  if (!to.ok()) return to.status();
  auto hosts = store.Get(kHostsKey, timeout);
  if (!hosts.ok()) return hosts.status();
  MeshPeers peers;
  if (absl::Status st = ParseHosts(*hosts, &peers.hosts); !st.ok()) return st;
  if (absl::Status st = ParseTo(*to, size, peers.hosts.size(), &peers); !st.ok()) return st;
  return peers;
}

}  // namespace latchkey::comm
