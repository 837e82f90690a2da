#include "worker/checkpoint/train_checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_config.h"
#include "common/spec_limits.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/files.h"

namespace latchkey {
namespace {

constexpr char kManifestName[] = "manifest.json";

absl::Status OsError(absl::string_view what, const std::string& path, int err) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return OsError("cannot open folder", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return OsError("cannot fsync folder", dir, err);
  return absl::OkStatus();
}

// Writes `contents` to `path` (created or truncated) and fsyncs it.
absl::Status WriteAndSync(const std::string& path, absl::string_view contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return OsError("cannot create", path, errno);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t w = ::write(fd, contents.data() + done, contents.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return OsError("cannot write", path, err);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return OsError("cannot fsync", path, err);
  }
  if (::close(fd) != 0) return OsError("cannot close", path, errno);
  return absl::OkStatus();
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return OsError(absl::StrCat("cannot rename ", from, " to"), to, errno);
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// "step-00000011" -> 11; -1 for any other name.
int64_t ParseStepDirName(const std::string& name) {
  const std::string kPrefix = "step-";
  if (name.size() != kPrefix.size() + 8 || name.compare(0, kPrefix.size(), kPrefix) != 0) {
    return -1;
  }
  int64_t step = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool IsTempDirName(const std::string& name) {
  return name.size() > 10 && name.compare(0, 6, ".step-") == 0 &&
         name.compare(name.size() - 4, 4, ".tmp") == 0;
}

struct RootEntries {
  std::vector<int64_t> steps;           // committed step-N folders, newest first
  std::vector<std::string> temp_names;  // .step-*.tmp folders
};

absl::StatusOr<RootEntries> ListRoot(const std::string& root) {
  RootEntries out;
  std::error_code ec;
  std::filesystem::directory_iterator it(root, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", root, ": ", ec.message()));
  for (const auto& entry : it) {
    std::error_code dir_ec;
    if (!entry.is_directory(dir_ec)) continue;
    const std::string name = entry.path().filename().string();
    if (int64_t step = ParseStepDirName(name); step >= 0) {
      out.steps.push_back(step);
    } else if (IsTempDirName(name)) {
      out.temp_names.push_back(name);
    }
  }
  std::sort(out.steps.rbegin(), out.steps.rend());
  return out;
}

nlohmann::ordered_json TensorsToJson(const std::vector<CheckpointTensor>& tensors) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const CheckpointTensor& t : tensors) {
    nlohmann::ordered_json e;
    e["name"] = t.kind + "/" + t.param;
    e["kind"] = t.kind;
    e["param"] = t.param;
    e["dtype"] = "F32";
    e["shape"] = t.shape;
    nlohmann::ordered_json pieces = nlohmann::ordered_json::array();
    for (const CheckpointPiece& p : t.pieces) {
      nlohmann::ordered_json q;
      q["file"] = p.file;
      q["key"] = p.key;
      q["offsets"] = p.offsets;
      q["shape"] = p.shape;
      q["sha256"] = p.sha256;
      pieces.push_back(std::move(q));
    }
    e["pieces"] = std::move(pieces);
    out.push_back(std::move(e));
  }
  return out;
}

std::string SerializeManifest(const CheckpointManifest& m) {
  nlohmann::ordered_json j;
  const bool v2 = m.version >= 2;
  j["format"] = v2 ? kTrainCheckpointFormat : kTrainCheckpointFormatV1;
  j["job_id"] = m.job_id;
  j["step"] = m.step;
  j["attempt"] = m.attempt;
  j["latch_generation"] = m.latch_generation;
  j["next_window"] = m.next_window;
  j["next_first_micro_batch"] = m.next_first_micro_batch;
  if (v2) {
    j["next_first_sample"] = m.next_first_sample;
    j["seed"] = m.seed;
  }
  j["world_size"] = m.world_size;
  j["tp"] = m.tp;
  j["dp"] = m.dp;
  j["zero_stage"] = m.zero_stage;
  j["bf16"] = m.bf16;
  j["optimizer"] = m.optimizer;
  if (v2) j["optimizer_step"] = m.optimizer_step;
  j["compute_threads"] = m.compute_threads;
  j["model"] = ModelConfigToJson(m.model, ModelJsonFormat::kManifest);
  if (v2) j["tensors"] = TensorsToJson(m.tensors);
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const CheckpointFileEntry& f : m.files) {
    nlohmann::ordered_json e;
    e["name"] = f.name;
    e["bytes"] = f.bytes;
    e["sha256"] = f.sha256;
    files.push_back(std::move(e));
  }
  j["files"] = std::move(files);
  j["created_unix_seconds"] = m.created_unix_seconds;
  return j.dump(2) + "\n";
}

// Version 2's logical tensors; every piece's file must be one the manifest lists.
absl::Status ParseTensors(const nlohmann::json& j, const std::string& source,
                          CheckpointManifest& m) {
  for (const auto& t : j) {
    CheckpointTensor e;
    e.kind = t.at("kind").get<std::string>();
    e.param = t.at("param").get<std::string>();
    e.shape = t.at("shape").get<std::vector<int64_t>>();
    for (const auto& p : t.at("pieces")) {
      CheckpointPiece q;
      q.file = p.at("file").get<std::string>();
      q.key = p.at("key").get<std::string>();
      q.offsets = p.at("offsets").get<std::vector<int64_t>>();
      q.shape = p.at("shape").get<std::vector<int64_t>>();
      q.sha256 = p.at("sha256").get<std::string>();
      const bool listed =
          std::any_of(m.files.begin(), m.files.end(),
                      [&](const CheckpointFileEntry& f) { return f.name == q.file; });
      if (!listed || q.offsets.size() != e.shape.size() || q.shape.size() != e.shape.size()) {
        return absl::DataLossError(absl::StrCat(source, ": tensor ", e.kind, "/", e.param,
                                                ": piece ", q.key, " in ", q.file,
                                                " names an unlisted file or has another rank"));
      }
      e.pieces.push_back(std::move(q));
    }
    m.tensors.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointManifest> ParseManifest(const std::string& text,
                                                 const std::string& source) {
  CheckpointManifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    const std::string format = j.at("format").get<std::string>();
    if (format == kTrainCheckpointFormatV1) {
      m.version = 1;
    } else if (format != kTrainCheckpointFormat) {
      return absl::DataLossError(absl::StrCat(source, ": format \"", format, "\", expected \"",
                                              kTrainCheckpointFormat, "\" or \"",
                                              kTrainCheckpointFormatV1, "\""));
    }
    m.job_id = j.at("job_id").get<std::string>();
    m.step = j.at("step").get<int64_t>();
    m.attempt = j.at("attempt").get<int64_t>();
    m.latch_generation = j.at("latch_generation").get<int64_t>();
    m.next_window = j.at("next_window").get<int64_t>();
    m.next_first_micro_batch = j.at("next_first_micro_batch").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.tp = j.at("tp").get<int>();
    m.dp = j.at("dp").get<int>();
    m.zero_stage = j.at("zero_stage").get<int>();
    m.bf16 = j.at("bf16").get<bool>();
    m.optimizer = j.at("optimizer").get<std::string>();
    m.compute_threads = j.at("compute_threads").get<int>();
    absl::StatusOr<ModelConfig> model =
        ModelConfigFromJson(j.at("model"), ModelJsonFormat::kManifest);
    if (!model.ok()) {
      return absl::DataLossError(
          absl::StrCat(source, ": malformed manifest: ", model.status().message()));
    }
    m.model = *model;
    for (const auto& f : j.at("files")) {
      CheckpointFileEntry e;
      e.name = f.at("name").get<std::string>();
      e.bytes = f.at("bytes").get<int64_t>();
      e.sha256 = f.at("sha256").get<std::string>();
      m.files.push_back(std::move(e));
    }
    m.created_unix_seconds = j.at("created_unix_seconds").get<int64_t>();
    if (m.version >= 2) {
      m.next_first_sample = j.at("next_first_sample").get<int64_t>();
      m.seed = j.at("seed").get<uint64_t>();
      m.optimizer_step = j.at("optimizer_step").get<int64_t>();
      if (absl::Status st = ParseTensors(j.at("tensors"), source, m); !st.ok()) return st;
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(source, ": malformed manifest: ", e.what()));
  }
  if (m.world_size < 1 || static_cast<int>(m.files.size()) != m.world_size || m.tp < 1 ||
      m.dp < 1 || m.tp * m.dp != m.world_size) {
    return absl::DataLossError(absl::StrCat(source, ": lists ", m.files.size(),
                                            " files for world_size ", m.world_size, " (tp ", m.tp,
                                            ", dp ", m.dp, ")"));
  }
  for (int r = 0; r < m.world_size; ++r) {
    if (m.files[r].name != CheckpointRankFileName(r)) {
      return absl::DataLossError(absl::StrCat(source, ": file ", r, " is \"", m.files[r].name,
                                              "\", expected \"", CheckpointRankFileName(r), "\""));
    }
  }
  return m;
}

// The manifest of step_dir, its SHA-256 checked against `expected` when non-empty.
absl::StatusOr<CheckpointManifest> ReadManifestOnly(const std::string& step_dir,
                                                    absl::string_view expected) {
  if (absl::Status st = CheckPathUnderEnvRoots("latchkey.checkpoint.dir", step_dir); !st.ok()) {
    return st;
  }
  const std::string path = JoinPath(step_dir, kManifestName);
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  if (!expected.empty()) {
    const std::string sha = Sha256Hex(*text);
    if (sha != expected) {
      return absl::DataLossError(absl::StrCat(path, ": SHA-256 ", sha, ", expected ", expected));
    }
  }
  absl::StatusOr<CheckpointManifest> m = ParseManifest(*text, path);
  if (!m.ok()) return m.status();
  const std::string base = std::filesystem::path(step_dir).lexically_normal().filename().string();
  if (int64_t step = ParseStepDirName(base); step >= 0 && step != m->step) {
    return absl::DataLossError(absl::StrCat(path, ": step ", m->step, " in folder ", base));
  }
  return m;
}

}  // namespace

std::string CheckpointStepDirName(int64_t step) {
  return absl::StrFormat("step-%08d", static_cast<long long>(step));
}

std::string CheckpointTempDirName(int64_t step, int64_t attempt) {
  return absl::StrFormat(".step-%08d.a%d.tmp", static_cast<long long>(step),
                         static_cast<long long>(attempt));
}

std::string CheckpointRankFileName(int rank) {
  return absl::StrFormat("rank-%05d.safetensors", rank);
}

absl::Status CheckManifestFits(const std::string& dir, const CheckpointManifest& m,
                               const CheckpointManifest& want, const std::string& job_id) {
  const auto refuse = [&](absl::string_view field, const auto& have, const auto& need) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir, ": ", field, " ", have, ", this job has ", need));
  };
  if (!job_id.empty() && m.job_id != job_id) return refuse("job_id", m.job_id, job_id);
  if (m.optimizer != want.optimizer) return refuse("optimizer", m.optimizer, want.optimizer);
  if (m.model != want.model) {
    return refuse("model", ModelConfigToJson(m.model, ModelJsonFormat::kManifest).dump(),
                  ModelConfigToJson(want.model, ModelJsonFormat::kManifest).dump());
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointFileEntry> WriteCheckpointRankFile(const std::string& temp_dir, int rank,
                                                            const StFile& file) {
  if (absl::Status st = CheckPathUnderEnvRoots("latchkey.checkpoint.dir", temp_dir); !st.ok()) {
    return st;
  }
  if (absl::Status st = ValidateStFile(file); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(temp_dir, ": not writing rank ", rank, ": ", st.message()));
  }
  if (absl::Status st = CreateDirectories(temp_dir); !st.ok()) return st;
  CheckpointFileEntry entry;
  entry.name = CheckpointRankFileName(rank);
  const std::string bytes = SerializeSafetensors(file);
  const std::string path = JoinPath(temp_dir, entry.name);
  if (absl::Status st = WriteAndSync(path, bytes); !st.ok()) return st;
  if (absl::Status st = FsyncDir(temp_dir); !st.ok()) return st;
  entry.bytes = static_cast<int64_t>(bytes.size());
  entry.sha256 = Sha256Hex(bytes);
  return entry;
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& root, const std::string& temp_dir,
                                             const CheckpointManifest& manifest) {
  if (static_cast<int>(manifest.files.size()) != manifest.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(temp_dir, ": manifest lists ", manifest.files.size(), " files for world_size ",
                     manifest.world_size));
  }
  const std::string text = SerializeManifest(manifest);
  const std::string tmp = JoinPath(temp_dir, std::string(kManifestName) + ".tmp");
  if (absl::Status st = WriteAndSync(tmp, text); !st.ok()) return st;
  if (absl::Status st = Rename(tmp, JoinPath(temp_dir, kManifestName)); !st.ok()) return st;
  if (absl::Status st = FsyncDir(temp_dir); !st.ok()) return st;
  const std::string final_dir = JoinPath(root, CheckpointStepDirName(manifest.step));
  absl::StatusOr<PathKind> kind = GetPathKind(final_dir);
  if (!kind.ok()) return kind.status();
  std::string aside;
  if (*kind != PathKind::kMissing) {
    // A committed folder of this step from an attempt the coordinator never heard from.
    aside = JoinPath(
        root, absl::StrFormat(".step-%08d.replaced.tmp", static_cast<long long>(manifest.step)));
    if (absl::Status st = RemoveAll(aside); !st.ok()) return st;
    if (absl::Status st = Rename(final_dir, aside); !st.ok()) return st;
  }
  if (absl::Status st = Rename(temp_dir, final_dir); !st.ok()) return st;
  if (absl::Status st = FsyncDir(root); !st.ok()) return st;
  if (!aside.empty()) {
    if (absl::Status st = RemoveAll(aside); !st.ok()) return st;
    if (absl::Status st = FsyncDir(root); !st.ok()) return st;
  }
  return Sha256Hex(text);
}

