// The shared-memory implementation of comm::Group (docs/transport.md): the ranks of one group,
// all on one host, move data through one mapped Segment. CPU buffers only. Created by the shm
// backend (shm_backend.cc) through comm::CreateProcessGroups.
//
// Every collective is a sequence of steps, one per slot-sized chunk: each rank copies its part
// into its slot of data buffer (generation & 1), publishes the generation in its arrival word,
// waits until every rank has arrived at it, then reads the slots it needs. Two data buffers
// make one arrival per step enough: a rank writing buffer b at generation g has seen every rank
// arrive at g-1, so all are done reading b (generation g-2).
//
// Sums: element i of a reduction is ((x_0 + x_1) + x_2) + ... + x_{n-1}, x_r being rank r's
// value, computed the same way on every rank: deterministic run to run and bit-identical across
// ranks.
//
// Waiting: the arrival words are read with acquire loads (no system call while peers keep up),
// spun on briefly when the host has a core per rank (and recent spins paid off), then slept on
// with FUTEX_WAIT in slices of at most kWaitSlice, after each of which the waiter checks the
// abort word, the awaited peer's liveness (Segment::PeerState) and its deadline. Any failure
// breaks the group for every member (the abort word): a timed-out rank gets DEADLINE_EXCEEDED
// and its peers UNAVAILABLE naming it; a dead or departed peer is UNAVAILABLE naming its rank,
// well before the timeout.
// Thread-safety: as comm::Group; Abort() may be called from any thread.
#ifndef LATCHKEY_WORKER_COMM_SHM_SHM_GROUP_H_
#define LATCHKEY_WORKER_COMM_SHM_SHM_GROUP_H_

#include <chrono>
#include <memory>
#include <string>

#include "worker/comm/comm.h"
#include "worker/comm/shm/shm_segment.h"

namespace latchkey::comm {

class ShmGroup final : public Group {
 public:
  // How long one futex sleep lasts at most: the bound on noticing a dead peer.
  static constexpr std::chrono::milliseconds kWaitSlice{20};

  // REQUIRES: `segment` is attached as `rank` by this process and every rank has attached.
  // `spin`: whether waits spin briefly before sleeping (false when the host has fewer cores than
  // ranks).
  ShmGroup(std::string name, int rank, int size, std::unique_ptr<shm::Segment> segment, bool spin,
           std::shared_ptr<CollectiveStats> stats);
  ~ShmGroup() override;

  // Breaks the group for every member: waits in progress (any rank's) return UNAVAILABLE, and so
  // does every later collective. For recovery and teardown; thread-safe.
  void Abort();

 protected:
  // A CPU group: Group::CheckDevice refuses buffers on any other device.
  const char* backend() const override { return "shm"; }
  absl::Status DoAllReduceSum(const Buffer& data, std::chrono::milliseconds timeout) override;
  absl::Status DoAllGather(const Buffer& in, const Buffer& out,
                           std::chrono::milliseconds timeout) override;
  absl::Status DoReduceScatterSum(const Buffer& in, const Buffer& out,
                                  std::chrono::milliseconds timeout) override;
  absl::Status DoBroadcast(const Buffer& data, int root,
                           std::chrono::milliseconds timeout) override;
  absl::Status DoBarrier(std::chrono::milliseconds timeout) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Call {
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };
  static Call Begin(std::chrono::milliseconds timeout) {
    return Call{Clock::now() + timeout, timeout};
  }
  // The data buffer the next step writes.
  int NextBuffer() const { return static_cast<int>((gen_ + 1) & 1); }
  // Publishes this rank's arrival at the next generation and waits for every peer's.
  absl::Status Step(const Call& call);
  absl::Status WaitFor(int peer, uint32_t gen, const Call& call);
  // The Status for a set abort word (UNAVAILABLE naming the rank and why).
  absl::Status Aborted(uint32_t word) const;
  // Records the first failure in the abort word and wakes every sleeper.
  void SetAbort(uint32_t kind, int rank);

  std::unique_ptr<shm::Segment> seg_;
  bool spin_;
  int spin_skip_ = 0;    // waits left before the next spin is tried (after one failed)
  uint32_t gen_ = 0;     // the last generation this rank arrived at
  absl::Status broken_;  // set once a collective failed: every later one fails the same way
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_SHM_SHM_GROUP_H_
