#include "worker/data/megatron_source.h"

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "worker/data/gpt_indices.h"
#include "worker/data/index_cache.h"
#include "worker/data/megatron_index.h"

namespace latchkey {
namespace {

const char* SplitName(MegatronSplit s) {
  switch (s) {
    case MegatronSplit::kTrain:
      return "train";
    case MegatronSplit::kValidation:
      return "valid";
    case MegatronSplit::kTest:
      return "test";
  }
  return "train";
}

// One split of one indexed dataset: Megatron's GPTDataset.
struct GptSplit {
  const MegatronIndexedDataset* data = nullptr;
  std::vector<int64_t> document_index;
  std::vector<int64_t> sample_index;
  std::vector<int64_t> shuffle_index;

  int64_t size() const { return static_cast<int64_t>(shuffle_index.size()); }

  // gpt_dataset.py _query_document_sample_shuffle_indices (S + 1 tokens, never padded: the
  // sample index drops the last partial sample).
  absl::Status Read(int64_t k, int seq_len, int64_t* out) const {
    const int64_t row = shuffle_index[static_cast<size_t>(k)];
    const int64_t d0 = sample_index[static_cast<size_t>(2 * row)];
    const int64_t o0 = sample_index[static_cast<size_t>(2 * row + 1)];
    const int64_t d1 = sample_index[static_cast<size_t>(2 * row + 2)];
    const int64_t o1 = sample_index[static_cast<size_t>(2 * row + 3)];
    int64_t n = 0;
    for (int64_t i = d0; i <= d1; ++i) {
      const int64_t seq = document_index[static_cast<size_t>(i)];
      const int64_t offset = i == d0 ? o0 : 0;
      const int64_t count = i == d1 ? o1 + 1 - offset : data->length(seq) - offset;
      if (n + count > seq_len + 1) break;
      if (absl::Status st = data->Read(seq, offset, count, out + n); !st.ok()) return st;
      n += count;
    }
    if (n != seq_len + 1) {
      return absl::InternalError(absl::StrCat(data->prefix(), ": sample ", k, " has ", n,
                                              " tokens, not latchkey.seq_len + 1"));
    }
    return absl::OkStatus();
  }
};

class MegatronTokenSource final : public TokenSource {
 public:
  explicit MegatronTokenSource(int seq_len) : TokenSource(seq_len) {}

  int64_t num_samples() const override {
    return blended_ ? static_cast<int64_t>(dataset_index_.size()) : splits_[0].size();
  }
  absl::Status Read(int64_t k, int64_t* out) const override {
    k %= num_samples();
    if (!blended_) return splits_[0].Read(k, seq_len_, out);
    const GptSplit& s = splits_[static_cast<size_t>(dataset_index_[static_cast<size_t>(k)])];
    return s.Read(dataset_sample_index_[static_cast<size_t>(k)], seq_len_, out);
  }
  void Sample(int64_t k, int64_t* out) const override {
    // Training reads through Read (engine.cc); a caller of Sample cannot take an error, and
    // training on a corrupt id is worse than stopping.
    if (absl::Status st = Read(k, out); !st.ok()) {
      std::fprintf(stderr, "latchkey: %s\n", st.ToString().c_str());
      std::abort();
    }
  }

