// One coordinator per database. A coordinator holds an exclusive flock(2) on "<db>.lock", a
// file beside its SQLite database, for as long as it runs; the file names the holder (host,
// pid, since when). A second coordinator on the same database cannot take the lock and refuses
// to start, naming the file and the holder, while the first keeps serving.
//
// Why a kernel lock and not a lease row renewed in the database: the kernel lets go of a flock
// the moment its holder's process ends, kill -9 included, so a successor is never blocked by a
// dead holder (a lease would block it for the lease's time to live) and no write is spent on
// renewals. SQLite's own locks are not used for this: they are taken per transaction and a
// coordinator holds none between calls. On NFS (a shared volume), Linux maps flock onto NFS
// byte-range locks, which the server releases when the holder's host stops renewing its NFS
// lease (90 s by default) if the host itself died. The file is never deleted: removing a lock
// file while another process opens it would let two holders lock two different files.
#ifndef LATCHKEY_SERVER_DATABASE_LOCK_H_
#define LATCHKEY_SERVER_DATABASE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"

namespace latchkey {

class DatabaseLock {
 public:
  // Takes the lock of `db_path` (none for ":memory:" or an empty path). FAILED_PRECONDITION
  // naming the lock file and the holder when another process holds it; UNAVAILABLE when the
  // lock file cannot be opened or written.
  static absl::StatusOr<DatabaseLock> Acquire(const std::string& db_path);

  DatabaseLock(DatabaseLock&& other) noexcept;
  DatabaseLock& operator=(DatabaseLock&& other) noexcept;
  DatabaseLock(const DatabaseLock&) = delete;
  DatabaseLock& operator=(const DatabaseLock&) = delete;
  ~DatabaseLock();  // lets go of the lock (the file stays)

  // The lock file ("" when there is none).
  const std::string& path() const { return path_; }

 private:
  DatabaseLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_DATABASE_LOCK_H_
