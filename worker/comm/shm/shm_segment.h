// One shared-memory segment of an shm group (docs/transport.md): a file in a tmpfs directory
// (/dev/shm), mapped by every rank of the group, laid out as
//
//   [header: magic, version, ranks, slot size, nonce, the abort word]          4 KiB
//   [one control block per rank: arrival word, sleeper count, state, pid, job rank,
//    a robust process-shared mutex the rank holds while it is attached]        64 B... per rank
//   [data: 2 buffers x ranks x slot_bytes]
//
// Rank 0 creates the file (O_EXCL, a random nonce in its name and header); every rank opens
// and maps it and attaches its control block. The name is unlinked as soon as every rank has
// mapped it, so the kernel frees the memory when the last mapping goes, whatever way the
// processes end (kill -9 included).
//
// Liveness: every attached rank holds its own robust mutex (a keeper thread locks it for the
// segment's lifetime). A peer that dies, even by kill -9, leaves the mutex "owner died", which
// a waiter sees with pthread_mutex_trylock (no system call while the owner lives); a rank that
// detaches normally marks its state kLeft first.
//
// Thread-safety: the atomics may be used from any thread; Attach/the destructor from one.
#ifndef LATCHKEY_WORKER_COMM_SHM_SHM_SEGMENT_H_
#define LATCHKEY_WORKER_COMM_SHM_SHM_SEGMENT_H_

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latchkey::comm::shm {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");

inline constexpr uint64_t kMagic = 0x4c4b53484d534547ull;  // "LKSHMSEG"
inline constexpr uint32_t kVersion = 1;

// What a rank's control block says about it.
enum RankState : uint32_t { kUnattached = 0, kAttached = 1, kLeft = 2, kDead = 3 };

// The abort word: 0 while the group runs; otherwise (kind << 16) | (rank + 1), the first
// reason recorded. Sticky.
enum AbortKind : uint32_t {
  kAbortDied = 1,     // `rank` died (its liveness mutex was left owner-dead)
  kAbortLeft = 2,     // `rank` destroyed its group while a peer waited for it
  kAbortFailed = 3,   // `rank` gave up a collective (its timeout) and broke the group
  kAbortRequest = 4,  // `rank` was told to abort (ShmGroup::Abort: recovery, teardown)
};

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t ranks;
  uint64_t slot_bytes;
  uint64_t total_bytes;
  uint64_t nonce;
  std::atomic<uint32_t> abort;
};

struct alignas(64) RankControl {
  // The last generation this rank arrived at: the futex word its peers sleep on.
  std::atomic<uint32_t> arrive;
  // Peers sleeping (or about to) on `arrive`: the arriving rank calls FUTEX_WAKE only when > 0.
  std::atomic<uint32_t> sleepers;
  std::atomic<uint32_t> state;  // RankState
  int32_t pid;
  int32_t job_rank;       // the rank's rank in the job (RANK), for messages
  pthread_mutex_t alive;  // robust, process-shared; held while attached
};
static_assert(sizeof(RankControl) == 64, "one cache line per rank");

class Segment {
 public:
  // Rank 0: creates `dir`/`name` (which must not exist) sized for `ranks` x `slot_bytes`,
  // writes the header and maps it.
  static absl::StatusOr<std::unique_ptr<Segment>> Create(const std::string& dir,
                                                         const std::string& name, int ranks,
                                                         size_t slot_bytes, uint64_t nonce);
  // The other ranks: opens and maps `dir`/`name`, checking that its header is the one rank 0
  // wrote (magic, version, ranks, slot size, nonce). NOT_FOUND / PERMISSION_DENIED / ... when
  // this rank cannot reach the file (another /dev/shm), FAILED_PRECONDITION on a header mismatch.
  static absl::StatusOr<std::unique_ptr<Segment>> Open(const std::string& dir,
                                                       const std::string& name, int ranks,
                                                       size_t slot_bytes, uint64_t nonce);
  static size_t TotalBytes(int ranks, size_t slot_bytes);

  // Makes this rank (`job_rank` in the job) a member: records its pid, initialises and takes its
  // liveness mutex, state kAttached. REQUIRES: called once, before any peer may look at this
  // rank's block.
  absl::Status Attach(int rank, int job_rank);
  // Detaches (state kLeft, every sleeper woken, the liveness mutex released) and unmaps.
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int ranks() const { return ranks_; }
  size_t slot_bytes() const { return slot_bytes_; }
  SegmentHeader& header() { return *reinterpret_cast<SegmentHeader*>(base_); }
  RankControl& control(int r) { return *reinterpret_cast<RankControl*>(base_ + ControlOffset(r)); }
  // Rank r's slot of data buffer `buffer` (0 or 1).
  char* slot(int buffer, int r) {
    return base_ + DataOffset(ranks_) + (static_cast<size_t>(buffer) * ranks_ + r) * slot_bytes_;
  }

  // kAttached when rank r is a live member; kLeft or kDead otherwise (dead: its process or
  // keeper thread ended without detaching). A dead peer is marked kDead in the segment.
  RankState PeerState(int r);
  // Wakes every sleeper on every rank's arrival word (after the abort word or a state changed).
  void WakeAll();

 private:
  Segment(char* base, size_t bytes, int ranks, size_t slot_bytes)
      : base_(base), bytes_(bytes), ranks_(ranks), slot_bytes_(slot_bytes) {}
  static size_t ControlOffset(int r) { return 4096 + static_cast<size_t>(r) * sizeof(RankControl); }
  static size_t DataOffset(int ranks);
  static absl::StatusOr<std::unique_ptr<Segment>> Map(int fd, const std::string& path, int ranks,
                                                      size_t slot_bytes);

  char* base_;
  size_t bytes_;
  int ranks_;
  size_t slot_bytes_;
  int rank_ = -1;  // set by Attach
  // The keeper thread holds control(rank_).alive until `stop_`.
  std::thread keeper_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
};

// FUTEX_WAIT on a shared word: sleeps while *word == expected, at most `timeout`.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace latchkey::comm::shm

#endif  // LATCHKEY_WORKER_COMM_SHM_SHM_SEGMENT_H_
