// Python exception classes for the C++ hierarchy in core/error.h.
#pragma once

#include <pybind11/pybind11.h>

namespace rr::bindings {
void registerErrors(pybind11::module_& m);
}
