#include "comm/recorder.h"

#include <sstream>

#include "comm/site.h"

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
       << (r.endUs == 0 ? "running" : r.ok ? "ok" : "failed") << "\", \"site\": \"";
    for (char ch : siteName(r.site)) os << (ch == '"' || ch == '\\' || static_cast<unsigned char>(ch) < 0x20 ? '\'' : ch);
    os << "\"}";
  }
  os << "]";
  return os.str();
}

}  // namespace rr::comm
