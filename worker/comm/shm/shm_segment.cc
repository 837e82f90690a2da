#include "worker/comm/shm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <future>

namespace latchkey::comm::shm {
namespace {

absl::Status Errno(const std::string& what, int err) {
  const std::string msg = what + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  const auto ns = timeout.count();
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  // Not FUTEX_PRIVATE_FLAG: the word lives in memory shared between processes. EAGAIN (the word
  // already changed), EINTR and ETIMEDOUT all mean "look again".
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

size_t Segment::DataOffset(int ranks) { return RoundUp(ControlOffset(ranks), 4096); }

size_t Segment::TotalBytes(int ranks, size_t slot_bytes) {
  return DataOffset(ranks) + 2 * static_cast<size_t>(ranks) * slot_bytes;
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Map(int fd, const std::string& path, int ranks,
                                                      size_t slot_bytes) {
  const size_t bytes = TotalBytes(ranks, slot_bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return Errno("mmap " + path, err);
  return std::unique_ptr<Segment>(new Segment(static_cast<char*>(p), bytes, ranks, slot_bytes));
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Create(const std::string& dir,
                                                         const std::string& name, int ranks,
                                                         size_t slot_bytes, uint64_t nonce) {
  const std::string path = dir + "/" + name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("create " + path, errno);
  const size_t bytes = TotalBytes(ranks, slot_bytes);
  // posix_fallocate, not ftruncate: a tmpfs that is too small fails here (ENOSPC) instead of
  // with SIGBUS at the first touch of a page.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    close(fd);
    unlink(path.c_str());
    return Errno("allocate " + std::to_string(bytes) + " bytes for " + path, err);
  }
  auto seg = Map(fd, path, ranks, slot_bytes);
  if (!seg.ok()) {
    unlink(path.c_str());
    return seg.status();
  }
  SegmentHeader& h = (*seg)->header();  // the file is zero-filled: every atomic starts at 0
  h.version = kVersion;
  h.ranks = static_cast<uint32_t>(ranks);
  h.slot_bytes = slot_bytes;
  h.total_bytes = bytes;
  h.nonce = nonce;
  // Published last with a release store, read with an acquire load by Open: a rank that sees
  // the magic sees the fields before it (a plain store after a fence is a data race with the
  // reader's plain load, and ThreadSanitizer does not model fences).
  __atomic_store_n(&h.magic, kMagic, __ATOMIC_RELEASE);
  return seg;
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Open(const std::string& dir,
                                                       const std::string& name, int ranks,
                                                       size_t slot_bytes, uint64_t nonce) {
  const std::string path = dir + "/" + name;
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Errno("open " + path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != TotalBytes(ranks, slot_bytes)) {
    close(fd);
    return absl::FailedPreconditionError(path + " is not the expected size " +
                                         std::to_string(TotalBytes(ranks, slot_bytes)));
  }
  auto seg = Map(fd, path, ranks, slot_bytes);
  if (!seg.ok()) return seg.status();
  const SegmentHeader& h = (*seg)->header();
  if (__atomic_load_n(&h.magic, __ATOMIC_ACQUIRE) != kMagic || h.version != kVersion ||
      h.ranks != static_cast<uint32_t>(ranks) || h.slot_bytes != slot_bytes || h.nonce != nonce) {
    return absl::FailedPreconditionError(path + " is not the segment rank 0 created");
  }
  return seg;
}

absl::Status Segment::Attach(int rank, int job_rank) {
  RankControl& c = control(rank);
  c.pid = static_cast<int32_t>(getpid());
  c.job_rank = static_cast<int32_t>(job_rank);
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  int err = pthread_mutex_init(&c.alive, &attr);
  pthread_mutexattr_destroy(&attr);
  if (err != 0) return Errno("pthread_mutex_init", err);
  // The keeper thread, not the caller's, owns the mutex: the group may outlive the thread that
  // formed it, and the mutex must read "owner died" exactly when this process (or the segment's
  // owner object) is gone.
  std::promise<int> locked;
  auto locked_future = locked.get_future();
  keeper_ = std::thread([this, &c, &locked] {
    const int lock_err = pthread_mutex_lock(&c.alive);
    locked.set_value(lock_err);
    if (lock_err != 0) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_; });
    pthread_mutex_unlock(&c.alive);
  });
  err = locked_future.get();
  if (err != 0) {
    keeper_.join();
    return Errno("pthread_mutex_lock", err);
  }
  rank_ = rank;
  c.state.store(kAttached, std::memory_order_seq_cst);
  return absl::OkStatus();
}

RankState Segment::PeerState(int r) {
  RankControl& c = control(r);
  const uint32_t s = c.state.load(std::memory_order_acquire);
  if (s != kAttached) return static_cast<RankState>(s);
  // A user-space compare-and-swap fails while the owner lives (EBUSY): no system call.
  const int err = pthread_mutex_trylock(&c.alive);
  if (err == EBUSY) return kAttached;
  if (err == EOWNERDEAD || err == ENOTRECOVERABLE) {
    // Keep the mutex (and leave it inconsistent): the state word tells every other peer.
    uint32_t expected = kAttached;
    c.state.compare_exchange_strong(expected, kDead, std::memory_order_seq_cst);
    return static_cast<RankState>(c.state.load(std::memory_order_acquire));
  }
  if (err == 0) {
    // Released without dying: the owner is detaching (its state turns kLeft next).
    pthread_mutex_unlock(&c.alive);
    return kLeft;
  }
  return kAttached;
}

void Segment::WakeAll() {
  for (int r = 0; r < ranks_; ++r) FutexWakeAll(&control(r).arrive);
}

Segment::~Segment() {
  if (rank_ >= 0) {
    control(rank_).state.store(kLeft, std::memory_order_seq_cst);
    WakeAll();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    keeper_.join();
  }
  munmap(base_, bytes_);
}

}  // namespace latchkey::comm::shm
