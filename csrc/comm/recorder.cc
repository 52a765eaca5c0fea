#include "comm/recorder.h"

#include <sstream>

#include "comm/site.h"

namespace rr::comm {
namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 if it is not one
// (stray continuation byte, overlong form, surrogate, above U+10FFFF, truncated).
size_t utf8Length(const std::string& s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  if (n == 2 && c < 0xc2) return 0;                            // overlong
  if (n == 3 && c == 0xe0 && b(i + 1) < 0xa0) return 0;        // overlong
  if (n == 3 && c == 0xed && b(i + 1) >= 0xa0) return 0;       // UTF-16 surrogate
  if (n == 4 && c == 0xf0 && b(i + 1) < 0x90) return 0;        // overlong
  if (n == 4 && (c > 0xf4 || (c == 0xf4 && b(i + 1) >= 0x90))) return 0;  // > U+10FFFF
  return n;
}

}  // namespace

std::string jsonEscape(const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else if (c >= 0x80) {
      size_t n = utf8Length(s, i);
      if (n == 0) {
        out += "\\ufffd";  // not UTF-8: keep the file valid, mark the spot
        ++i;
        continue;
      }
      out.append(s, i, n);
      i += n;
      continue;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

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
    os << jsonEscape(siteName(r.site)) << "\"}";
  }
  os << "]";
  return os.str();
}

}  // namespace rr::comm
