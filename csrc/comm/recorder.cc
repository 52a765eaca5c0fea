#include "comm/recorder.h"

#include <sstream>

namespace rr::comm {

std::string recordsToJson(const std::vector<Record>& rs) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < rs.size(); ++i) {
    const Record& r = rs[i];
    os << (i ? ",\n " : "") << "{\"seq\": " << r.seq << ", \"collective\": \""
       << toString(static_cast<CollectiveKind>(r.kind)) << "\", \"algo\": \""
       << toString(static_cast<Algorithm>(r.algo)) << "\", \"dtype\": \""
       << toString(static_cast<DataType>(r.dtype)) << "\", \"op\": \""
       << toString(static_cast<ReduceOp>(r.op)) << "\", \"root\": " << r.root
       << ", \"count\": " << r.count << ", \"bytes\": " << r.bytes
       << ", \"start_us\": " << r.startUs << ", \"end_us\": " << r.endUs << ", \"state\": \""
       << (r.endUs == 0 ? "running" : r.ok ? "ok" : "failed") << "\"}";
  }
  os << "]";
  return os.str();
}

}  // namespace rr::comm
