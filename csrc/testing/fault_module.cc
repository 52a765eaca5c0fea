// ringreduce._fault: what RINGREDUCE_FAULT's actions do (comm/fault.h), built as a module of
// its own so that the library (_C) never kills, stops or exits its process. ringreduce/_comm.py
// imports it only when RINGREDUCE_FAULT arms this rank -- the reliability tests and the
// fault-detection benchmark -- and hands its hook (the capsule FIRE) to Communicator.set_fault.
// It links nothing of the core: the one shared piece is FaultPlan's action codes.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "comm/fault.h"

namespace {

using rr::comm::FaultPlan;

// FaultPlan::Fire: the stamp first (the benchmark times the survivors' errors from it).
void fire(uint8_t action, const char* stampPath) {
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  if (stampPath != nullptr && *stampPath != '\0') {
    if (FILE* f = std::fopen(stampPath, "w")) {
      std::fprintf(f, "%.6f\n", now);
      std::fclose(f);
    }
  }
  switch (static_cast<FaultPlan::Action>(action)) {
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

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_fault",
                       "RINGREDUCE_FAULT's actions (tests only): FIRE is the hook for "
                       "Communicator.set_fault.",
                       -1, nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__fault() {
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  FaultPlan::Fire hook = &fire;
  PyObject* cap = PyCapsule_New(reinterpret_cast<void*>(hook), rr::comm::kFireCapsule, nullptr);
  if (cap == nullptr || PyModule_AddObject(m, "FIRE", cap) < 0) {
    Py_XDECREF(cap);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
