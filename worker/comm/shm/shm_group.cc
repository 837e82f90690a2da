#include "worker/comm/shm/shm_group.h"

#include <algorithm>
#include <cstring>

namespace latchkey::comm {
namespace {

using shm::RankControl;
using shm::Segment;

// How long a wait spins (reading the peer's arrival word) before it sleeps, when spinning is
// allowed: about one futex wake-up. A spin that fails turns spinning off for the next
// kSpinBackoff waits: on a loaded host the spinner holds the core the peer needs (measured here:
// a 50 us spin made a 2-rank 4 B all-reduce 57 us, sleeping at once 8 us).
constexpr std::chrono::microseconds kSpin{5};
constexpr int kSpinBackoff = 256;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline bool Reached(uint32_t arrive, uint32_t gen) {
  return static_cast<int32_t>(arrive - gen) >= 0;  // wrap-safe: ranks differ by one at most
}

// out[i] = ((s_0[i] + s_1[i]) + s_2[i]) + ... : rank order, the same on every rank.
template <typename T>
void SumInRankOrder(Segment& seg, int buffer, size_t first, size_t count, void* out_bytes) {
  T* __restrict out = static_cast<T*>(out_bytes);
  const int n = seg.ranks();
  const T* __restrict s0 = reinterpret_cast<const T*>(seg.slot(buffer, 0)) + first;
  const T* __restrict s1 = reinterpret_cast<const T*>(seg.slot(buffer, 1)) + first;
  for (size_t i = 0; i < count; ++i) out[i] = s0[i] + s1[i];
  for (int r = 2; r < n; ++r) {
    const T* __restrict s = reinterpret_cast<const T*>(seg.slot(buffer, r)) + first;
    for (size_t i = 0; i < count; ++i) out[i] += s[i];
  }
}

void Sum(DataType type, Segment& seg, int buffer, size_t first, size_t count, void* out) {
  if (type == DataType::kFloat32) {
    SumInRankOrder<float>(seg, buffer, first, count, out);
  } else {
    SumInRankOrder<double>(seg, buffer, first, count, out);
  }
}

}  // namespace

ShmGroup::ShmGroup(std::string name, int rank, int size, std::unique_ptr<Segment> segment,
                   bool spin, std::shared_ptr<CollectiveStats> stats)
    : Group(std::move(name), rank, size, Device::Cpu(), std::move(stats)),
      seg_(std::move(segment)),
      spin_(spin) {}

ShmGroup::~ShmGroup() = default;  // the segment detaches: peers waiting for this rank wake

void ShmGroup::Abort() { SetAbort(shm::kAbortRequest, rank()); }

void ShmGroup::SetAbort(uint32_t kind, int rank) {
  uint32_t expected = 0;
  seg_->header().abort.compare_exchange_strong(
      expected, (kind << 16) | static_cast<uint32_t>(rank + 1), std::memory_order_seq_cst);
  seg_->WakeAll();
}

absl::Status ShmGroup::Aborted(uint32_t word) const {
  const uint32_t kind = word >> 16;
  const int r = static_cast<int>(word & 0xffff) - 1;
  const std::string who = "rank " + std::to_string(r) + " (job rank " +
                          std::to_string(seg_->control(r).job_rank) + ", pid " +
                          std::to_string(seg_->control(r).pid) + ")";
  switch (kind) {
    case shm::kAbortDied:
      return absl::UnavailableError(who + " died");
    case shm::kAbortLeft:
      return absl::UnavailableError(who + " left the group (destroyed it) while a peer waited");
    case shm::kAbortFailed:
      return absl::UnavailableError(who + " gave up a collective (its timeout passed)");
    default:
      return absl::UnavailableError("the group was aborted by " + who);
  }
}

absl::Status ShmGroup::WaitFor(int peer, uint32_t gen, const Call& call) {
  RankControl& c = seg_->control(peer);
  auto arrived = [&] { return Reached(c.arrive.load(std::memory_order_acquire), gen); };
  if (arrived()) return absl::OkStatus();
  std::atomic<uint32_t>& abort = seg_->header().abort;
  if (spin_ && spin_skip_ == 0) {
    const auto until = Clock::now() + kSpin;
    for (int i = 1;; ++i) {
      CpuRelax();
      if (arrived()) return absl::OkStatus();
      if ((i & 15) == 0 && (abort.load(std::memory_order_relaxed) != 0 || Clock::now() >= until)) {
        break;
      }
    }
    spin_skip_ = kSpinBackoff;
  } else if (spin_skip_ > 0) {
    --spin_skip_;
  }
  while (true) {
    // A peer's arrival counts even when it failed or died afterwards: its data is in place.
    if (const uint32_t a = abort.load(std::memory_order_acquire); a != 0) {
      if (arrived()) return absl::OkStatus();
      return Aborted(a);
    }
    const shm::RankState state = seg_->PeerState(peer);
    if (state != shm::kAttached) {
      if (arrived()) return absl::OkStatus();
      SetAbort(state == shm::kDead ? shm::kAbortDied : shm::kAbortLeft, peer);
      return Aborted(abort.load(std::memory_order_acquire));
    }
    const auto now = Clock::now();
    if (now >= call.deadline) {
      SetAbort(shm::kAbortFailed, rank());
      return absl::DeadlineExceededError("no progress within " +
                                         std::to_string(call.timeout.count()) + " ms: rank " +
                                         std::to_string(peer) + " did not arrive");
    }
    // Dekker with the arriving rank (Step): it stores `arrive` then reads `sleepers`; this
    // increments `sleepers` then reads `arrive`. Either it sees us and wakes the word, or we see
    // its arrival; FUTEX_WAIT itself returns at once if the word moved on meanwhile.
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = c.arrive.load(std::memory_order_seq_cst);
    if (!Reached(v, gen) && abort.load(std::memory_order_seq_cst) == 0) {
      shm::FutexWait(&c.arrive, v, std::min<Clock::duration>(kWaitSlice, call.deadline - now));
    }
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (arrived()) return absl::OkStatus();
  }
}

absl::Status ShmGroup::Step(const Call& call) {
  const uint32_t gen = gen_ + 1;
  RankControl& me = seg_->control(rank());
  me.arrive.store(gen, std::memory_order_seq_cst);
  if (me.sleepers.load(std::memory_order_seq_cst) != 0) shm::FutexWakeAll(&me.arrive);
  gen_ = gen;
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    if (absl::Status st = WaitFor(p, gen, call); !st.ok()) {
      broken_ = st;
      return st;
    }
  }
  return absl::OkStatus();
}

