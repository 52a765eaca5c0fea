// Python exception classes for the C++ hierarchy in core/error.h.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>

namespace rr::bindings {
void registerErrors(pybind11::module_& m);
// Set the Python exception for a C++ failure as the registered translator would (GIL held;
// used where an exception cannot travel through pybind11, e.g. the native C entry points).
void setPythonError(std::exception_ptr p);
}
