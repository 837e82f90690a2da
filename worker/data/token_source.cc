#include "worker/data/token_source.h"

#include <cstdio>
#include <fstream>
#include <iterator>

#include "common/spec_limits.h"
#include "worker/data/megatron_source.h"

namespace latchkey {
namespace {

class FileTokenSource final : public TokenSource {
 public:
  FileTokenSource(std::vector<int64_t> tokens, int seq_len)
      : TokenSource(seq_len), tokens_(std::move(tokens)) {}
  int64_t num_samples() const override {
    return (static_cast<int64_t>(tokens_.size()) - 1) / seq_len_;
  }
  void Sample(int64_t k, int64_t* out) const override {
    const int64_t start = (k % num_samples()) * seq_len_;
    for (int i = 0; i <= seq_len_; ++i) out[i] = tokens_[start + i];
  }

 private:
  std::vector<int64_t> tokens_;
};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class SyntheticTokenSource final : public TokenSource {
 public:
  SyntheticTokenSource(uint64_t seed, int seq_len, int vocab)
      : TokenSource(seq_len), seed_(seed), vocab_(vocab) {}
  int64_t num_samples() const override { return int64_t{1} << 40; }
  void Sample(int64_t k, int64_t* out) const override {
    const uint64_t h = SplitMix64(seed_ * 0x100000001b3ULL + static_cast<uint64_t>(k));
    const int64_t start = static_cast<int64_t>(h % vocab_);
    const int64_t stride = 1 + static_cast<int64_t>((h >> 32) % 7);
    for (int i = 0; i <= seq_len_; ++i) out[i] = (start + stride * i) % vocab_;
  }

 private:
  uint64_t seed_;
  int vocab_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(const std::string& path,
                                                           TokenDtype dtype, int seq_len,
                                                           int vocab_size,
                                                           const std::string& field) {
  if (absl::Status st = CheckPathUnderEnvRoots(field, path); !st.ok()) return st;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(field + ": cannot open token file '" + path + "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t width = dtype == TokenDtype::kUint16 ? 2 : 4;
  if (bytes.size() % width != 0) {
    return absl::InvalidArgumentError(
        field + ": '" + path + "' has " + std::to_string(bytes.size()) +
        " bytes, not a multiple of the dtype width " + std::to_string(width));
  }
  const size_t n = bytes.size() / width;
  if (n < static_cast<size_t>(seq_len) + 1) {
    return absl::InvalidArgumentError(
        field + ": '" + path + "' holds " + std::to_string(n) +
        " tokens, fewer than latchkey.seq_len + 1 = " + std::to_string(seq_len + 1));
  }
  std::vector<int64_t> tokens(n);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    for (size_t b = 0; b < width; ++b) v |= static_cast<uint32_t>(p[i * width + b]) << (8 * b);
    if (v >= static_cast<uint32_t>(vocab_size)) {
      return absl::InvalidArgumentError(field + ": token " + std::to_string(v) + " at index " +
                                        std::to_string(i) + " of '" + path +
                                        "' is >= model.vocab_size " + std::to_string(vocab_size));
    }
    tokens[i] = v;
  }
  return std::unique_ptr<TokenSource>(new FileTokenSource(std::move(tokens), seq_len));
}

std::unique_ptr<TokenSource> MakeSyntheticSource(uint64_t seed, int seq_len, int vocab_size) {
  return std::make_unique<SyntheticTokenSource>(seed, seq_len, vocab_size);
}

absl::StatusOr<std::unique_ptr<TokenSource>> OpenDataSource(const JobSpec& spec) {
  if (spec.data.format == DataFormat::kMegatron) {
    return OpenMegatronSource(spec, MegatronSplit::kTrain, spec.data.num_samples);
  }
  if (spec.data.synthetic_seed.has_value()) {
    return MakeSyntheticSource(*spec.data.synthetic_seed, spec.seq_len, spec.model.vocab_size);
  }
  return OpenTokenFile(spec.data.tokens_file, spec.data.dtype, spec.seq_len, spec.model.vocab_size,
                       "latchkey.data.tokens_file");
}

absl::StatusOr<int64_t> TokenizeBytesFile(const std::string& text_path,
                                          const std::string& out_path) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open text file '" + text_path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  out.reserve(text.size() * 2);
  for (unsigned char c : text) {
    out.push_back(static_cast<char>(c));
    out.push_back(0);
  }
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o) return absl::PermissionDeniedError("cannot write '" + tmp + "'");
    o.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!o) return absl::DataLossError("short write to '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
    return absl::InternalError("cannot rename '" + tmp + "' to '" + out_path + "'");
  }
  return static_cast<int64_t>(text.size());
}

}  // namespace latchkey
