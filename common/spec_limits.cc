#include "common/spec_limits.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace latchkey {
namespace {

namespace fs = std::filesystem;

// The canonical form of `path`: the realpath of its longest existing prefix, then the remaining
// components lexically normalized (they do not exist, so they hold no symlinks).
absl::StatusOr<fs::path> Resolve(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::path(path);
  if (p.is_relative()) {
    p = fs::absolute(p, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  }
  fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  return resolved.lexically_normal();
}

bool Inside(const fs::path& p, const fs::path& root) {
  // Component-wise prefix test, so /data2 is not inside /data.
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri) {
    if (ri->empty()) continue;  // the trailing "" of "/data/"
    if (pi == p.end() || *pi != *ri) return false;
    ++pi;
  }
  return true;
}

}  // namespace

int64_t ModelParameterCount(const ModelConfig& m) {
  using I = __int128;
  // Every factor is an int, so each product of at most three fits easily in 128 bits.
  const I e = m.n_embd, v = m.vocab_size, p = m.n_positions, l = m.n_layer;
  const I inner = m.n_inner > 0 ? m.n_inner : 4 * e;
  const I d = m.n_head != 0 ? e / m.n_head : 0;
  const I attn_out = m.multi_query ? e + 2 * d : 3 * e;
  const I per_layer = 2 * e                               // ln_1
                      + attn_out * e + attn_out           // attn.c_attn
                      + e * e + e                         // attn.c_proj
                      + 2 * e                             // ln_2
                      + inner * e + inner                 // mlp.c_fc
                      + e * inner + e;                    // mlp.c_proj
  const I total = v * e + p * e + l * per_layer + 2 * e;  // wte, wpe, layers, ln_f
  if (total < 0) return 0;
  if (total > static_cast<I>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(total);
}

absl::Status CheckPathUnderRoots(const std::string& field, const std::string& path,
                                 const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  absl::StatusOr<fs::path> resolved = Resolve(path);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot resolve ", resolved.status().message()));
  }
  for (const std::string& root : roots) {
    absl::StatusOr<fs::path> r = Resolve(root);
    if (r.ok() && Inside(*resolved, *r)) return absl::OkStatus();
  }
  std::string shown = path;
  if (resolved->string() != path)
    absl::StrAppend(&shown, " (resolves to ", resolved->string(), ")");
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", shown, " is outside the data roots (",
                                                 absl::StrJoin(roots, ", "), ") (--data-root)"));
}

absl::Status CheckSpecLimits(const JobSpec& spec, const SpecLimits& limits) {
  if (spec.world_size > limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("latchkey.world_size: ", spec.world_size,
                                                   " exceeds the coordinator's limit of ",
                                                   limits.max_world_size));
  }
  const int64_t params = ModelParameterCount(spec.model);
  if (params > limits.max_model_parameters) {
    char message[160];
    std::snprintf(message, sizeof message,
                  "model: %g parameters exceed the coordinator's limit of %g "
                  "(--max-model-parameters)",
                  static_cast<double>(params), static_cast<double>(limits.max_model_parameters));
    return absl::InvalidArgumentError(message);
  }
  const std::pair<const char*, const std::string*> paths[] = {
      {"latchkey.data.tokens_file", &spec.data.tokens_file},
      {"latchkey.eval.tokens_file", &spec.eval.tokens_file},
      {"latchkey.init_from", &spec.init_from},
      {"latchkey.checkpoint.dir", &spec.checkpoint.dir},
  };
  for (const auto& [field, path] : paths) {
    if (path->empty()) continue;
    absl::Status st = CheckPathUnderRoots(field, *path, limits.data_roots);
    if (!st.ok()) return st;
  }
  // The Megatron dataset's prefixes and its index cache.
  std::vector<std::pair<std::string, std::string>> megatron = {
      {"latchkey.data.path_prefix", spec.data.path_prefix},
      {"latchkey.data.cache_dir", spec.data.cache_dir}};
  for (size_t i = 0; i < spec.data.blend.size(); ++i) {
    megatron.emplace_back("latchkey.data.blend[" + std::to_string(i) + "].path_prefix",
                          spec.data.blend[i].path_prefix);
  }
  for (const auto& [field, path] : megatron) {
    if (path.empty()) continue;
    absl::Status st = CheckPathUnderRoots(field, path, limits.data_roots);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

std::vector<std::string> DataRootsFromEnv() {
  const char* env = std::getenv(kDataRootsEnv);
  if (env == nullptr) return {};
  return absl::StrSplit(env, ':', absl::SkipEmpty());
}

absl::Status CheckPathUnderEnvRoots(const std::string& field, const std::string& path) {
  absl::Status st = CheckPathUnderRoots(field, path, DataRootsFromEnv());
  if (st.ok()) return st;
  return absl::InvalidArgumentError(
      absl::StrCat(st.message(), " [", kDataRootsEnv, " on this worker]"));
}

}  // namespace latchkey
