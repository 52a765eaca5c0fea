// Mutual challenge-response authentication of a new connection with the per-job secret.
//
//   acceptor (lower rank)                      connector (higher rank)
//   Hello{rank, world, nonceA}        ---->
//                                     <----    Auth{rank, world, target, nonceC,
//                                                   HMAC(secret, "C"|nonceA|nonceC|ids)}
//   Ack{status, HMAC(secret, "A"|nonceC|nonceA|ids)} ---->
//
// The secret never crosses the wire; replaying an old Auth fails because nonceA is fresh.
// Refusals carry a status code so the connector can say why instead of seeing a bare EOF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "core/types.h"

namespace rr::transport::tcp {

struct Identity {
  int rank = 0;
  int world = 0;
  std::string secret;
  std::vector<int> labels;  // a group's: the world rank of each rank, for messages
  int shown(int r) const { return rankLabel(labels, r); }
};

// Acceptor side, in two steps, so that many connections are served at once
// (accept_queue.h) and one that never answers holds up nobody: send this rank's hello at
// accept; once the caller has read the peer's kAuthBytes answer, check it and acknowledge.
// finishAccept returns the peer's rank, or -1 and *reason (refused: the caller logs it).
// `isExpected(ctx, rank)` says whether that rank may connect now.
struct AcceptState {
  uint8_t nonce[16] = {};
};
constexpr size_t kAuthBytes = 72;
bool sendHello(int fd, const Identity& me, AcceptState* st, std::string* reason);
int finishAccept(int fd, const Identity& me, const AcceptState& st, const uint8_t* auth,
                 bool (*isExpected)(void*, int), void* ctx, std::string* reason);

// Both steps for one connection, blocking until `d` (the wire fuzzer, tests/cpp, drives the
// acceptor side through it).
int acceptHandshakeImpl(int fd, const Identity& me, Deadline d, bool (*isExpected)(void*, int),
                        void* ctx, std::string* reason);
template <typename Pred>
int acceptHandshake(int fd, const Identity& me, Deadline d, Pred isExpected, std::string* reason) {
  auto thunk = [](void* ctx, int r) { return (*static_cast<Pred*>(ctx))(r); };
  return acceptHandshakeImpl(fd, me, d, thunk, &isExpected, reason);
}

// Connector side: authenticate to `target`. Throws PeerError / TimeoutError with the reason.
void connectHandshake(int fd, const Identity& me, int target, const std::string& targetAddr,
                      Deadline d);
// The same in two steps, for a caller that waits for the hello and then the ack in its own
// wait loop (a lazy connection's dialler: it watches everything else meanwhile, and the
// acceptor answers whenever it next waits): answerHello reads the hello and sends Auth;
// checkAck reads and checks the ack.
struct ConnectState {
  uint8_t helloNonce[16] = {};
  uint8_t authNonce[16] = {};
};
ConnectState answerHello(int fd, const Identity& me, int target, const std::string& targetAddr,
                         Deadline d);
void checkAck(int fd, const Identity& me, int target, const std::string& targetAddr,
              const ConnectState& st, Deadline d);

}  // namespace rr::transport::tcp