  std::vector<std::unique_ptr<MegatronIndexedDataset>> files_;
  std::vector<GptSplit> splits_;
  bool blended_ = false;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

std::string IdxSha256(const MegatronIndexedDataset& d) {
  const MappedFile& f = d.idx_file();
  return Sha256Hex(absl::string_view(reinterpret_cast<const char*>(f.data()), f.size()));
}

absl::StatusOr<GptSplit> BuildSplit(const JobSpec& spec, const MegatronIndexedDataset& data,
                                    const std::string& field, MegatronSplit split,
                                    int64_t num_samples, MegatronOpenInfo* info) {
  auto weights = ParseMegatronSplit("latchkey.data.split", spec.data.split);
  if (!weights.ok()) return weights.status();
  const auto bounds = SplitBounds(*weights, data.num_sequences());
  const auto& b = bounds[static_cast<int>(split)];
  if (!b.has_value() || b->second <= b->first) {
    return absl::InvalidArgumentError(
        absl::StrCat("latchkey.data.split: the ", SplitName(split), " split of '", spec.data.split,
                     "' is empty for ", field, " (", data.num_sequences(), " sequences)"));
  }
  const std::string description =
      absl::StrCat("latchkey GPTDataset indices v1\nidx: ", data.prefix(),
                   ".idx\nidx sha256: ", IdxSha256(data), "\nsplit: ", SplitName(split), " [",
                   b->first, ", ", b->second, ")\nseq_length: ", spec.seq_len,
                   "\nnum_samples: ", num_samples, "\nseed: ", spec.data.megatron_seed, "\n");
  auto built =
      LoadOrBuildIndex(MegatronCacheDir(spec), description, [&]() -> absl::StatusOr<IndexArrays> {
        auto g = BuildGptIndices([&data](int64_t i) { return data.length(i); }, b->first, b->second,
                                 spec.seq_len, num_samples,
                                 static_cast<uint32_t>(spec.data.megatron_seed), field);
        if (!g.ok()) return g.status();
        IndexArrays a(3);
        a[0].assign(g->document_index.begin(), g->document_index.end());
        a[1] = std::move(g->sample_index);
        a[2] = std::move(g->shuffle_index);
        return a;
      });
  if (!built.ok()) return built.status();
  if (info != nullptr) {
    (built->built ? info->cache_builds : info->cache_hits) += 1;
    info->cache_refused += built->refused ? 1 : 0;
  }
  GptSplit s;
  s.data = &data;
  if (built->arrays.size() != 3) {
    return absl::DataLossError(built->path + ": not a GPTDataset index (3 arrays)");
  }
  s.document_index = std::move(built->arrays[0]);
  s.sample_index = std::move(built->arrays[1]);
  s.shuffle_index = std::move(built->arrays[2]);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenSource>> OpenMegatronSource(const JobSpec& spec,
                                                                MegatronSplit split,
                                                                int64_t num_samples,
                                                                MegatronOpenInfo* info) {
  auto src = std::make_unique<MegatronTokenSource>(spec.seq_len);
  std::vector<std::pair<std::string, std::string>> files;  // (field, prefix)
  if (spec.data.blend.empty()) {
    files.emplace_back("latchkey.data.path_prefix", spec.data.path_prefix);
  } else {
    for (size_t i = 0; i < spec.data.blend.size(); ++i) {
      files.emplace_back(absl::StrCat("latchkey.data.blend[", i, "].path_prefix"),
                         spec.data.blend[i].path_prefix);
    }
  }
  for (const auto& [field, prefix] : files) {
    auto d = MegatronIndexedDataset::Open(prefix, spec.model.vocab_size);
    if (!d.ok()) return d.status();
    src->files_.push_back(*std::move(d));
  }
  if (spec.data.blend.empty()) {
    // One path_prefix: Megatron's blend ([P], None), a GPTDataset of exactly num_samples.
    auto s = BuildSplit(spec, *src->files_[0], files[0].first, split, num_samples, info);
    if (!s.ok()) return s.status();
    src->splits_.push_back(*std::move(s));
    return std::unique_ptr<TokenSource>(std::move(src));
  }
  std::vector<double> weights;
  for (const MegatronBlendEntry& e : spec.data.blend) weights.push_back(e.weight);
  weights = NormalizeWeights(weights);
  int64_t blend_size = 0;
  const std::vector<int64_t> sizes = BlendSizes(weights, num_samples, &blend_size);
  for (size_t i = 0; i < files.size(); ++i) {
    auto s = BuildSplit(spec, *src->files_[i], files[i].first, split, sizes[i], info);
    if (!s.ok()) return s.status();
    src->splits_.push_back(*std::move(s));
  }
  // BlendedDataset normalises the (already normalised) weights once more.
  src->blended_ = true;
  BuildBlendingIndices(NormalizeWeights(weights), blend_size, &src->dataset_index_,
                       &src->dataset_sample_index_);
  std::vector<int64_t> used(files.size(), 0);
  for (int16_t d : src->dataset_index_) ++used[static_cast<size_t>(d)];
  for (size_t i = 0; i < files.size(); ++i) {
    if (used[i] > src->splits_[i].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("latchkey.data.blend[", i, "]: the blend draws ", used[i],
                       " samples from it, more than the ", src->splits_[i].size(), " built"));
    }
  }
  return std::unique_ptr<TokenSource>(std::move(src));
}

}  // namespace latchkey
