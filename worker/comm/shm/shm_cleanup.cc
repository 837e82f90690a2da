#include "worker/comm/shm/shm_cleanup.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace latchkey::comm::shm {
namespace {

constexpr int kSlots = 64;
constexpr size_t kPathBytes = 512;
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// An entry's state: free, being filled, held (the handler may unlink it), or claimed by a
// handler that is unlinking it (the process is ending; the entry is never reused).
enum SlotState : int { kFree = 0, kFilling = 1, kHeld = 2, kClaimed = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kPathBytes];
};
static_assert(std::atomic<int>::is_always_lock_free, "the handler reads the table");

Slot g_slots[kSlots];
struct sigaction g_previous[NSIG];
std::once_flag g_installed;

// Only async-signal-safe calls: unlink, sigaction, raise.
void OnStopSignal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  for (Slot& s : g_slots) {
    int expected = kHeld;
    if (s.state.compare_exchange_strong(expected, kClaimed)) unlink(s.path);
  }
  errno = saved_errno;
  const struct sigaction& previous = g_previous[sig];
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    if (previous.sa_sigaction != nullptr) previous.sa_sigaction(sig, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
    return;
  }
  // The default action, as if this handler had never been installed: the signal is blocked
  // while the handler runs, so it is delivered, and ends the process, when the handler returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

void InstallHandlers() {
  for (int sig : kStopSignals) {
    struct sigaction current {};
    if (sigaction(sig, nullptr, &current) != 0 || current.sa_handler == SIG_IGN) continue;
    g_previous[sig] = current;
    struct sigaction mine {};
    mine.sa_sigaction = OnStopSignal;
    mine.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&mine.sa_mask);
    // The other stop signals wait while one is handled: one handler at a time walks the table.
    for (int other : kStopSignals) sigaddset(&mine.sa_mask, other);
    sigaction(sig, &mine, nullptr);
  }
}

int Acquire(const std::string& path) {
  if (path.size() >= kPathBytes) return -1;
  std::call_once(g_installed, InstallHandlers);
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(kHeld, std::memory_order_release);
    return i;
  }
  return -1;
}

// Frees the entry unless a handler claimed it.
void Drop(int slot) {
  if (slot < 0) return;
  int expected = kHeld;
  g_slots[slot].state.compare_exchange_strong(expected, kFree);
}

}  // namespace

void ScopedName::Hold(const std::string& path) {
  Reset();
  path_ = path;
  slot_ = Acquire(path);
}

void ScopedName::Reset() {
  if (path_.empty()) return;
  unlink(path_.c_str());  // ENOENT: a peer unlinked it first
  Release();
}

void ScopedName::Release() {
  Drop(slot_);
  slot_ = -1;
  path_.clear();
}

}  // namespace latchkey::comm::shm
