#include "worker/comm/store.h"

#include "absl/strings/str_join.h"

namespace latchkey::comm {

absl::Status InMemoryStore::Set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> InMemoryStore::Get(const std::string& key,
                                                        std::chrono::milliseconds timeout) {
  if (absl::Status st = Wait({key}, timeout); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  return data_.at(key);
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_there = [&] {
    for (const std::string& k : keys) {
      if (data_.count(k) == 0) return false;
    }
    return true;
  };
  if (!cv_.wait_for(lock, timeout, all_there)) {
    std::vector<std::string> missing;
    for (const std::string& k : keys) {
      if (data_.count(k) == 0) missing.push_back(k);
    }
    return absl::DeadlineExceededError("store keys not set within " +
                                       std::to_string(timeout.count()) +
                                       " ms: " + absl::StrJoin(missing, ", "));
  }
  return absl::OkStatus();
}

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(prefix_ + "/" + k);
  return base_->Wait(full, timeout);
}

}  // namespace latchkey::comm
