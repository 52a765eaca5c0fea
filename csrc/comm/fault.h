// Fault injection for the reliability suite (RINGREDUCE_FAULT, parsed in ringreduce/_env/tunables.py):
// this rank kills, stops, exits or hangs itself at a chosen point of a chosen collective, so
// tests can time how fast every other rank names it. A communicator holds a plan only when a
// test armed one (Communicator::setFault); then one check per collective phase. The code that
// carries the action out is not in this library: it is the hook the plan holds, which only
// the separate test module ringreduce._fault provides (csrc/testing/fault_module.cc) -- the
// library itself never kills, stops or exits its process.
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
  // The codes the hook receives (csrc/testing/fault_module.cc reads them in this order).
  enum class Action : uint8_t { kKill, kStop, kExit, kHang };
  // Writes the wall-clock time to `stampPath` (unless empty), then carries out `action`:
  // does not return for kill/exit/hang; returns after SIGCONT for stop.
  using Fire = void (*)(uint8_t action, const char* stampPath);

  uint8_t kind = 0;   // CollectiveKind to hit; 0 = any
  uint64_t seq = 1;   // fire at the first matching collective with sequence number >= seq
  Point point = Point::kMid;
  Action action = Action::kKill;
  std::string stampPath;  // where to write the wall-clock time of the fault ("" = nowhere)
  Fire fire = nullptr;    // the test module's hook (the binding's set_fault requires it)

  bool matches(uint8_t curKind, uint64_t curSeq, Point p) const {
    return p == point && curSeq >= seq && (kind == 0 || kind == curKind);
  }
};

// The name of the capsule ringreduce._fault exports its Fire hook in (FIRE), which the
// binding's set_fault checks.
inline constexpr const char* kFireCapsule = "ringreduce._fault.FIRE";

FaultPlan::Point faultPointFromString(const std::string& s);
FaultPlan::Action faultActionFromString(const std::string& s);
const char* faultActionName(FaultPlan::Action a);

}  // namespace rr::comm
