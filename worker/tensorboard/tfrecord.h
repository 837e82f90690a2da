// TFRecord framing, as TensorBoard reads event files: uint64 length (little-endian), masked
// CRC-32C of those 8 bytes, the data, masked CRC-32C of the data.
#ifndef LATCHKEY_WORKER_TENSORBOARD_TFRECORD_H_
#define LATCHKEY_WORKER_TENSORBOARD_TFRECORD_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace latchkey::tensorboard {

// One framed record (written with one write(2), so a kill leaves whole records or a short tail).
std::string FrameRecord(absl::string_view data);

// The records of `bytes`, in order, stopping at a truncated tail (a record whose header or
// body is cut short is not returned; `*truncated` says whether there was one). A CRC mismatch
// is DATA_LOSS naming the record's offset.
absl::Status ReadRecords(absl::string_view bytes, std::vector<std::string>* records,
                         bool* truncated);

}  // namespace latchkey::tensorboard

#endif  // LATCHKEY_WORKER_TENSORBOARD_TFRECORD_H_