// A failed group stays failed: its generations no longer line up across ranks.
#define LATCHKEY_SHM_CHECK_USABLE()                                                   \
  do {                                                                                \
    if (!broken_.ok()) return broken_;                                                \
    if (const uint32_t a = seg_->header().abort.load(std::memory_order_acquire); a) { \
      broken_ = Aborted(a);                                                           \
      return broken_;                                                                 \
    }                                                                                 \
  } while (0)

absl::Status ShmGroup::DoAllReduceSum(const Buffer& data, std::chrono::milliseconds timeout) {
  LATCHKEY_SHM_CHECK_USABLE();
  const Call call = Begin(timeout);
  const size_t elem = DataTypeSize(data.type);
  const size_t per_step = seg_->slot_bytes() / elem;
  char* bytes = static_cast<char*>(data.data);
  for (size_t off = 0; off < data.count; off += per_step) {
    const size_t m = std::min(per_step, data.count - off);
    const int b = NextBuffer();
    std::memcpy(seg_->slot(b, rank()), bytes + off * elem, m * elem);
    if (absl::Status st = Step(call); !st.ok()) return st;
    Sum(data.type, *seg_, b, 0, m, bytes + off * elem);
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::DoAllGather(const Buffer& in, const Buffer& out,
                                   std::chrono::milliseconds timeout) {
  LATCHKEY_SHM_CHECK_USABLE();
  const Call call = Begin(timeout);
  const size_t elem = DataTypeSize(in.type);
  const size_t per_step = seg_->slot_bytes() / elem;
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  const size_t chunk_bytes = in.bytes();
  const bool in_place = src == dst + static_cast<size_t>(rank()) * chunk_bytes;
  for (size_t off = 0; off < in.count; off += per_step) {
    const size_t m = std::min(per_step, in.count - off);
    const int b = NextBuffer();
    std::memcpy(seg_->slot(b, rank()), src + off * elem, m * elem);
    if (absl::Status st = Step(call); !st.ok()) return st;
    for (int r = 0; r < size(); ++r) {
      if (in_place && r == rank()) continue;
      std::memcpy(dst + r * chunk_bytes + off * elem, seg_->slot(b, r), m * elem);
    }
  }
  return absl::OkStatus();
}

// Per step, every rank copies elements [off, off + m) of each of its n input chunks into its
// slot (chunk r at r * m), then sums chunk rank() of every slot into out[off, off + m).
absl::Status ShmGroup::DoReduceScatterSum(const Buffer& in, const Buffer& out,
                                          std::chrono::milliseconds timeout) {
  LATCHKEY_SHM_CHECK_USABLE();
  const Call call = Begin(timeout);
  const int n = size();
  const size_t elem = DataTypeSize(in.type);
  const size_t per_step = seg_->slot_bytes() / elem / static_cast<size_t>(n);
  const size_t count = out.count;
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  for (size_t off = 0; off < count; off += per_step) {
    const size_t m = std::min(per_step, count - off);
    const int b = NextBuffer();
    char* slot = seg_->slot(b, rank());
    for (int r = 0; r < n; ++r) {
      std::memcpy(slot + r * m * elem, src + (r * count + off) * elem, m * elem);
    }
    if (absl::Status st = Step(call); !st.ok()) return st;
    // In place (`out` is chunk rank() of `in`), this overwrites only elements this rank has
    // already copied into its slot.
    Sum(in.type, *seg_, b, static_cast<size_t>(rank()) * m, m, dst + off * elem);
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::DoBroadcast(const Buffer& data, int root,
                                   std::chrono::milliseconds timeout) {
  LATCHKEY_SHM_CHECK_USABLE();
  const Call call = Begin(timeout);
  const size_t elem = DataTypeSize(data.type);
  const size_t per_step = seg_->slot_bytes() / elem;
  char* bytes = static_cast<char*>(data.data);
  for (size_t off = 0; off < data.count; off += per_step) {
    const size_t m = std::min(per_step, data.count - off);
    const int b = NextBuffer();
    if (rank() == root) std::memcpy(seg_->slot(b, root), bytes + off * elem, m * elem);
    if (absl::Status st = Step(call); !st.ok()) return st;
    if (rank() != root) std::memcpy(bytes + off * elem, seg_->slot(b, root), m * elem);
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::DoBarrier(std::chrono::milliseconds timeout) {
  LATCHKEY_SHM_CHECK_USABLE();
  return Step(Begin(timeout));
}

#undef LATCHKEY_SHM_CHECK_USABLE

}  // namespace latchkey::comm
