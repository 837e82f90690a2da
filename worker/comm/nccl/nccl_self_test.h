// The NCCL backend exercised for real: a communicator of one rank on cuda:`device`, or of two
// ranks (threads) on two GPUs, its unique id through an in-memory rendezvous store, and every
// collective of NcclGroup with every dtype it takes issued on device buffers in test mode
// (NcclGroup::IssueForTesting issues even at one rank). Each rank's inputs differ; every result
// is checked against one computed on the host (the rank-order sum, the concatenation, the
// root's data). Out-of-place outputs start as a sentinel (all bits set), so an output left
// unwritten fails, and their inputs must come back unchanged. At one rank a sum equals its
// input; only the two-rank run shows a reduction. Used by latchkey-nccl-check --self-test (the
// GPU check) and nccl_test. FAILED_PRECONDITION when a device is absent.
#ifndef LATCHKEY_WORKER_COMM_NCCL_NCCL_SELF_TEST_H_
#define LATCHKEY_WORKER_COMM_NCCL_NCCL_SELF_TEST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace latchkey::comm {

struct NcclSelfTestLine {
  std::string op;     // "all_reduce", ...
  std::string dtype;  // "float32", ...
  size_t bytes = 0;
  double seconds = 0.0;
  bool ok = false;
  std::string detail;  // what differed, or the error
};

// Runs every collective once per dtype it takes; `lines` gets one entry per call. The Status is
// the first failure (or OK when every line is ok).
absl::Status RunNcclSelfTest(int device, std::vector<NcclSelfTestLine>* lines);
// The same with two ranks, rank r on cuda:device_r (two distinct GPUs).
absl::Status RunNcclTwoRankSelfTest(int device0, int device1, std::vector<NcclSelfTestLine>* lines);
// How many lines a run gives (one per op and dtype).
size_t NcclSelfTestCases();

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_NCCL_NCCL_SELF_TEST_H_
