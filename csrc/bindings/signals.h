// Python signal handlers during the core's waits (core/interrupt.h): installed with the
// exception classes (errors.cc).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "core/interrupt.h"

namespace rr::bindings {
// Install core/interrupt.h's check: on Python's main thread, a wait runs the pending signal
// handlers while all are Python's defaults. GIL held (module init).
void installSignalCheck();
// Re-raise, as the current Python error, the exception a signal handler raised on this
// thread that made the core throw `e` (with a note naming `e`); false if there is none.
// GIL held.
bool reraiseSignalError(const Interrupted& e);
// Add `note` to exception instance `exc` (PEP 678 add_note); best effort. GIL held.
void addNote(PyObject* exc, const std::string& note);
}  // namespace rr::bindings
