// Pieces of layout-independent checkpoints: written from a rank's held values, described for
// version 1 files, and read back by byte range with their SHA-256 checked.
#include "worker/checkpoint/pieces.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/files.h"

namespace latchkey {
namespace {

absl::string_view Bytes(const float* p, int64_t n) {
  return absl::string_view(reinterpret_cast<const char*>(p), n * sizeof(float));
}

// Where a region starts in its holder's values of HeldRange.
const float* RegionValues(const LayoutTable& t, const Region& r, int rank,
                          const std::vector<const float*>& values) {
  const std::vector<TensorKind> kinds = t.kinds();
  const size_t k = std::find(kinds.begin(), kinds.end(), r.kind) - kinds.begin();
  return values[k] + (r.flat_begin - t.HeldRange(rank, r.kind).first);
}

std::string RectText(const Rect& r) {
  return absl::StrCat("rows [", r.row, ", ", r.row + r.rows, ") cols [", r.col, ", ",
                      r.col + r.cols, ")");
}

// Version 1's tensor names in a rank file.
std::string V1Key(TensorKind kind, bool bf16) {
  switch (kind) {
    case TensorKind::kParam:
      return bf16 ? "master" : "params";
    case TensorKind::kExpAvg:
      return "optimizer.exp_avg";
    case TensorKind::kExpAvgSq:
      return "optimizer.exp_avg_sq";
  }
  return "";
}

}  // namespace

LayoutSpec LayoutOfManifest(const CheckpointManifest& m) {
  return LayoutSpec{m.model, m.tp, m.dp, m.zero_stage, m.bf16, m.optimizer == "AdamW"};
}

std::vector<std::string> ShareDigests(const LayoutTable& table, int rank,
                                      const std::vector<const float*>& values) {
  std::vector<std::string> out;
  for (int i : table.held_by(rank)) {
    const Region& r = table.regions()[i];
    out.push_back(Sha256Hex(Bytes(RegionValues(table, r, rank, values), r.rect.numel())));
  }
  return out;
}

absl::StatusOr<CheckpointFileEntry> WriteShare(const LayoutTable& table,
                                               const std::string& temp_dir, int rank, int64_t step,
                                               const std::vector<const float*>& values) {
  StFile file;
  for (int i : table.held_by(rank)) {
    const Region& r = table.regions()[i];
    if (r.writer != rank) continue;
    const std::vector<int64_t>& shape = table.global_shape(r.param);
    StTensor t{PieceKey(r.kind, table.param_name(r.param), r.rect), StDtype::kF32,
               RectShape(r.rect, shape),
               std::string(Bytes(RegionValues(table, r, rank, values), r.rect.numel()))};
    file.tensors.push_back(std::move(t));
  }
  const LayoutSpec& s = table.spec();
  file.metadata = {{"format", kTrainCheckpointFormat},
                   {"rank", std::to_string(rank)},
                   {"tp_rank", std::to_string(rank % s.tp)},
                   {"dp_rank", std::to_string(rank / s.tp)},
                   {"step", std::to_string(step)}};
  return WriteCheckpointRankFile(temp_dir, rank, file);
}

absl::StatusOr<std::vector<CheckpointTensor>> TensorsFromDigests(
    const LayoutTable& table, const std::vector<std::vector<std::string>>& digests, int64_t step) {
  const int world = table.spec().world();
  // Region index -> each holder's digest.
  std::vector<std::map<int, std::string>> by_region(table.regions().size());
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<int>& held = table.held_by(rank);
    for (size_t j = 0; j < held.size() && j < digests[rank].size(); ++j) {
      by_region[held[j]][rank] = digests[rank][j];
    }
  }
  std::vector<CheckpointTensor> out;
  std::map<std::pair<int, int>, size_t> index;  // (kind, param) -> out
  for (size_t i = 0; i < table.regions().size(); ++i) {
    const Region& r = table.regions()[i];
    const std::string name = absl::StrCat(TensorKindName(r.kind), "/", table.param_name(r.param));
    const std::string& want = by_region[i][r.writer];
    std::map<std::string, std::vector<int>> groups;
    for (const auto& [rank, sha] : by_region[i]) groups[sha].push_back(rank);
    if (groups.size() != 1 || by_region[i].size() != r.holders.size()) {
      std::vector<std::string> parts;
      for (const auto& [sha, ranks] : groups) {
        parts.push_back(absl::StrCat("rank(s) ", absl::StrJoin(ranks, ","), " hold ", sha));
      }
      return absl::DataLossError(absl::StrCat("checkpoint of step ", step, ": replicas of ", name,
                                              " ", RectText(r.rect),
                                              " disagree: ", absl::StrJoin(parts, ", ")));
    }
    const std::vector<int64_t>& shape = table.global_shape(r.param);
    auto [it, fresh] = index.emplace(std::make_pair(static_cast<int>(r.kind), r.param), out.size());
    if (fresh) out.push_back({TensorKindName(r.kind), table.param_name(r.param), shape, {}});
    out[it->second].pieces.push_back(
        {CheckpointRankFileName(r.writer), PieceKey(r.kind, table.param_name(r.param), r.rect),
         RectOffsets(r.rect, shape), RectShape(r.rect, shape), want, 0});
  }
  return out;
}

