#include "worker/data/megatron_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/spec_limits.h"

namespace latchkey {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

uint64_t LoadU64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

int64_t LoadI64(const unsigned char* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

absl::Status Corrupt(const std::string& path, absl::string_view field, absl::string_view why) {
  return absl::DataLossError(absl::StrCat(path, ": ", field, ": ", why));
}

// Token i of a sequence starting at p, as a double-free integer where the dtype is integral.
template <typename T>
T LoadAs(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

int MegatronDtypeSize(int code) {
  switch (code) {
    case 1:  // uint8
    case 2:  // int8
      return 1;
    case 3:  // int16
    case 8:  // uint16
      return 2;
    case 4:  // int32
    case 7:  // float32
      return 4;
    case 5:  // int64
    case 6:  // float64
      return 8;
    default:
      return 0;
  }
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(why) : absl::PermissionDeniedError(why);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const unsigned char* data = nullptr;
  if (size > 0) {
    // MAP_SHARED read-only: pages come from the page cache on demand and are never copied, so a
    // large .bin costs address space, not memory.
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": cannot mmap: ", std::strerror(err)));
    }
    data = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping keeps the file
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

absl::StatusOr<std::unique_ptr<MegatronIndexedDataset>> MegatronIndexedDataset::Open(
    const std::string& prefix, int64_t vocab_size) {
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  for (const std::string* p : {&idx_path, &bin_path}) {
    if (absl::Status st = CheckPathUnderEnvRoots("latchkey.data.path_prefix", *p); !st.ok()) {
      return st;
    }
  }
  std::unique_ptr<MegatronIndexedDataset> d(new MegatronIndexedDataset());
  d->prefix_ = prefix;
  d->vocab_size_ = vocab_size;
  auto idx = MappedFile::Open(idx_path);
  if (!idx.ok()) return idx.status();
  d->idx_ = *std::move(idx);
  const unsigned char* h = d->idx_->data();
  const uint64_t idx_size = d->idx_->size();
  if (idx_size < kHeaderBytes) {
    return Corrupt(
        idx_path, "header",
        absl::StrCat(idx_size, " bytes, shorter than the ", kHeaderBytes, "-byte header"));
  }
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    return Corrupt(idx_path, "magic", "not MMIDIDX\\x00\\x00 (not a Megatron .idx file)");
  }
  const uint64_t version = LoadU64(h + 9);
  if (version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(idx_path, ": version: ", version, " is not supported (only 1)"));
  }
  d->dtype_code_ = h[17];
  d->item_size_ = MegatronDtypeSize(d->dtype_code_);
  if (d->item_size_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(idx_path, ": dtype code: ", d->dtype_code_, " is not one of 1..8"));
  }
  const uint64_t sequences = LoadU64(h + 18);
  const uint64_t documents = LoadU64(h + 26);
  // Guard the size arithmetic: each count must fit the file on its own first.
  if (sequences > idx_size / 12 || documents > idx_size / 8 ||
      kHeaderBytes + 12 * sequences + 8 * documents != idx_size) {
    return Corrupt(idx_path, "sequence count",
                   absl::StrCat(sequences, " sequences and ", documents, " documents need ",
                                "a different file size than ", idx_size, " bytes"));
  }
  d->num_sequences_ = static_cast<int64_t>(sequences);
  d->num_documents_ = static_cast<int64_t>(documents);
  d->lengths_ = h + kHeaderBytes;
  d->pointers_ = d->lengths_ + 4 * sequences;
  d->documents_ = d->pointers_ + 8 * sequences;

  // Pointers: the running byte sum of the lengths (Megatron's _sequence_pointers).
  int64_t expected = 0;
  for (int64_t i = 0; i < d->num_sequences_; ++i) {
    const int32_t len = d->length(i);
    if (len < 0) {
      return Corrupt(idx_path, absl::StrCat("sequence length[", i, "]"),
                     absl::StrCat(len, " is negative"));
    }
    const int64_t ptr = LoadI64(d->pointers_ + 8 * i);
    if (ptr != expected) {
      return Corrupt(
          idx_path, absl::StrCat("pointer[", i, "]"),
          absl::StrCat(ptr, " does not match the lengths before it (expected ", expected, ")"));
    }
    expected += static_cast<int64_t>(len) * d->item_size_;
  }
  if (d->num_documents_ < 1 || d->document_index(0) != 0) {
    return Corrupt(idx_path, "document index[0]", "the document indices must start with 0");
  }
  for (int64_t j = 1; j < d->num_documents_; ++j) {
    if (d->document_index(j) < d->document_index(j - 1)) {
      return Corrupt(idx_path, absl::StrCat("document index[", j, "]"),
                     absl::StrCat(d->document_index(j), " is smaller than the entry before it (",
                                  d->document_index(j - 1), "): out of order"));
    }
  }
  if (d->document_index(d->num_documents_ - 1) != d->num_sequences_) {
    return Corrupt(idx_path, absl::StrCat("document index[", d->num_documents_ - 1, "]"),
                   absl::StrCat(d->document_index(d->num_documents_ - 1),
                                " is not the sequence count ", d->num_sequences_));
  }

  auto bin = MappedFile::Open(bin_path);
  if (!bin.ok()) return bin.status();
  d->bin_ = *std::move(bin);
  if (d->bin_->size() < static_cast<uint64_t>(expected)) {
    return Corrupt(bin_path, "size",
                   absl::StrCat(d->bin_->size(), " bytes, shorter than the ", expected,
                                " bytes the pointers of ", idx_path, " say"));
  }
  return d;
}

absl::Status MegatronIndexedDataset::Read(int64_t i, int64_t offset, int64_t count,
                                          int64_t* out) const {
  const unsigned char* p =
      bin_->data() + LoadI64(pointers_ + 8 * i) + static_cast<uint64_t>(offset) * item_size_;
  for (int64_t t = 0; t < count; ++t, p += item_size_) {
    int64_t v = 0;
    bool integral = true;
    switch (dtype_code_) {
      case 1:
        v = LoadAs<uint8_t>(p);
        break;
      case 2:
        v = LoadAs<int8_t>(p);
        break;
      case 3:
        v = LoadAs<int16_t>(p);
        break;
      case 4:
        v = LoadAs<int32_t>(p);
        break;
      case 5:
        v = LoadAs<int64_t>(p);
        break;
      case 8:
        v = LoadAs<uint16_t>(p);
        break;
      case 6:
      case 7: {
        const double f = dtype_code_ == 6 ? LoadAs<double>(p) : LoadAs<float>(p);
        integral = std::isfinite(f) && std::floor(f) == f && std::fabs(f) < 9.0e18;
        v = integral ? static_cast<int64_t>(f) : -1;
        break;
      }
    }
    if (!integral || v < 0 || v >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          bin_->path(), ": token ", integral ? absl::StrCat(v) : std::string("(not an integer)"),
          " at position ", offset + t, " of sequence ", i, " is not in [0, model.vocab_size ",
          vocab_size_, ")"));
    }
    out[t] = v;
  }
  return absl::OkStatus();
}

}  // namespace latchkey
