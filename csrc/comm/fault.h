// Fault injection for the reliability suite (RINGREDUCE_FAULT, parsed in ringreduce/_env/tunables.py):
// this rank kills, stops, exits or hangs itself at a chosen point of a chosen collective, so
// tests can time how fast every other rank names it. A communicator holds one only when a
// test armed it (Communicator::setFault); then one check per collective phase.
//
//   point kBegin: the collective's sequence number is taken and its heartbeat state
//                 published, no byte sent yet
//   point kMid:   the first time the rank waits for a peer inside the collective (it has
//                 sent what it could; peers hold partial data); if it never waits, at kEnd
//   point kEnd:   the collective completed on this rank, before control returns to Python
#pragma once

#include <cstdint>
#include <string>

namespace rr::comm {

struct FaultPlan {
  enum class Point : uint8_t { kBegin, kMid, kEnd };
  enum class Action : uint8_t { kKill, kStop, kExit, kHang };
  uint8_t kind = 0;   // CollectiveKind to hit; 0 = any
  uint64_t seq = 1;   // fire at the first matching collective with sequence number >= seq
  Point point = Point::kMid;
  Action action = Action::kKill;
  std::string stampPath;  // where to write the wall-clock time of the fault ("" = nowhere)

  bool matches(uint8_t curKind, uint64_t curSeq, Point p) const {
    return p == point && curSeq >= seq && (kind == 0 || kind == curKind);
  }
};

// Carry out the plan's action now (does not return for kill/exit/hang; resumes after
// SIGCONT for stop). Writes the stamp file first.
void fireFault(const FaultPlan& plan, int rank, const char* what);

FaultPlan::Point faultPointFromString(const std::string& s);
FaultPlan::Action faultActionFromString(const std::string& s);

}  // namespace rr::comm