// One tensor entry of a safetensors header.
struct PieceReader::Entry {
  std::string dtype;
  int64_t begin = 0;  // absolute byte offsets in the file
  int64_t end = 0;
};

struct PieceReader::File {
  std::string path;
  int fd = -1;
  int64_t size = 0;
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
  // Exactly n bytes at `offset`, or DATA_LOSS naming the file.
  absl::Status Read(int64_t offset, int64_t n, char* out) const {
    int64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd, out + done, n - done, offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
      if (got == 0) {
        return absl::DataLossError(absl::StrCat(path, ": truncated: ", n, " bytes at offset ",
                                                offset, " asked for, the file has ", size));
      }
      done += got;
    }
    return absl::OkStatus();
  }
};

PieceReader::~PieceReader() = default;

absl::StatusOr<PieceReader::File*> PieceReader::OpenFile(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second.get();
  auto f = std::make_unique<File>();
  f->path = JoinPath(dir_, name);
  f->fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    return errno == ENOENT ? absl::DataLossError(f->path + ": missing")
                           : absl::InternalError(
                                 absl::StrCat("cannot open ", f->path, ": ", std::strerror(errno)));
  }
  f->size = ::lseek(f->fd, 0, SEEK_END);
  uint8_t len_bytes[8];
  if (absl::Status st = f->Read(0, 8, reinterpret_cast<char*>(len_bytes)); !st.ok()) return st;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > static_cast<uint64_t>(f->size) - 8) {
    return absl::DataLossError(absl::StrCat(f->path, ": truncated: header of ", n, " bytes"));
  }
  std::string header(n, '\0');
  if (absl::Status st = f->Read(8, static_cast<int64_t>(n), header.data()); !st.ok()) return st;
  try {
    const nlohmann::json j = nlohmann::json::parse(header);
    for (const auto& [key, v] : j.items()) {
      if (key == "__metadata__") {
        for (const auto& [mk, mv] : v.items()) f->metadata[mk] = mv.get<std::string>();
        continue;
      }
      const auto offsets = v.at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2) throw nlohmann::json::other_error::create(0, "data_offsets", &v);
      f->entries[key] = {v.at("dtype").get<std::string>(), 8 + static_cast<int64_t>(n) + offsets[0],
                         8 + static_cast<int64_t>(n) + offsets[1]};
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(f->path, ": malformed header: ", e.what()));
  }
  File* out = f.get();
  files_[name] = std::move(f);
  return out;
}

absl::StatusOr<std::unique_ptr<PieceReader>> PieceReader::Open(const std::string& dir,
                                                               CheckpointManifest m,
                                                               bool verify_v1_files) {
  std::unique_ptr<PieceReader> r(new PieceReader());
  r->dir_ = dir;
  r->optimizer_step_ = m.optimizer_step;
  if (m.version < 2) {
    if (verify_v1_files) {
      absl::StatusOr<CheckpointManifest> verified = VerifyCheckpoint(dir, "");
      if (!verified.ok()) return verified.status();
    }
    absl::StatusOr<LayoutTable> table = LayoutTable::Build(LayoutOfManifest(m));
    if (!table.ok()) return table.status();
    // Every region is a contiguous stretch of its writer's flat tensor of that kind.
    std::map<std::pair<int, int>, size_t> index;
    for (const Region& g : table->regions()) {
      const std::vector<int64_t>& shape = table->global_shape(g.param);
      auto [it, fresh] =
          index.emplace(std::make_pair(static_cast<int>(g.kind), g.param), m.tensors.size());
      if (fresh)
        m.tensors.push_back({TensorKindName(g.kind), table->param_name(g.param), shape, {}});
      const int64_t start = table->HeldRange(g.writer, g.kind).first;
      m.tensors[it->second].pieces.push_back({CheckpointRankFileName(g.writer),
                                              V1Key(g.kind, m.bf16), RectOffsets(g.rect, shape),
                                              RectShape(g.rect, shape), "", g.flat_begin - start});
    }
    absl::StatusOr<File*> rank0 = r->OpenFile(CheckpointRankFileName(0));
    if (!rank0.ok()) return rank0.status();
    auto step = (*rank0)->metadata.find("optimizer_step");
    if (step == (*rank0)->metadata.end()) {
      return absl::DataLossError((*rank0)->path + ": no optimizer_step in its metadata");
    }
    r->optimizer_step_ = std::atoll(step->second.c_str());
  }
  r->m_ = std::move(m);
  for (const CheckpointTensor& t : r->m_.tensors) r->by_name_[t.kind + "/" + t.param] = &t;
  return r;
}

