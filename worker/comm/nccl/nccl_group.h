// NCCL implementation of comm::Group: collectives on CUDA device buffers, enqueued on one CUDA
// stream (a raw cudaStream_t: the stream the model's kernels run on; the legacy default stream
// unless set_stream says otherwise), over cudart and NCCL directly (no torch CUDA API).
//
// Deadlines: the communicator is nonblocking (ncclConfig_t::blocking = 0). Every call enqueues,
// then polls ncclCommGetAsyncError and a CUDA event recorded after the operation until the
// operation is done, NCCL reports an error, or the call's timeout passes. On a timeout or an
// asynchronous error the communicator is aborted (ncclCommAbort) and every later call fails
// FAILED_PRECONDITION at once; so no NCCL call blocks past its timeout. The destructor (a
// recovery tearing the groups down) finalizes a healthy communicator within a bounded time and
// aborts it otherwise.
// Errors: a Status with the NCCL error string (ncclGetErrorString and ncclGetLastError), the NCCL
// version and the call site: DEADLINE_EXCEEDED (timeout), UNAVAILABLE (a remote or system error:
// a lost peer), INVALID_ARGUMENT (buffers on another device), INTERNAL (anything else).
// Created by the nccl backend (nccl_backend.cc) through comm::CreateProcessGroups.
// Thread-safety: as comm::Group (one thread at a time).
#ifndef LATCHKEY_WORKER_COMM_NCCL_NCCL_GROUP_H_
#define LATCHKEY_WORKER_COMM_NCCL_NCCL_GROUP_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>

#include "worker/comm/comm.h"

namespace latchkey::comm {

// "NCCL 2.28.9" (the library loaded, ncclGetVersion).
std::string NcclVersionString();

// `call` failing with `r` at file:line, as a Status (see the header comment). `comm` may be null.
absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm, const char* call, const char* file,
                        int line);

class NcclGroup final : public Group {
 public:
  // Takes ownership of `comm`, an initialized communicator of cuda:`device`.
  NcclGroup(std::string name, int rank, int size, ncclComm_t comm, int device,
            std::shared_ptr<CollectiveStats> stats);
  ~NcclGroup() override;

  // The stream every collective is enqueued on and waited for (null: the legacy default stream).
  // The backend sets torch's current stream of the device when the libtorch has CUDA.
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  cudaStream_t stream() const { return stream_; }
  // True once the communicator was aborted (a timeout or an asynchronous NCCL error).
  bool aborted() const { return aborted_; }

  // Test mode: the backend's half of each collective issued directly, even on a one-rank
  // communicator (Group's public methods issue nothing there), and not counted.
  enum class Op { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier };
  absl::Status IssueForTesting(Op op, const Buffer& in, const Buffer& out,
                               std::chrono::milliseconds timeout);

 protected:
  const char* backend() const override { return "nccl"; }
  absl::Status CopyLocal(const Buffer& src, const Buffer& dst) override;
  absl::Status DoAllReduceSum(const Buffer& data, std::chrono::milliseconds timeout) override;
  absl::Status DoAllGather(const Buffer& in, const Buffer& out,
                           std::chrono::milliseconds timeout) override;
  absl::Status DoReduceScatterSum(const Buffer& in, const Buffer& out,
                                  std::chrono::milliseconds timeout) override;
  absl::Status DoBroadcast(const Buffer& data, int root,
                           std::chrono::milliseconds timeout) override;
  absl::Status DoBarrier(std::chrono::milliseconds timeout) override;

 private:
  // Enqueues with `enqueue` (returns the NCCL result), then waits as the header comment says.
  template <typename Fn>
  absl::Status Issue(const char* call, const char* file, int line,
                     std::chrono::milliseconds timeout, Fn&& enqueue);
  // Polls until the work enqueued on stream_ so far is done or `deadline` passes.
  absl::Status WaitStream(const char* call, const char* file, int line,
                          std::chrono::steady_clock::time_point deadline,
                          std::chrono::milliseconds timeout);
  void Abort();

  ncclComm_t comm_;
  int device_;  // device().index: the ordinal every CUDA call selects first
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  float* scratch_ = nullptr;  // one device float: the barrier's all-reduce
  bool aborted_ = false;
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_NCCL_NCCL_GROUP_H_
