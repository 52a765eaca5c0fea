// rr.barrier() / rr.allreduce(ndarray) without a Python frame (see fastcall.cc).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace rr::bindings {

// DataType code of a native-endian numpy dtype we support, or -1.
int numpyDtypeCode(const pybind11::dtype& dt);
// Adds _C.FastCall.
void registerFastCall(pybind11::module_& m);

}  // namespace rr::bindings
