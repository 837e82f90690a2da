// Training data in the exact order of docs/data.md.
// A token file is packed little-endian ids (uint16 or uint32). With S = seq_len and N tokens there
// are floor((N-1)/S) samples; sample k is tokens[k*S, k*S+S+1).
// Thread-safety: const methods are thread-safe.
#ifndef LATCHKEY_WORKER_DATA_TOKEN_SOURCE_H_
#define LATCHKEY_WORKER_DATA_TOKEN_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"

namespace latchkey {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t num_samples() const = 0;
  // Writes the S+1 tokens of sample (k mod num_samples) to out[0, S+1).
  virtual void Sample(int64_t k, int64_t* out) const = 0;
  // As Sample, returning the errors of a source that checks its tokens when it first reads
  // them (a Megatron dataset: an id >= vocab_size). Training and evaluation read through it.
  virtual absl::Status Read(int64_t k, int64_t* out) const {
    Sample(k, out);
    return absl::OkStatus();
  }
  int seq_len() const { return seq_len_; }

 protected:
  explicit TokenSource(int seq_len) : seq_len_(seq_len) {}
  int seq_len_;
};

// Reads the whole file. Errors name `field` (e.g. "latchkey.data.tokens_file"): missing file,
// size not a multiple of the dtype, fewer than S+1 tokens, an id >= vocab_size (with its index).
absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(const std::string& path,
                                                           TokenDtype dtype, int seq_len,
                                                           int vocab_size,
                                                           const std::string& field);

// Seeded synthetic sequences (demos and benchmarks only): each sample is an arithmetic
// progression modulo vocab_size with a start and stride drawn from (seed, k), so it is learnable.
std::unique_ptr<TokenSource> MakeSyntheticSource(uint64_t seed, int seq_len, int vocab_size);

// Opens what the spec's `latchkey.data` names: a token file, the synthetic source, or the train
// split of a Megatron dataset (megatron_source.h) built for latchkey.data.num_samples.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenDataSource(const JobSpec& spec);

// The stream position of row b of the window's micro-batch slot `slot` (docs/data.md):
// first_sample + slot * MB + b, where first_sample is the window's (Latch::first_sample) and the
// slot of micro-batch m of DP rank d is MicroBatchSlot (common/latch.h): m * DP + d under an
// even split. A source maps a position to its sample modulo its size; dropout draws from the
// position itself (a second pass over the data draws new masks).
inline int64_t StreamPosition(int64_t first_sample, int64_t slot, int64_t mb, int64_t b) {
  return first_sample + slot * mb + b;
}

// Text → byte-level tokens (vocab 256), written as packed uint16 LE. Returns the token count.
absl::StatusOr<int64_t> TokenizeBytesFile(const std::string& text_path,
                                          const std::string& out_path);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DATA_TOKEN_SOURCE_H_
