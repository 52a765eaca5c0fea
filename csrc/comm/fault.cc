#include "comm/fault.h"

#include "core/error.h"

namespace rr::comm {

FaultPlan::Point faultPointFromString(const std::string& s) {
  if (s == "begin") return FaultPlan::Point::kBegin;
  if (s == "mid") return FaultPlan::Point::kMid;
  if (s == "end") return FaultPlan::Point::kEnd;
  throw InvalidArgument("fault point must be begin, mid or end, got '" + s + "'");
}

static const char* const kActionNames[] = {"kill", "stop", "exit", "hang"};

FaultPlan::Action faultActionFromString(const std::string& s) {
  for (uint8_t a = 0; a < 4; ++a)
    if (s == kActionNames[a]) return static_cast<FaultPlan::Action>(a);
  throw InvalidArgument("fault action must be kill, stop, exit or hang, got '" + s + "'");
}

const char* faultActionName(FaultPlan::Action a) { return kActionNames[static_cast<int>(a)]; }

}  // namespace rr::comm