ResumePoint ResumePointFor(const CheckpointManifest& m, int dp, int micro_batch) {
  ResumePoint p;
  p.next_window = m.next_window;
  p.next_first_sample = m.next_first_sample >= 0
                            ? m.next_first_sample
                            : m.next_first_micro_batch * m.dp * static_cast<int64_t>(micro_batch);
  const int64_t per_micro_batch = static_cast<int64_t>(dp) * micro_batch;
  p.next_first_micro_batch = dp == m.dp || per_micro_batch <= 0
                                 ? m.next_first_micro_batch
                                 : p.next_first_sample / per_micro_batch;
  return p;
}

absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(
    const std::string& step_dir, absl::string_view expected_manifest_sha256) {
  absl::StatusOr<CheckpointManifest> m = ReadManifestOnly(step_dir, expected_manifest_sha256);
  if (!m.ok()) return m.status();
  for (const CheckpointFileEntry& f : m->files) {
    const std::string file_path = JoinPath(step_dir, f.name);
    std::error_code ec;
    const auto size = std::filesystem::file_size(file_path, ec);
    if (ec) return absl::DataLossError(absl::StrCat(file_path, ": ", ec.message()));
    if (static_cast<int64_t>(size) != f.bytes) {
      return absl::DataLossError(
          absl::StrCat(file_path, ": ", size, " bytes, the manifest says ", f.bytes));
    }
  }
  return m;
}

absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& step_dir,
                                                    absl::string_view expected_manifest_sha256) {
  absl::StatusOr<CheckpointManifest> m = ReadManifestOnly(step_dir, expected_manifest_sha256);
  if (!m.ok()) return m.status();
  for (const CheckpointFileEntry& f : m->files) {
    const std::string file_path = JoinPath(step_dir, f.name);
    absl::StatusOr<std::string> bytes = ReadWholeFile(file_path);
    if (!bytes.ok()) return bytes.status();
    if (static_cast<int64_t>(bytes->size()) != f.bytes) {
      return absl::DataLossError(
          absl::StrCat(file_path, ": ", bytes->size(), " bytes, the manifest says ", f.bytes));
    }
    const std::string sha = Sha256Hex(*bytes);
    if (sha != f.sha256) {
      return absl::DataLossError(
          absl::StrCat(file_path, ": SHA-256 ", sha, ", the manifest says ", f.sha256));
    }
  }
  return m;
}

absl::StatusOr<StFile> ReadCheckpointRankFile(const std::string& step_dir, int rank) {
  return ReadSafetensorsFile(JoinPath(step_dir, CheckpointRankFileName(rank)));
}

absl::StatusOr<std::optional<int64_t>> NewestValidCheckpoint(const std::string& root,
                                                             const std::string& job_id) {
  if (absl::Status st = CheckPathUnderEnvRoots("latchkey.checkpoint.dir", root); !st.ok()) {
    return st;
  }
  absl::StatusOr<RootEntries> entries = ListRoot(root);
  if (!entries.ok()) return entries.status();
  for (int64_t step : entries->steps) {
    absl::StatusOr<CheckpointManifest> m =
        VerifyCheckpoint(JoinPath(root, CheckpointStepDirName(step)), "");
    if (!m.ok()) continue;  // partial or damaged: never loaded
    if (!job_id.empty() && m->job_id != job_id) continue;
    return std::optional<int64_t>(step);
  }
  return std::optional<int64_t>();
}

absl::Status PruneCheckpoints(const std::string& root, int keep, int64_t protect_step) {
  absl::StatusOr<RootEntries> entries = ListRoot(root);
  if (!entries.ok()) return entries.status();
  bool removed = false;
  // The newest committed checkpoint is always kept.
  const size_t kept = static_cast<size_t>(std::max(keep, 1));
  for (size_t i = kept; i < entries->steps.size(); ++i) {
    const int64_t step = entries->steps[i];
    if (step == protect_step) continue;
    if (absl::Status st = RemoveAll(JoinPath(root, CheckpointStepDirName(step))); !st.ok()) {
      return st;
    }
    removed = true;
  }
  // No save is in flight after a commit: every temporary folder is left by an earlier attempt.
  for (const std::string& name : entries->temp_names) {
    if (absl::Status st = RemoveAll(JoinPath(root, name)); !st.ok()) return st;
    removed = true;
  }
  if (removed) return FsyncDir(root);
  return absl::OkStatus();
}

}  // namespace latchkey
