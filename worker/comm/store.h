// The rendezvous key/value store through which the ranks of a job find each other, modelled on
// gloo's rendezvous::Store and c10d's Store. Every backend forms its groups through one.
//
// Implementations:
//  - the TCP store (ConnectTcpStore): hosted by rank 0 at host:port, the others connect; used
//    across processes and machines;
//  - InMemoryStore: one process, ranks as threads (tests), like gloo's HashStore.
//
// Contract: Set overwrites; Get and Wait block until every key exists or the timeout passes
// (DEADLINE_EXCEEDED naming the missing keys); a store that cannot be reached is UNAVAILABLE.
// Thread-safety: every method is thread-safe.
#ifndef LATCHKEY_WORKER_COMM_STORE_H_
#define LATCHKEY_WORKER_COMM_STORE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latchkey::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  virtual absl::StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                                   std::chrono::milliseconds timeout) = 0;
  virtual absl::Status Wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) = 0;
};

// One process: ranks as threads share one instance.
class InMemoryStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::vector<uint8_t>& value) override;
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                           std::chrono::milliseconds timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;  // guarded by mu_
};

// Keys are namespaced as "prefix/key" over another store (a job id, a group name).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {}
  absl::Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    return base_->Set(prefix_ + "/" + key, value);
  }
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                           std::chrono::milliseconds timeout) override {
    return base_->Get(prefix_ + "/" + key, timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override;

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// The TCP store: `is_host` (rank 0) listens on host:port (port 0 is not allowed: every rank
// must know it); the others connect, retrying until `timeout`. The host keeps serving until
// the returned store is destroyed, so keep it alive while any rank may still connect.
absl::StatusOr<std::shared_ptr<Store>> ConnectTcpStore(const std::string& host, int port,
                                                       bool is_host, int world_size,
                                                       std::chrono::milliseconds timeout);

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_STORE_H_
