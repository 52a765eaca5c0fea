// torch_adapter/native_api.h's table: synchronous collectives for the c10d adapter, run on
// the caller's thread (Executor::runSync) with no GIL and no Python object in the way.
#include "bindings/native_api.h"

#include <string>

#include "bindings/callsite.h"
#include "bindings/errors.h"
#include "collectives/collectives.h"
#include "core/error.h"
#include "reduce/reduce.h"
#include "torch_adapter/native_api.h"

namespace py = pybind11;

namespace rr::bindings {
namespace {

using ExecRef = std::weak_ptr<runtime::Executor>;

// Run `fn` on the handle's executor; a failure becomes the Python exception (-1).
template <typename F>
int guarded(void* handle, F&& fn) {
  try {
    std::shared_ptr<runtime::Executor> e = static_cast<ExecRef*>(handle)->lock();
    if (!e) RR_THROW(Error, comm::kDestroyedText);
    fn(*e);
    return 0;
  } catch (...) {
    std::exception_ptr p = std::current_exception();
    py::gil_scoped_acquire gil;
    setPythonError(p);
    return -1;
  }
}

int allreduce(void* h, void* ptr, size_t count, int dtype, int op, int algo, unsigned site) {
  return guarded(h, [&](runtime::Executor& e) {
    e.runSync([=](comm::Communicator& cm) {
      collectives::allreduce(cm, ptr, count, static_cast<DataType>(dtype),
                             static_cast<ReduceOp>(op), static_cast<Algorithm>(algo));
    }, "allreduce", site);
  });
}

int broadcast(void* h, void* ptr, size_t count, int dtype, int root, unsigned site) {
  return guarded(h, [&](runtime::Executor& e) {
    e.runSync([=](comm::Communicator& cm) {
      collectives::broadcast(cm, ptr, count, static_cast<DataType>(dtype), root);
    }, "broadcast", site);
  });
}

int barrier(void* h, unsigned site) {
  return guarded(h, [&](runtime::Executor& e) {
    e.runSync([](comm::Communicator& cm) { collectives::barrier(cm); }, "barrier", site);
  });
}

int reductionOk(int dtype, int op) {
  if (dtype < 0 || dtype >= kNumDataTypes || op < 0 || op >= kNumReduceOps) return 0;
  try {
    checkReduction(static_cast<DataType>(dtype), static_cast<ReduceOp>(op));
    return 1;
  } catch (const std::exception&) {
    return 0;
  }
}

unsigned callSite() { return currentCallSite(); }

const rr_native_api kApi = {RR_NATIVE_API_VERSION, allreduce, broadcast, barrier, reductionOk,
                            callSite};

}  // namespace

const rr_native_api& nativeTable() { return kApi; }

py::capsule nativeApi() {
  return py::capsule(const_cast<rr_native_api*>(&kApi), RR_NATIVE_API_CAPSULE);
}

py::capsule nativeHandle(const std::shared_ptr<runtime::Executor>& exec) {
  auto* ref = new ExecRef(exec);
  PyCapsule_Destructor free = [](PyObject* o) {
    delete static_cast<ExecRef*>(PyCapsule_GetPointer(o, RR_NATIVE_COMM_CAPSULE));
  };
  return py::capsule(ref, RR_NATIVE_COMM_CAPSULE, free);
}

}  // namespace rr::bindings