absl::StatusOr<const std::vector<float>*> PieceReader::Piece(const CheckpointPiece& p) {
  const std::string id = absl::StrCat(p.file, "\n", p.key, "\n", p.element_offset);
  if (id == cached_id_) return &cached_;
  absl::StatusOr<File*> f = OpenFile(p.file);
  if (!f.ok()) return f.status();
  auto e = (*f)->entries.find(p.key);
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  if (e == (*f)->entries.end() || e->second.dtype != "F32") {
    return absl::DataLossError(absl::StrCat((*f)->path, ": no F32 tensor ", p.key));
  }
  const int64_t begin = e->second.begin + p.element_offset * 4;
  if (p.element_offset < 0 || begin + n * 4 > e->second.end) {
    return absl::DataLossError(absl::StrCat((*f)->path, ": tensor ", p.key, " is shorter than ",
                                            "the piece the manifest names"));
  }
  cached_id_.clear();
  cached_.resize(n);
  if (absl::Status st = (*f)->Read(begin, n * 4, reinterpret_cast<char*>(cached_.data()));
      !st.ok()) {
    return st;
  }
  if (!p.sha256.empty()) {
    const std::string sha = Sha256Hex(Bytes(cached_.data(), n));
    if (sha != p.sha256) {
      return absl::DataLossError(absl::StrCat((*f)->path, ": piece ", p.key, " has SHA-256 ", sha,
                                              ", the manifest says ", p.sha256));
    }
  }
  cached_id_ = id;
  return &cached_;
}

absl::Status PieceReader::FillFlat(const LayoutTable& target, int tp_rank, TensorKind kind,
                                   int64_t begin, int64_t end, float* dst) {
  for (const auto& [block, flat] : target.Cover(tp_rank, begin, end)) {
    const std::string& param = target.param_name(block.param);
    auto t = by_name_.find(absl::StrCat(TensorKindName(kind), "/", param));
    if (t == by_name_.end()) {
      return absl::DataLossError(
          absl::StrCat(dir_, ": no tensor ", TensorKindName(kind), "/", param));
    }
    if (t->second->shape != target.global_shape(block.param)) {
      return absl::DataLossError(
          absl::StrCat(dir_, ": tensor ", TensorKindName(kind), "/", param, " has another shape"));
    }
    int64_t copied = 0;
    for (const CheckpointPiece& p : t->second->pieces) {
      absl::StatusOr<Rect> rect = RectFrom(p.offsets, p.shape, t->second->shape);
      if (!rect.ok()) {
        return absl::DataLossError(
            absl::StrCat(JoinPath(dir_, p.file), ": piece ", p.key, ": ", rect.status().message()));
      }
      if (Intersect(*rect, block.rect).numel() == 0) continue;
      absl::StatusOr<const std::vector<float>*> values = Piece(p);
      if (!values.ok()) return values.status();
      copied += CopyRect((*values)->data(), *rect, dst + (flat - begin), block.rect);
    }
    if (copied != block.rect.numel()) {
      return absl::DataLossError(absl::StrCat(
          dir_, ": the pieces of ", TensorKindName(kind), "/", param, " cover ", copied, " of the ",
          block.rect.numel(), " elements of ", RectText(block.rect)));
    }
  }
  return absl::OkStatus();
}

absl::Status PieceReader::VerifyAllPieces() {
  for (const CheckpointTensor& t : m_.tensors) {
    for (const CheckpointPiece& p : t.pieces) {
      absl::StatusOr<const std::vector<float>*> values = Piece(p);
      if (!values.ok()) return values.status();
    }
  }
  return absl::OkStatus();
}

}  // namespace latchkey
