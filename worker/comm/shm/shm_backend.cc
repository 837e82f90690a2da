#include "worker/comm/shm/shm_backend.h"

#include <sched.h>

#include <cinttypes>
#include <cstdio>
#include <random>
#include <thread>

#include "worker/comm/shm/shm_cleanup.h"
#include "worker/comm/shm/shm_group.h"
#include "worker/comm/shm/shm_segment.h"

namespace latchkey::comm {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// A file name from the rendezvous prefix (a job id, "job/a2"): [A-Za-z0-9._] kept, the rest '_'.
std::string Sanitize(const std::string& s) {
  std::string out = s.substr(0, 96);
  for (char& c : out) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_';
    if (!keep) c = '_';
  }
  return out;
}

uint64_t Nonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string ShmSegmentName(const std::string& prefix, const std::string& key, uint64_t nonce) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, nonce);
  return "latchkey-shm-" + Sanitize(prefix) + "-" + key + "-" + hex;
}

absl::StatusOr<std::shared_ptr<Group>> TryShmGroup(const RendezvousConfig& config, Store& store,
                                                   const ShmGroupRequest& req,
                                                   std::shared_ptr<CollectiveStats> stats,
                                                   std::string* why_not) {
  const std::string base = config.prefix + "/shm/" + req.key + "/";
  const std::chrono::milliseconds timeout = config.rendezvous_timeout;
  const std::string& dir = config.shm_dir;
  std::unique_ptr<shm::Segment> seg;
  // The segment's name, unlinked on every exit path of the rendezvous and by a stop signal
  // (shm_cleanup.h) while it lasts.
  shm::ScopedName name_guard;
  std::string mapped = "1";
  if (req.rank == 0) {
    const uint64_t nonce = Nonce();
    const std::string name = ShmSegmentName(config.prefix, req.key, nonce);
    // Held before the file exists, so a signal right after its creation still unlinks it (the
    // random nonce makes the name this process's own).
    name_guard.Hold(dir + "/" + name);
    auto created = shm::Segment::Create(dir, name, req.size, config.shm_slot_bytes, nonce);
    std::string published;
    if (created.ok()) {
      seg = *std::move(created);
      char value[64];
      std::snprintf(value, sizeof(value), " %" PRIu64 " %zu", nonce, config.shm_slot_bytes);
      published = name + value;
    } else {
      name_guard.Release();  // not ours: Create removed what it made, or the file was there
      published = "! " + std::string(created.status().message());
    }
    if (absl::Status st = store.Set(base + "segment", Bytes(published)); !st.ok()) return st;
    if (!created.ok()) {
      *why_not = "rank 0 cannot create a segment: " + std::string(created.status().message());
      return std::shared_ptr<Group>();
    }
  } else {
    auto value = store.Get(base + "segment", timeout);
    if (!value.ok()) return value.status();
    const std::string text = Text(*value);
    if (text.rfind("! ", 0) == 0) {
      *why_not = "rank 0 cannot create a segment: " + text.substr(2);
      return std::shared_ptr<Group>();
    }
    char name[256] = {0};
    uint64_t nonce = 0;
    size_t slot_bytes = 0;
    if (std::sscanf(text.c_str(), "%255s %" SCNu64 " %zu", name, &nonce, &slot_bytes) != 3) {
      return absl::InternalError("malformed shm segment record '" + text + "'");
    }
    auto opened = shm::Segment::Open(dir, name, req.size, slot_bytes, nonce);
    if (opened.ok()) {
      name_guard.Hold(dir + "/" + name);
      seg = *std::move(opened);
    } else {
      mapped = "0 " + std::string(opened.status().message());
    }
  }
  if (seg != nullptr) {
    if (absl::Status st = seg->Attach(req.rank, config.rank); !st.ok()) {
      mapped = "0 " + std::string(st.message());
      seg.reset();
    }
  }
  if (absl::Status st = store.Set(base + "mapped/" + std::to_string(req.rank), Bytes(mapped));
      !st.ok()) {
    return st;
  }
  // Every rank reads every answer: the same verdict everywhere.
  std::string refusals;
  for (int r = 0; r < req.size; ++r) {
    auto v = store.Get(base + "mapped/" + std::to_string(r), timeout);
    if (!v.ok()) return v.status();
    const std::string answer = Text(*v);
    if (answer != "1") {
      if (!refusals.empty()) refusals += "; ";
      refusals +=
          "rank " + std::to_string(r) + ": " + answer.substr(std::min<size_t>(2, answer.size()));
    }
  }
  // name_guard unlinks here on return: every rank has mapped the segment (or given up on it).
  if (!refusals.empty()) {
    *why_not = refusals;
    return std::shared_ptr<Group>();
  }
  const bool spin = std::max(req.host_ranks, req.size) <= UsableCpus();
  return std::shared_ptr<Group>(
      std::make_shared<ShmGroup>(req.name, req.rank, req.size, std::move(seg), spin, stats));
}

}  // namespace latchkey::comm
