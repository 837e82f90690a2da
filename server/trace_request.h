// A trace request of JobService.GetTrace (coordinator_trace.cc; docs/observability.md "Traces"):
// the ranks asked, through their heartbeats, for their spans of some steps, and their answers
// (PutTrace). In memory only: a request lasts as long as the call that opened it.
#ifndef LATCHKEY_SERVER_TRACE_REQUEST_H_
#define LATCHKEY_SERVER_TRACE_REQUEST_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace latchkey {

// A job's open request (id 0: none).
struct TraceRequest {
  int64_t id = 0;
  int64_t first_step = 0;
  int64_t last_step = -1;              // -1: no bound
  std::set<int> asked;                 // the ranks live when it opened
  std::map<int, std::string> answers;  // rank -> its spans as JSON lines
  bool done() const { return answers.size() >= asked.size(); }
};

// What GetTrace returns: the answers, and the asked ranks that did not answer in time.
struct TraceAnswers {
  std::map<int, std::string> answers;
  std::vector<int> missing;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_TRACE_REQUEST_H_
