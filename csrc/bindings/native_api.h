// The C entry points of torch_adapter/native_api.h, and the handles they take.
#pragma once

#include <memory>

#include <pybind11/pybind11.h>

#include "runtime/executor.h"
#include "torch_adapter/native_api.h"

namespace rr::bindings {

// The table itself (also used by fastcall.cc).
const rr_native_api& nativeTable();
// _C.NATIVE_API: the capsule holding the table.
pybind11::capsule nativeApi();
// Communicator.native_handle(): a capsule with a weak reference to `exec`.
pybind11::capsule nativeHandle(const std::shared_ptr<runtime::Executor>& exec);

}  // namespace rr::bindings
