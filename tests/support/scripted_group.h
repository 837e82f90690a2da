// Test double: a Group of `size` ranks with no peers behind it. Each collective "succeeds"
// without moving data (as if the other ranks contributed zeros) until the all-reduce budget is
// spent; every all-reduce after that fails with `failure`, as a stuck or vanished peer makes it.
// Lets unit tests drive error paths (timeouts inside autograd, at the boundary) in one thread.
// Header-only, a CPU group (buffers on other devices are refused as every CPU group refuses).
#ifndef LATCHKEY_TESTS_SUPPORT_SCRIPTED_GROUP_H_
#define LATCHKEY_TESTS_SUPPORT_SCRIPTED_GROUP_H_

#include <limits>
#include <memory>
#include <string>

#include "worker/comm/comm.h"

namespace latchkey::testing {

class ScriptedGroup final : public comm::Group {
 public:
  ScriptedGroup(std::string name, int rank, int size, std::shared_ptr<comm::CollectiveStats> stats,
                int ok_all_reduces = std::numeric_limits<int>::max(),
                absl::Status failure = absl::DeadlineExceededError("no progress within 300 ms"))
      : Group(std::move(name), rank, size, comm::Device::Cpu(), std::move(stats)),
        ok_all_reduces_(ok_all_reduces),
        failure_(std::move(failure)) {}

  int all_reduces() const { return all_reduces_; }

 protected:
  const char* backend() const override { return "scripted"; }
  absl::Status DoAllReduceSum(const comm::Buffer&, std::chrono::milliseconds) override {
    if (++all_reduces_ <= ok_all_reduces_) return absl::OkStatus();
    return failure_;
  }
  absl::Status DoAllGather(const comm::Buffer&, const comm::Buffer&,
                           std::chrono::milliseconds) override {
    return absl::OkStatus();
  }
  absl::Status DoReduceScatterSum(const comm::Buffer&, const comm::Buffer&,
                                  std::chrono::milliseconds) override {
    return absl::OkStatus();
  }
  absl::Status DoBroadcast(const comm::Buffer&, int, std::chrono::milliseconds) override {
    return absl::OkStatus();
  }
  absl::Status DoBarrier(std::chrono::milliseconds) override { return absl::OkStatus(); }

 private:
  int ok_all_reduces_;
  absl::Status failure_;
  int all_reduces_ = 0;
};

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_SCRIPTED_GROUP_H_
