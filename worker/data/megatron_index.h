// Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.py), read without torch:
// P.idx holds the header and the index arrays, P.bin the token ids back to back.
//
//   P.idx: "MMIDIDX\0\0" (9 bytes) | version u64 = 1 | dtype code u8 (1 uint8, 2 int8, 3 int16,
//          4 int32, 5 int64, 6 float64, 7 float32, 8 uint16) | sequence count u64 |
//          document count u64 | int32 sequence lengths[sequence count] |
//          int64 byte pointers[sequence count] | int64 document indices[document count]
//   P.bin: sequence i is lengths[i] items of the dtype at byte pointers[i].
//
// Both files are memory-mapped read-only and never read whole: opening checks the header and
// the index arrays (O(sequences)); token ids are read (and checked against vocab_size) only when
// a sample uses them.
//
// Errors name the file and the field: DATA_LOSS for a file whose contents contradict themselves
// (bad magic, sizes that do not match the counts, pointers that do not follow the lengths, a .bin
// shorter than the pointers say, document indices out of order); INVALID_ARGUMENT for what the
// format allows but latchkey cannot use (another version or dtype code, a token id >= vocab_size);
// NOT_FOUND when a file is missing.
// Thread-safety: immutable after Open; every const method is thread-safe.
#ifndef LATCHKEY_WORKER_DATA_MEGATRON_INDEX_H_
#define LATCHKEY_WORKER_DATA_MEGATRON_INDEX_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latchkey {

// A read-only mapping of a whole file (unmapped on destruction). An empty file maps nothing.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const unsigned char* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const unsigned char* data_;
  uint64_t size_;
};

class MegatronIndexedDataset {
 public:
  // Opens prefix.idx and prefix.bin. vocab_size bounds the token ids read later (Read).
  static absl::StatusOr<std::unique_ptr<MegatronIndexedDataset>> Open(const std::string& prefix,
                                                                      int64_t vocab_size);

  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  int dtype_code() const { return dtype_code_; }
  int item_size() const { return item_size_; }
  const std::string& prefix() const { return prefix_; }
  // The mapped P.idx (its bytes identify the dataset in the index cache).
  const MappedFile& idx_file() const { return *idx_; }

  // The length of sequence i. REQUIRES: 0 <= i < num_sequences().
  int32_t length(int64_t i) const {
    int32_t v;
    std::memcpy(&v, lengths_ + 4 * i, 4);  // the arrays sit at unaligned offsets
    return v;
  }
  // Entry j of the document indices. REQUIRES: 0 <= j < num_documents().
  int64_t document_index(int64_t j) const {
    int64_t v;
    std::memcpy(&v, documents_ + 8 * j, 8);
    return v;
  }

  // Writes tokens [offset, offset + count) of sequence i to out[0, count). INVALID_ARGUMENT
  // naming the .bin, the sequence and the position for an id >= vocab_size, a negative or
  // non-integral one. REQUIRES: 0 <= offset, offset + count <= length(i).
  absl::Status Read(int64_t i, int64_t offset, int64_t count, int64_t* out) const;

 private:
  MegatronIndexedDataset() = default;

  std::string prefix_;
  std::unique_ptr<MappedFile> idx_;
  std::unique_ptr<MappedFile> bin_;
  int dtype_code_ = 0;
  int item_size_ = 0;
  int64_t num_sequences_ = 0;
  int64_t num_documents_ = 0;
  int64_t vocab_size_ = 0;
  const unsigned char* lengths_ = nullptr;
  const unsigned char* pointers_ = nullptr;
  const unsigned char* documents_ = nullptr;
};

// The item size of a Megatron dtype code (0 for an unknown code).
int MegatronDtypeSize(int code);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DATA_MEGATRON_INDEX_H_
