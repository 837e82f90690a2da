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
#include "common/job_uid.h"
#include "common/model_config.h"
#include "common/spec_limits.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/train_checkpoint_internal.h"

namespace latchkey {
namespace {

constexpr char kManifestName[] = "manifest.json";

absl::Status OsError(absl::string_view what, const std::string& path, int err) {
  return WithErrno(absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(err))),
                   err);
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
  if (!m.job_uid.empty()) j["job_uid"] = m.job_uid;
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
    m.job_uid = j.value("job_uid", std::string());  // absent before job uids
    if (!m.job_uid.empty() && !IsJobUid(m.job_uid)) {
      return absl::DataLossError(absl::StrCat(source, ": job_uid \"", m.job_uid,
                                              "\" is not 8 to 64 lowercase hex digits"));
    }
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

}  // namespace

absl::StatusOr<CheckpointManifest> ReadManifestOnly(const std::string& step_dir,
                                                    absl::string_view expected,
                                                    std::string* sha256) {
  if (absl::Status st = CheckPathUnderEnvRoots("latchkey.checkpoint.dir", step_dir); !st.ok()) {
    return st;
  }
  const std::string path = JoinPath(step_dir, kManifestName);
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  const std::string sha = Sha256Hex(*text);
  if (!expected.empty() && sha != expected) {
    return absl::DataLossError(absl::StrCat(path, ": SHA-256 ", sha, ", expected ", expected));
  }
  if (sha256 != nullptr) *sha256 = sha;
  absl::StatusOr<CheckpointManifest> m = ParseManifest(*text, path);
  if (!m.ok()) return m.status();
  const std::string base = std::filesystem::path(step_dir).lexically_normal().filename().string();
  if (std::optional<CheckpointDirName> name = ParseCheckpointDirName(base)) {
    if (name->step != m->step) {
      return absl::DataLossError(absl::StrCat(path, ": step ", m->step, " in folder ", base));
    }
    // step-N.<uid> is named after the job that committed it.
    if (!name->job_uid.empty() && name->job_uid != m->job_uid) {
      return absl::DataLossError(
          absl::StrCat(path, ": job_uid \"", m->job_uid, "\" in folder ", base));
    }
  }
  return m;
}

absl::Status CheckManifestFits(const std::string& dir, const CheckpointManifest& m,
                               const CheckpointManifest& want, const std::string& job_id,
                               const std::string& job_uid) {
  const auto refuse = [&](absl::string_view field, const auto& have, const auto& need) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir, ": ", field, " ", have, ", this job has ", need));
  };
  if (!job_id.empty() && m.job_id != job_id) return refuse("job_id", m.job_id, job_id);
  if (!job_uid.empty() && !m.job_uid.empty() && m.job_uid != job_uid) {
    return refuse("job_uid", m.job_uid, job_uid);
  }
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
  if (absl::Status st = FsyncDirectory(temp_dir); !st.ok()) return st;
  entry.bytes = static_cast<int64_t>(bytes.size());
  entry.sha256 = Sha256Hex(bytes);
  return entry;
}

absl::StatusOr<CommittedCheckpoint> CommitCheckpoint(const std::string& root,
                                                     const std::string& temp_dir,
                                                     const CheckpointManifest& manifest) {
  if (static_cast<int>(manifest.files.size()) != manifest.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(temp_dir, ": manifest lists ", manifest.files.size(), " files for world_size ",
                     manifest.world_size));
  }
  // Decided before anything is written: a refusal leaves the temporary folder as it was.
  absl::StatusOr<std::string> name = CommitDirName(root, manifest);
  if (!name.ok()) return name.status();
  const std::string text = SerializeManifest(manifest);
  const std::string tmp = JoinPath(temp_dir, std::string(kManifestName) + ".tmp");
  const std::string placed = JoinPath(temp_dir, kManifestName);
  // Until the folder is renamed nothing is committed: a failure removes the manifest again, so
  // that the temporary folder holds only the ranks' files (a full disk: docs/fault-tolerance.md).
  const auto unwritten = [&](absl::Status st) {
    ::unlink(tmp.c_str());
    ::unlink(placed.c_str());
    return st;
  };
  if (absl::Status st = WriteAndSync(tmp, text); !st.ok()) return unwritten(st);
  if (absl::Status st = Rename(tmp, placed); !st.ok()) return unwritten(st);
  if (absl::Status st = FsyncDirectory(temp_dir); !st.ok()) return unwritten(st);
  std::string final_dir;
  std::string aside;
  for (bool again = false;; again = true) {
    final_dir = JoinPath(root, *name);
    absl::StatusOr<PathKind> kind = GetPathKind(final_dir);
    if (!kind.ok()) return kind.status();
    if (*kind != PathKind::kMissing) {
      // A committed folder of this step of this job, from an attempt the coordinator never
      // heard from. Moved aside under a temporary name of this job's, so that only its pruning
      // may remove what a crash leaves of it.
      aside = JoinPath(root, CheckpointAsideDirName(manifest.step, manifest.job_uid));
      if (absl::Status st = RemoveTree(aside); !st.ok()) return st;
      if (absl::Status st = Rename(final_dir, aside); !st.ok()) return st;
    }
    if (::rename(temp_dir.c_str(), final_dir.c_str()) == 0) break;
    const int err = errno;
    // Another job committed the same step between the choice of the name and the rename (a
    // rename onto its folder fails): the name is chosen again, once.
    if (again || (err != ENOTEMPTY && err != EEXIST)) {
      return OsError(absl::StrCat("cannot rename ", temp_dir, " to"), final_dir, err);
    }
    name = CommitDirName(root, manifest);
    if (!name.ok()) return name.status();
  }
  if (absl::Status st = FsyncDirectory(root); !st.ok()) return st;
  if (!aside.empty()) {
    if (absl::Status st = RemoveTree(aside); !st.ok()) return st;
    if (absl::Status st = FsyncDirectory(root); !st.ok()) return st;
  }
  return CommittedCheckpoint{final_dir, Sha256Hex(text)};
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
  absl::StatusOr<CheckpointManifest> m =
      ReadManifestOnly(step_dir, expected_manifest_sha256, nullptr);
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
  absl::StatusOr<CheckpointManifest> m =
      ReadManifestOnly(step_dir, expected_manifest_sha256, nullptr);
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

}  // namespace latchkey
