// bench_rendezvous's child processes (bench/coordinator/rendezvous.cc starts them with --role):
//  - the store's host: hosts the TCP store as rank 0 does (ConnectTcpStore, is_host), until
//    SIGTERM, so its CPU is its own;
//  - store clients: `count` simulated ranks (one thread each) from `first` connect, set their
//    address under their group's prefix and read every member's (`read` "each": Wait for all,
//    then one Get per member, what gloo's own full mesh did and the shm backend does;
//    "gathered": the group's first rank reads them all and publishes them as one value the
//    others Get; "mesh": the gloo backend's exchange itself, ExchangeMeshAddresses, each
//    rank's endpoints for its peers checked);
//  - unique-id ranks: `count` ranks join a job at the coordinator (WorkerSession::Join, the
//    worker's RPC), connect to the store it names and run ExchangeNcclUniqueId on the world
//    group, as ConnectNcclGroups does.
// Each writes its results to `out` (per-rank timeline lines, histogram lines, "id" lines, one
// "err" line naming the first failure) and exits 0 once written.
#ifndef LATCHKEY_BENCH_COORDINATOR_RENDEZVOUS_ROLES_H_
#define LATCHKEY_BENCH_COORDINATOR_RENDEZVOUS_ROLES_H_

#include <string>

#include "bench/coordinator/rendezvous_common.h"

namespace latchkey::bench {

struct StoreClientArgs {
  int port = 0;
  int world = 0;
  int first = 0;
  int count = 0;
  int group = 0;              // group size: world (one DP group) or e.g. 8 (TP groups)
  std::string read = "each";  // "each", "gathered" or "mesh"
  std::string out;
  int timeout_s = 60;
};

struct UniqueIdArgs {
  std::string coordinator;
  std::string job_id;
  std::string join_token;
  int first = 0;
  int count = 0;
  std::string out;
  int timeout_s = 60;
};

int RunStoreHost(int port, int world, int timeout_s);
int RunStoreClients(const StoreClientArgs& args);
int RunUniqueIdRanks(const UniqueIdArgs& args);

}  // namespace latchkey::bench

#endif  // LATCHKEY_BENCH_COORDINATOR_RENDEZVOUS_ROLES_H_
