// TensorBoard event files of a job (docs/observability.md "TensorBoard"), written by rank 0.
// Each attempt opens a new file events.out.tfevents.<secs>.<host>.<pid>.<n> in the folder, whose
// first record is Event{file_version: "brain.Event:2"} and second SessionLog{START} at the
// attempt's first step: TensorBoard then drops what an earlier attempt wrote at that step or
// later, so every tag shows one continuous curve. <secs> is at least one more than that of every
// event file already in the folder, so the files sort in the order they were written.
// Every step is one Event holding one Summary.Value{tag, simple_value} per scalar (tags as the
// JSONL's fields), written as one whole record with one write(2): a kill leaves whole records
// and at most a short tail, which TensorBoard stops at. Torch-free.
#ifndef LATCHKEY_WORKER_TENSORBOARD_EVENT_WRITER_H_
#define LATCHKEY_WORKER_TENSORBOARD_EVENT_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/step_report.h"

namespace latchkey::tensorboard {

// The scalars of one step, by tag, in the JSONL's order: loss, eval_loss (evaluation steps),
// lr, grad_norm, tokens_per_second, step_seconds, kv_allreduce_calls, collective_share,
// checkpoint_seconds (steps that saved), peak_memory_bytes.
std::vector<std::pair<std::string, double>> StepScalars(const StepReport& r);

class EventFileWriter {
 public:
  // Creates `dir` when missing and a new event file in it, starting at `first_step`.
  // Errors name the field latchkey.tensorboard.dir.
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> Open(const std::string& dir,
                                                               int64_t first_step);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One Event at `step` with these scalars (float32, as simple_value holds them).
  absl::Status WriteScalars(int64_t step,
                            const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  EventFileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status WriteRecord(const std::string& event_bytes);
  int fd_;
  std::string path_;
};

}  // namespace latchkey::tensorboard

#endif  // LATCHKEY_WORKER_TENSORBOARD_EVENT_WRITER_H_
