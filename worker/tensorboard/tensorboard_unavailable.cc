// A build without protobuf (core-only): latchkey.tensorboard is refused, naming the field.
#include "absl/strings/str_cat.h"
#include "worker/tensorboard/event_writer.h"

namespace latchkey::tensorboard {

std::vector<std::pair<std::string, double>> StepScalars(const StepReport&) { return {}; }

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Open(const std::string& dir,
                                                                       int64_t) {
  return absl::UnimplementedError(absl::StrCat(
      "latchkey.tensorboard.dir: '", dir, "': this build has no protobuf (no TensorBoard files)"));
}

EventFileWriter::~EventFileWriter() = default;

absl::Status EventFileWriter::WriteScalars(int64_t,
                                           const std::vector<std::pair<std::string, double>>&) {
  return absl::UnimplementedError("latchkey.tensorboard: this build has no protobuf");
}

}  // namespace latchkey::tensorboard
