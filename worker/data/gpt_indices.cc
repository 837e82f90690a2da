#include "worker/data/gpt_indices.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/data/numpy_random.h"

namespace latchkey {
namespace {

// numpy's pairwise float64 sum (numpy/_core/src/umath/loops_utils.h.src), so normalised
// weights equal Megatron's to the last bit for any blend size.
double PairwiseSum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return PairwiseSum(a, n2) + PairwiseSum(a + n2, n - n2);
}

// gpt_dataset.py _build_document_index without the final-epoch separation.
std::vector<int32_t> DocumentIndex(int64_t begin, int64_t end, int64_t epochs,
                                   LegacyRandomState* rng) {
  std::vector<int32_t> index;
  index.reserve(static_cast<size_t>((end - begin) * epochs));
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t i = begin; i < end; ++i) index.push_back(static_cast<int32_t>(i));
  }
  rng->Shuffle(&index);
  return index;
}

// helpers.cpp build_sample_idx (drop_last_partial_sequence, add_extra_token_to_sequence).
std::vector<int64_t> SampleIndex(const std::function<int32_t(int64_t)>& length,
                                 const std::vector<int32_t>& document_index, int seq_length,
                                 int64_t num_epochs, int64_t tokens_per_epoch) {
  constexpr int64_t kExtra = 1;
  const int64_t num_samples = (num_epochs * tokens_per_epoch - kExtra) / seq_length;
  std::vector<int64_t> sample(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t row = 0;
  int64_t doc = 0;     // position in document_index
  int64_t offset = 0;  // token offset in that document
  sample[0] = doc;
  sample[1] = offset;
  ++row;
  const int64_t last_doc = static_cast<int64_t>(document_index.size()) - 1;
  while (row <= num_samples) {
    int64_t remaining = seq_length + kExtra;
    while (remaining != 0) {
      const int64_t doc_length = length(document_index[static_cast<size_t>(doc)]) - offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        // The sample ends inside this document; the next one starts on its last token.
        offset += remaining + doc_length - kExtra;
        remaining = 0;
      } else {
        if (doc == last_doc) {
          offset = length(document_index[static_cast<size_t>(doc)]) - kExtra;
          break;
        }
        ++doc;
        offset = 0;
      }
    }
    sample[static_cast<size_t>(2 * row)] = doc;
    sample[static_cast<size_t>(2 * row + 1)] = offset;
    ++row;
  }
  return sample;
}

