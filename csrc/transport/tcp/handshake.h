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

// Acceptor side. On success returns the authenticated peer rank; on failure returns -1 and
// sets *reason (the caller logs it and keeps accepting). `isExpected(rank)` says whether
// that rank may still connect (not yet connected, higher than ours).
template <typename Pred>
int acceptHandshake(int fd, const Identity& me, Deadline d, Pred isExpected, std::string* reason);

// Connector side: authenticate to `target`. Throws PeerError / TimeoutError with the reason.
void connectHandshake(int fd, const Identity& me, int target, const std::string& targetAddr,
                      Deadline d);

// Non-template core of acceptHandshake (the predicate is applied by the template).
int acceptHandshakeImpl(int fd, const Identity& me, Deadline d, bool (*isExpected)(void*, int),
                        void* ctx, std::string* reason);

template <typename Pred>
int acceptHandshake(int fd, const Identity& me, Deadline d, Pred isExpected, std::string* reason) {
  auto thunk = [](void* ctx, int r) { return (*static_cast<Pred*>(ctx))(r); };
  return acceptHandshakeImpl(fd, me, d, thunk, &isExpected, reason);
}

}  // namespace rr::transport::tcp
