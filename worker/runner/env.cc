#include "worker/runner/env.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace latchkey {
namespace {

std::string Str(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

absl::Status Int(const char* name, std::optional<int>* out) {
  const std::string v = Str(name);
  if (v.empty()) return absl::OkStatus();
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (*end != 0 || x < 0 || x > (1 << 30)) {
    return absl::InvalidArgumentError(std::string(name) + ": '" + v +
                                      "' is not a non-negative integer");
  }
  *out = static_cast<int>(x);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerEnv> ReadWorkerEnv() {
  WorkerEnv env;
  std::optional<int> port;
  for (auto [name, out] :
       {std::pair{"RANK", &env.rank}, std::pair{"WORLD_SIZE", &env.world_size},
        std::pair{"MASTER_PORT", &port}, std::pair{"LOCAL_WORLD_SIZE", &env.local_world_size},
        std::pair{"LOCAL_RANK", &env.local_rank}}) {
    if (absl::Status st = Int(name, out); !st.ok()) return st;
  }
  // An Indexed Job's pod (Kubernetes): its completion index is its rank unless RANK is set.
  if (!env.rank) {
    if (absl::Status st = Int("JOB_COMPLETION_INDEX", &env.rank); !st.ok()) return st;
  }
  if (port) env.master_port = *port;
  env.master_addr = Str("MASTER_ADDR");
  if (env.master_addr.empty()) env.master_addr = "127.0.0.1";
  env.transport_host = Str("LATCHKEY_GLOO_HOSTNAME");
  env.node_name = Str("LATCHKEY_NODE_NAME");
  env.node_relay = Str("LATCHKEY_NODE_RELAY");
  env.coordinator = Str("LATCHKEY_COORDINATOR");
  env.job_id = Str("LATCHKEY_JOB_ID");
  env.join_token = Str("LATCHKEY_JOIN_TOKEN");
  env.tls_ca = Str("LATCHKEY_TLS_CA");
  env.tls_cert = Str("LATCHKEY_TLS_CERT");
  env.tls_key = Str("LATCHKEY_TLS_KEY");
  env.test_min_window_seconds = std::atof(Str("LATCHKEY_TEST_MIN_WINDOW_SECONDS").c_str());
  env.test_skip_device_check = Str("LATCHKEY_TEST_SKIP_DEVICE_CHECK") == "1";
  return env;
}

absl::StatusOr<std::string> ReadJoinTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError("--join-token-file: cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  const size_t b = token.find_first_not_of(" \t\r\n");
  const size_t e = token.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) {
    return absl::InvalidArgumentError("--join-token-file: '" + path + "' is empty");
  }
  return token.substr(b, e - b + 1);
}

}  // namespace latchkey
