// SqliteStore's refusal of a damaged database at open (docs/fault-tolerance.md "A damaged
// database"), before anything is written to it, so the file an operator restores from or
// inspects is the one the coordinator was given:
//
//   - the write-ahead log's header (CheckWalHeader), read before SQLite reads the log: SQLite
//     treats a log whose header fails its checks as empty, so every commit in it would be lost
//     without a word and, when the database file itself holds only the schema's first page, the
//     coordinator would start on a new empty store. A log whose header is sound but whose tail
//     is torn (a frame cut short or changed) is SQLite's own recovery: the frames' checksums
//     chain, the log ends at the last commit before the first frame that fails, and what was
//     committed before it is kept. That is not refused.
//   - PRAGMA quick_check (CheckSound): a file that is no SQLite database, one cut short, and a
//     damaged page (quick_check reads every page of every table and index, O(file size): about
//     a second per few hundred MB).
#include <sqlite3.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "server/sqlite_stmt.h"
#include "server/sqlite_store.h"

namespace latchkey {
namespace {

constexpr int kWalHeaderBytes = 32;
constexpr uint32_t kWalMagic = 0x377f0682;  // | 1: the checksums' words are big-endian
constexpr uint32_t kWalVersion = 3007000;

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

uint32_t LittleEndian32(const unsigned char* p) {
  return (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | uint32_t{p[0]};
}

// What is wrong with a log header ("" when nothing): the checks SQLite's recovery makes
// (wal.c, walIndexRecover) before it reads any frame.
std::string WalHeaderFault(const unsigned char* h) {
  const uint32_t magic = BigEndian32(h);
  if ((magic & ~1u) != kWalMagic) return absl::StrFormat("bad magic number 0x%08x", magic);
  if (BigEndian32(h + 4) != kWalVersion) return "unknown format version";
  const uint32_t page_size = BigEndian32(h + 8);
  if (page_size < 512 || page_size > 65536 || (page_size & (page_size - 1)) != 0) {
    return absl::StrCat("bad page size ", page_size);
  }
  // Fletcher-like sums over the first 24 bytes, in the byte order the magic number names.
  uint32_t s1 = 0, s2 = 0;
  for (int i = 0; i < 24; i += 8) {
    const bool big = (magic & 1) != 0;
    s1 += (big ? BigEndian32(h + i) : LittleEndian32(h + i)) + s2;
    s2 += (big ? BigEndian32(h + i + 4) : LittleEndian32(h + i + 4)) + s1;
  }
  if (s1 != BigEndian32(h + 24) || s2 != BigEndian32(h + 28)) return "bad header checksum";
  return "";
}

}  // namespace

absl::Status SqliteStore::CheckWalHeader(const std::string& path) {
  const std::string wal = path + "-wal";
  std::ifstream in(wal, std::ios::binary);
  if (!in) return absl::OkStatus();  // no log (or ":memory:"): nothing to recover
  unsigned char header[kWalHeaderBytes];
  in.read(reinterpret_cast<char*>(header), kWalHeaderBytes);
  const std::streamsize got = in.gcount();
  if (got == 0) return absl::OkStatus();  // an empty log: SQLite leaves one after a checkpoint
  const std::string fault =
      got < kWalHeaderBytes ? absl::StrCat("cut short (", got, " bytes)") : WalHeaderFault(header);
  if (fault.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "its write-ahead log ", wal, " is damaged (", fault,
      "): the commits in it cannot be read; restore the database and its -wal from a backup, or "
      "move the -wal aside to start from the database's last checkpoint"));
}

absl::Status SqliteStore::CheckSound() {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, "PRAGMA quick_check", -1, &stmt, nullptr);
  std::string verdict;
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, 0);
      verdict = text ? reinterpret_cast<const char*>(text) : "";
      // One line: "*** in database main ***\nPage 15: ..." names the page.
      verdict = absl::StrReplaceAll(verdict, {{"*** in database main ***\n", ""}, {"\n", "; "}});
      rc = SQLITE_OK;
    }
  }
  const int code = sqlite3_errcode(db_);
  const std::string error = sqlite3_errmsg(db_);
  sqlite3_finalize(stmt);
  if (rc == SQLITE_OK && verdict == "ok") return absl::OkStatus();
  constexpr const char* kWhatToDo = ": restore it from a backup or move it aside to start empty";
  if (rc == SQLITE_OK) {  // quick_check's first finding
    return absl::DataLossError(absl::StrCat("damaged (quick_check: ", verdict, ")", kWhatToDo));
  }
  if (code == SQLITE_NOTADB) {
    return absl::DataLossError(absl::StrCat("not a latchkey database (", error, ")", kWhatToDo));
  }
  if (code == SQLITE_CORRUPT) {
    return absl::DataLossError(absl::StrCat("damaged (", error, ")", kWhatToDo));
  }
  // Not the file's contents (I/O, locked by another process, ...): the reason as SQLite gives it.
  return absl::UnavailableError(absl::StrCat("cannot read: ", error));
}

}  // namespace latchkey
