// The NCCL backend exercised for real on one GPU: a one-rank communicator on cuda:`device`
// (its unique id through an in-memory rendezvous store), and every collective of NcclGroup
// issued on device buffers in test mode (NcclGroup::IssueForTesting issues even at one rank),
// each result checked against the input. Used by latchkey-nccl-check --self-test (the GPU
// check) and nccl_test. FAILED_PRECONDITION when the device is absent.
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

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_NCCL_NCCL_SELF_TEST_H_
