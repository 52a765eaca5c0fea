#include "transport/frame.h"

#include <algorithm>

#include "core/error.h"

namespace rr::transport {

namespace {
constexpr char kVia[] = " (relayed from rank ";
constexpr char kFound[] = ", which found it): ";

// If `text` starts "rank L (H) failed: " or "rank L (H) failed (relayed from rank A, rank B,
// which found it): ", append L (then A, B) to `via` and return where the quoted text
// begins; else npos.
size_t peelRelay(const std::string& text, std::vector<std::string>* via) {
  constexpr size_t npos = std::string::npos;
  if (text.compare(0, 5, "rank ") != 0) return npos;
  const size_t open = text.find(" (", 5);
  const size_t shut = open == npos ? npos : text.find(')', open);  // the host's bracket
  if (shut == npos || text.compare(shut, 8, ") failed") != 0) return npos;
  const std::string who = text.substr(5, open - 5);
  if (who.find(' ') != npos || text.substr(open, shut - open).find(": ") != npos) return npos;
  const size_t after = shut + 8;  // past ") failed"
  if (text.compare(after, 2, ": ") == 0) {
    via->push_back(who);
    return after + 2;
  }
  const size_t from = after + sizeof(kVia) - 1;
  const size_t end = text.find(kFound, after);
  if (text.compare(after, sizeof(kVia) - 1, kVia) != 0 || end == npos) return npos;
  via->push_back(who);
  for (size_t at = from; at <= end;) {
    const size_t comma = std::min(text.find(", rank ", at), end);
    via->push_back(text.substr(at, comma - at));
    at = comma + 7;  // past ", rank "
  }
  return end + sizeof(kFound) - 1;
}
}  // namespace

std::string saidBy(const std::string& rank, std::string text) {
  const std::string named = "rank " + rank;
  for (size_t at = 0; (at = text.find("this rank", at)) != std::string::npos;) {
    text.replace(at, 9, named);
    at += named.size();
  }
  return text;
}

std::string abortText(int label, const std::string& host, std::string reason) {
  std::vector<std::string> via;
  for (size_t at; (at = peelRelay(reason, &via)) != std::string::npos;) reason.erase(0, at);
  reason = saidBy(via.empty() ? std::to_string(label) : via.back(), std::move(reason));
  std::string out = detail::concat("rank ", label, " (", host, ") failed");
  if (!via.empty()) {
    out += kVia;
    for (size_t i = 0; i < via.size(); ++i) out += (i ? ", rank " : "") + via[i];
    out += kFound;
  } else {
    out += ": ";
  }
  return out + reason;
}

std::string describeMismatch(const FrameHeader& got, const FrameHeader& want, bool p2p,
                             int peer, int self, const std::vector<int>& labels) {
  using detail::concat;
  // Ranks by number: the message is relayed to every rank (a receiver of "peer ... this
  // rank" could not tell which rank was odd).
  const std::string them = concat("rank ", peer), me = concat("rank ", self);
  auto kindName = [p2p](uint8_t k) {
    auto kind = static_cast<CollectiveKind>(k);
    return p2p && kind == CollectiveKind::kBroadcast ? "point-to-point message" : toString(kind);
  };
  if (got.magic != want.magic) return concat("bad frame magic 0x", std::hex, got.magic);
  if (got.seq != want.seq || got.kind != want.kind) {
    // A broadcast whose ranks named different roots: each root only sends and returns, so
    // its frames are first read here, by the next collective (over TCP, no rank of such a
    // broadcast need read anything during it).
    // The same for a TCP scatter (each rank that thinks it is the root sends and keeps its
    // own block). A peer one call ahead in the same kind: often a call this rank made with
    // an empty buffer, which the peer skipped (zero-size calls are no-ops: found by a helper).
    const bool stale = !p2p && got.seq < want.seq &&
                       (got.kind == static_cast<uint8_t>(CollectiveKind::kBroadcast) ||
                        got.kind == static_cast<uint8_t>(CollectiveKind::kScatter));
    const bool skipped = got.seq == want.seq + 1 && got.kind == want.kind;
    const bool behind = got.seq + 1 == want.seq && got.kind == want.kind;
    const char* src = got.kind == static_cast<uint8_t>(CollectiveKind::kScatter) ? "scatter"
                                                                                 : "broadcast";
    return concat("collective mismatch: ", them, " is at ", kindName(got.kind), " #", got.seq,
                  ", ", me, " at ", kindName(want.kind), " #", want.seq,
                  stale ? concat(" (", me, " never read that ", src, "'s data: probably a "
                                 "root mismatch in ", src, " #", got.seq,
                                 "; every rank must pass the same src)")
                        : concat(" (every rank must issue the same collectives in the same "
                                 "order", skipped || behind ? "; a call with 0 elements is "
                                 "skipped, without a message: did " : "",
                                 skipped ? them : behind ? me : std::string(),
                                 skipped || behind ? " pass an empty buffer?" : "", ")"));
  }
  if (got.count != want.count)
    return concat("count mismatch in ", kindName(want.kind), " #", want.seq, ": ", them, " has ",
                  got.count, " elements, ", me, " ", want.count,
                  p2p ? " (a recv's buffer must have the sent message's size and dtype)" : "");
  if (got.dtype != want.dtype)
    return concat("dtype mismatch in ", kindName(want.kind), " #", want.seq, ": ", them, " has ",
                  toString(static_cast<DataType>(got.dtype)), ", ", me, " ",
                  toString(static_cast<DataType>(want.dtype)),
                  p2p ? " (a recv's buffer must have the sent message's size and dtype)" : "");
  if (got.op != want.op)
    return concat("op mismatch in ", kindName(want.kind), " #", want.seq, ": ", them, " uses ",
                  toString(static_cast<ReduceOp>(got.op)), ", ", me, " ",
                  toString(static_cast<ReduceOp>(want.op)));
  if (got.root != want.root)
    return concat("root mismatch in ", kindName(want.kind), " #", want.seq, ": ", them,
                  " has root rank ", rankLabel(labels, static_cast<int>(got.root)), ", ", me,
                  " has root rank ", rankLabel(labels, static_cast<int>(want.root)));
  if (got.algo != want.algo)
    return concat("algorithm mismatch in ", kindName(want.kind), " #", want.seq, ": ", them, " runs ",
                  toString(static_cast<Algorithm>(got.algo)), ", ", me, " ",
                  toString(static_cast<Algorithm>(want.algo)),
                  " (pass the same algo= on every rank)");
  if (got.payloadBytes != want.payloadBytes)
    return concat("frame size mismatch in ", kindName(want.kind), " #", want.seq, ": ", them, " sent ",
                  got.payloadBytes, " bytes, ", me, " expects ", want.payloadBytes);
  return "";
}

}  // namespace rr::transport
