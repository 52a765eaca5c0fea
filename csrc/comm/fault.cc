#include "comm/fault.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace rr::comm {

FaultPlan::Point faultPointFromString(const std::string& s) {
  if (s == "begin") return FaultPlan::Point::kBegin;
  if (s == "mid") return FaultPlan::Point::kMid;
  if (s == "end") return FaultPlan::Point::kEnd;
  throw InvalidArgument("fault point must be begin, mid or end, got '" + s + "'");
}

FaultPlan::Action faultActionFromString(const std::string& s) {
  if (s == "kill") return FaultPlan::Action::kKill;
  if (s == "stop") return FaultPlan::Action::kStop;
  if (s == "exit") return FaultPlan::Action::kExit;
  if (s == "hang") return FaultPlan::Action::kHang;
  throw InvalidArgument("fault action must be kill, stop, exit or hang, got '" + s + "'");
}

void fireFault(const FaultPlan& plan, int rank, const char* what) {
  double now = std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
  if (!plan.stampPath.empty()) {
    if (FILE* f = std::fopen(plan.stampPath.c_str(), "w")) {
      std::fprintf(f, "%.6f\n", now);
      std::fclose(f);
    }
  }
  static const char* const kNames[] = {"kill", "stop", "exit", "hang"};
  RR_WARN("RINGREDUCE_FAULT: rank ", rank, " injects '", kNames[static_cast<int>(plan.action)],
          "' in ", what);
  switch (plan.action) {
    case FaultPlan::Action::kKill:
      ::kill(::getpid(), SIGKILL);
      break;
    case FaultPlan::Action::kStop:
      ::kill(::getpid(), SIGSTOP);
      return;  // continued by SIGCONT: carry on as if nothing happened
    case FaultPlan::Action::kExit:
      ::_exit(17);  // no goodbye, no destructors: like a crash that closes the sockets
    case FaultPlan::Action::kHang:
      break;
  }
  // kHang (and kill's last instants): stuck in this collective with heartbeats still going.
  while (true) std::this_thread::sleep_for(std::chrono::seconds(3600));
}

}  // namespace rr::comm