// gpt_dataset.py _build_shuffle_index: [0, first) and [first, total) shuffled apart.
std::vector<int64_t> ShuffleIndex(int64_t first, int64_t total, LegacyRandomState* rng) {
  std::vector<int64_t> a(static_cast<size_t>(first));
  for (int64_t i = 0; i < first; ++i) a[static_cast<size_t>(i)] = i;
  rng->Shuffle(&a);
  if (first == total) return a;
  std::vector<int64_t> b(static_cast<size_t>(total - first));
  for (int64_t i = first; i < total; ++i) b[static_cast<size_t>(i - first)] = i;
  rng->Shuffle(&b);
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

std::array<std::optional<std::pair<int64_t, int64_t>>, 3> SplitBounds(
    const std::array<double, 3>& weights, int64_t num_sequences) {
  std::array<std::optional<std::pair<int64_t, int64_t>>, 3> out;
  double lo = 0.0;
  for (int i = 0; i < 3; ++i) {
    const double hi = lo + weights[i];
    if (hi > lo) {
      // Python's round(): half to even, which nearbyint is in the default rounding mode.
      const double n = static_cast<double>(num_sequences);
      out[i] = std::make_pair(static_cast<int64_t>(std::nearbyint(lo * n)),
                              static_cast<int64_t>(std::nearbyint(hi * n)));
    }
    lo = hi;
  }
  return out;
}

absl::StatusOr<GptIndices> BuildGptIndices(const std::function<int32_t(int64_t)>& length,
                                           int64_t begin, int64_t end, int seq_length,
                                           int64_t num_samples, uint32_t seed,
                                           const std::string& field) {
  int64_t tokens_per_epoch = 0;
  for (int64_t i = begin; i < end; ++i) tokens_per_epoch += length(i);
  // Megatron's own limits (helpers.cpp asserts them): an epoch shorter than a sample is
  // repeated as often as needed, but it needs 2 tokens.
  if (tokens_per_epoch < 2 || seq_length < 2 || num_samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": sequences [", begin, ", ", end, ") hold ", tokens_per_epoch,
                     " tokens (Megatron needs at least 2, latchkey.seq_len >= 2 and 1 sample)"));
  }
  GptIndices g;
  // _get_num_epochs: enough epochs for num_samples samples of seq_length + 1 tokens.
  g.num_epochs = 1;
  for (int64_t tokens = tokens_per_epoch; tokens < num_samples * seq_length + 1;
       tokens += tokens_per_epoch) {
    ++g.num_epochs;
  }
  int64_t sans_final = 0;
  if (g.num_epochs > 1) {
    sans_final = ((g.num_epochs - 1) * tokens_per_epoch - 1) / seq_length;
    const int64_t from_final = num_samples - sans_final;
    const int64_t per_epoch = (tokens_per_epoch - 1) / seq_length;
    // Megatron's threshold 0.80, truncated as Python's int() does.
    g.separate_final_epoch =
        from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  LegacyRandomState rng(seed);
  if (!g.separate_final_epoch) {
    g.document_index = DocumentIndex(begin, end, g.num_epochs, &rng);
  } else {
    g.document_index = DocumentIndex(begin, end, g.num_epochs - 1, &rng);
    std::vector<int32_t> last = DocumentIndex(begin, end, 1, &rng);
    g.document_index.insert(g.document_index.end(), last.begin(), last.end());
  }
  g.sample_index =
      SampleIndex(length, g.document_index, seq_length, g.num_epochs, tokens_per_epoch);
  const int64_t rows = static_cast<int64_t>(g.sample_index.size()) / 2 - 1;
  g.shuffle_index = ShuffleIndex(g.separate_final_epoch ? sans_final : rows, rows, &rng);
  return g;
}

void BuildBlendingIndices(const std::vector<double>& weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index) {
  const size_t n = weights.size();
  std::vector<int64_t> current(n, 0);
  dataset_index->assign(static_cast<size_t>(size), 0);
  dataset_sample_index->assign(static_cast<size_t>(size), 0);
  for (int64_t k = 0; k < size; ++k) {
    const double kd = std::max(static_cast<double>(k), 1.0);
    size_t best = 0;
    double best_error = weights[0] * kd - static_cast<double>(current[0]);
    for (size_t i = 1; i < n; ++i) {
      const double error = weights[i] * kd - static_cast<double>(current[i]);
      if (error > best_error) {  // strictly greater: the first maximum wins
        best_error = error;
        best = i;
      }
    }
    (*dataset_index)[static_cast<size_t>(k)] = static_cast<int16_t>(best);
    (*dataset_sample_index)[static_cast<size_t>(k)] = current[best];
    ++current[best];
  }
}

std::vector<double> NormalizeWeights(const std::vector<double>& weights) {
  const double sum = PairwiseSum(weights.data(), static_cast<int64_t>(weights.size()));
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] / sum;
  return out;
}

std::vector<int64_t> BlendSizes(const std::vector<double>& weights, int64_t size,
                                int64_t* blend_size) {
  const double surplus = 1.0 + 0.005;  // mid_level_dataset_surplus, as Megatron adds it
  std::vector<int64_t> out;
  *blend_size = 0;
  for (double w : weights) {
    const double target = std::ceil(static_cast<double>(size) * w);
    *blend_size += static_cast<int64_t>(target);
    out.push_back(static_cast<int64_t>(std::ceil(target * surplus)));
  }
  return out;
}

}  // namespace latchkey
