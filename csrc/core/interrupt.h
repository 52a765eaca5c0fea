// Signals while a thread waits in the library. Python runs its signal handlers (Ctrl-C's
// KeyboardInterrupt, torchrun's SIGTERM -> SignalException) on the main thread at its next
// bytecode, which never comes while that thread waits in a collective or a Work's wait().
// The bindings install a check that runs them; the waits call it (checkInterrupt) and stop
// with Interrupted when a handler raised. The core itself knows nothing of Python.
#pragma once

#include <string>

#include "core/error.h"

namespace rr {

// Thrown out of a wait whose thread's signal handler raised. A collective that stops this
// way fails its communicator (its peers are told why), as any failure in mid-collective does.
class Interrupted : public Error {
 public:
  using Error::Error;
};

// Returns true when a signal handler raised (the hook keeps that exception for the bindings
// to re-raise) and sets *what to the exception's type name. Cheap when nothing is pending or
// the calling thread is not the one handlers run on.
using InterruptCheck = bool (*)(std::string* what);
void setInterruptCheck(InterruptCheck check);

// Run the check if one is installed and, unless `now`, if this thread last ran it at least
// 100 ms ago (a caller that saw EINTR passes now=true); throw Interrupted if it says so.
void checkInterrupt(bool now = false);

}  // namespace rr
