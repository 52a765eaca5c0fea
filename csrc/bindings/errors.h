// Python exception classes for the C++ hierarchy in core/error.h.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <vector>

namespace rr::bindings {
void registerErrors(pybind11::module_& m);
// Set the Python exception for a C++ failure as the registered translator would (GIL held;
// used where an exception cannot travel through pybind11, e.g. the native C entry points).
void setPythonError(std::exception_ptr p);
// A Python error's message (str(), else its class's name) and the rank it names
// (.peer_rank, a world rank) as a rank of the communicator of `size` ranks labelled
// `labels` (empty: the world), or as a world rank (*outside) when not one of them; -1 when
// it names none. Never throw (a failure of theirs gives "" and -1). GIL held.
std::string messageOf(const pybind11::error_already_set& e);
int culpritOf(const pybind11::error_already_set& e, const std::vector<int>& labels, int size,
              bool* outside);
}
