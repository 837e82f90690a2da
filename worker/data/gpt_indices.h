// Megatron-Core's sample order (megatron/core/datasets: gpt_dataset.py, helpers.cpp,
// blended_dataset.py, blended_megatron_dataset_builder.py), torch-free and exact:
//
// - SplitBounds: the [begin, end) sequence range of each split ("90,5,5" normalised, book-ends
//   as running sums, each rounded half-to-even as Python's round does); empty splits are absent.
// - BuildGptIndices: GPTDataset's document index (the split's sequences repeated over the
//   epochs and shuffled, the final epoch shuffled on its own when it is used for less than 80%),
//   sample index (helpers.cpp build_sample_idx: each sample seq_length + 1 tokens, consecutive
//   samples overlapping by one token, crossing documents) and shuffle index, drawn in that order
//   from one numpy RandomState(seed).
// - BuildBlendingIndices: helpers.cpp build_blending_indices: sample k comes from the dataset
//   with the largest error weight_i * max(k, 1) - count_i, the first maximum winning.
// - BlendSizes: the samples each dataset of a blend is built for and the blend's own size.
//
// Thread-safety: pure functions. Errors: INVALID_ARGUMENT naming `field` when a split holds
// fewer than 2 tokens or seq_length < 2 (Megatron's limits; a short split repeats over epochs).
#ifndef LATCHKEY_WORKER_DATA_GPT_INDICES_H_
#define LATCHKEY_WORKER_DATA_GPT_INDICES_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace latchkey {

struct GptIndices {
  std::vector<int32_t> document_index;  // sequence ids, epoch after epoch, shuffled
  std::vector<int64_t> sample_index;    // (document_index position, offset) pairs, rows + 1
  std::vector<int64_t> shuffle_index;   // sample k reads sample_index row shuffle_index[k]
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;

  int64_t num_samples() const { return static_cast<int64_t>(shuffle_index.size()); }
};

// Per split (train, validation, test): [begin, end) over `num_sequences`, or nullopt when the
// split's share is empty. `weights` as ParseMegatronSplit gives them (normalised).
std::array<std::optional<std::pair<int64_t, int64_t>>, 3> SplitBounds(
    const std::array<double, 3>& weights, int64_t num_sequences);

// `length(i)` is the length of sequence i. The split's sequences are [begin, end).
absl::StatusOr<GptIndices> BuildGptIndices(const std::function<int32_t(int64_t)>& length,
                                           int64_t begin, int64_t end, int seq_length,
                                           int64_t num_samples, uint32_t seed,
                                           const std::string& field);

// dataset_index[k], dataset_sample_index[k] for k < size. `weights` normalised.
void BuildBlendingIndices(const std::vector<double>& weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index);

// Megatron's normalize(): w / sum(w) (numpy's float64 sum).
std::vector<double> NormalizeWeights(const std::vector<double>& weights);

// For a blend with normalised `weights` and a target of `size` samples: per dataset the
// samples to build (ceil(ceil(size * w) * (1 + 0.005)), mid_level_dataset_surplus) and, in
// *blend_size, the blend's size (the sum of ceil(size * w)).
std::vector<int64_t> BlendSizes(const std::vector<double>& weights, int64_t size,
                                int64_t* blend_size);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DATA_GPT_INDICES_H_
