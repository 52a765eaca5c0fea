// The fixed-layout frame header that precedes every message between ranks. It names the
// collective the bytes belong to, so ranks that disagree about what they are doing detect
// it in-band instead of reducing each other's garbage. Nothing else is ever parsed from the
// network: payloads are raw elements of the size the receiver expects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/types.h"

namespace rr::transport {

constexpr uint32_t kFrameMagic = 0x31465252;  // "RRF1"
constexpr size_t kMaxAbortReason = 1024;      // bound on an abort frame's payload

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t kind = 0;   // CollectiveKind
  uint8_t dtype = 0;  // DataType of the user's buffer
  uint8_t op = 0;     // ReduceOp (for kAbort: an ErrorCode)
  uint8_t algo = 0;   // Algorithm (informational)
  uint64_t seq = 0;   // per-communicator collective sequence number
  int32_t root = 0;   // broadcast root, otherwise 0
  uint32_t step = 0;  // algorithm step (informational, for diagnostics)
  uint64_t count = 0;         // element count of the collective (per rank)
  uint64_t payloadBytes = 0;  // bytes following this header
  uint32_t flags = 0;         // kFlagCrc: `crc` is the CRC32C of the payload
  uint32_t crc = 0;
};
static_assert(sizeof(FrameHeader) == 48, "FrameHeader must stay 48 bytes");
constexpr uint32_t kFlagCrc = 1;

// Carried in FrameHeader::op of an abort frame so the peer raises the same error class.
enum class AbortCode : uint8_t { kOther = 0, kMismatch = 1, kTimeout = 2, kPeer = 3 };

// The peer a failing rank lost (kPeer: it died, went silent or its network failed), carried
// by its abort (frame: root = encodeCulprit, step = cause; shared memory: its control block),
// so that ranks hearing of it name that rank (PeerFailure.peer_rank), not the relaying one.
// It may be outside the communicator (`outside`: rank is a world rank): a point-to-point
// channel's or a group's rank that leaves after losing some other rank of the job names it.
struct Culprit {
  int rank = -1;  // communicator rank (world rank when outside); -1: none
  PeerCause cause = PeerCause::kClosed;
  bool outside = false;
};

// Culprit.rank on the wire: 0 none, r + 1 communicator rank r, kOutsideBit | (w + 1) world
// rank w outside the communicator (both ends of a connection share the communicator).
constexpr uint32_t kOutsideBit = 0x40000000u;
constexpr uint32_t kCulpritRankMask = kOutsideBit - 1;
inline uint32_t encodeCulprit(const Culprit& c) {
  if (c.rank < 0 || static_cast<uint32_t>(c.rank) >= kCulpritRankMask) return 0;
  return (static_cast<uint32_t>(c.rank) + 1u) | (c.outside ? kOutsideBit : 0u);
}
// Decode a word written by encodeCulprit with the cause beside it (none: cause unknown, the
// top bit set or no rank -- words encodeCulprit never writes). The rank is not checked
// against the communicator here: Communicator::knownCulprit does that.
inline Culprit decodeCulprit(uint32_t v, uint32_t cause) {
  if ((v & ~(kOutsideBit | kCulpritRankMask)) != 0 || (v & kCulpritRankMask) == 0 ||
      cause > static_cast<uint32_t>(PeerCause::kHandshake))
    return {};
  return {static_cast<int>((v & kCulpritRankMask) - 1), static_cast<PeerCause>(cause),
          (v & kOutsideBit) != 0};
}

// The text of peer `label`'s (at `host`) abort whose payload is `reason`: "rank L (H) failed:
// <reason>". A reason that is itself a relayed abort ("rank M (H2) failed: rank N ... closed
// the connection while this rank ...") is quoted as its first finder's words, once, with
// their "this rank" named and the ranks it came through listed: chains grew a hop per relay
// (9 at 32 ranks) and the kMaxAbortReason bound cut the finder's words off.
std::string abortText(int label, const std::string& host, std::string reason);

// `text` as rank `rank` said it, to be quoted on another rank: its "this rank" named.
std::string saidBy(const std::string& rank, std::string text);

// Compare an incoming header against the one this rank expects. Returns "" when they
// agree, else a message naming the first differing field with both values.
// p2p: the frames are a point-to-point channel's messages (ringreduce/p2p.py sends each as a
// broadcast from the sender), named as such rather than as broadcasts. peer, self: the
// ranks messages name the two by; labels: the same for roots (a group's world ranks; empty:
// the world, whose roots are shown as they are).
std::string describeMismatch(const FrameHeader& got, const FrameHeader& want, bool p2p,
                             int peer, int self, const std::vector<int>& labels);

}  // namespace rr::transport
