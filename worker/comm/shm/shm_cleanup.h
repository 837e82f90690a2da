// The names this process holds in a tmpfs (/dev/shm) during an shm rendezvous, unlinked on every
// way out that runs code: the normal paths (the guard's destructor) and the stop signals
// (SIGINT, SIGTERM, SIGHUP, SIGQUIT), whose handler unlinks every name still held and then lets
// the signal do what it did before (the default action ends the process by that signal; a
// handler installed earlier is called). kill -9 leaves a name only while the rendezvous lasts:
// once every rank has mapped the segment, the name is gone (docs/transport.md, Cleanup).
//
// The handler is installed the first time a name is held, for each of those signals that is not
// ignored, and stays (with no name held it behaves as the disposition it replaced).
// Thread-safety: guards may be made and destroyed on any thread; the table is lock-free.
#ifndef LATCHKEY_WORKER_COMM_SHM_SHM_CLEANUP_H_
#define LATCHKEY_WORKER_COMM_SHM_SHM_CLEANUP_H_

#include <string>

namespace latchkey::comm::shm {

// Holds one name (a full path) until destroyed: then unlinks it (ENOENT is fine: a peer
// unlinked it first) unless Release()d.
class ScopedName {
 public:
  ScopedName() = default;
  ~ScopedName() { Reset(); }
  ScopedName(const ScopedName&) = delete;
  ScopedName& operator=(const ScopedName&) = delete;

  // Holds `path` (after unlinking the one held before, if any). A path longer than the table's
  // entries (511 bytes) or a full table (64 names) is still unlinked here, not by the handler.
  void Hold(const std::string& path);
  // Unlinks the name held now, if any.
  void Reset();
  // Gives the name up without unlinking it.
  void Release();
  bool held() const { return !path_.empty(); }

 private:
  std::string path_;
  int slot_ = -1;  // its entry in the signal handler's table, -1 when none
};

}  // namespace latchkey::comm::shm

#endif  // LATCHKEY_WORKER_COMM_SHM_SHM_CLEANUP_H_
