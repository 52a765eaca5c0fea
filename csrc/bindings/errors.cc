#include "bindings/errors.h"

#include "core/error.h"

namespace py = pybind11;

namespace rr::bindings {

void registerErrors(py::module_& m) {
  // RingReduceError <- RuntimeError; CollectiveTimeout also <- builtins.TimeoutError.
  static py::exception<Error> base(m, "RingReduceError", PyExc_RuntimeError);
  static py::handle timeoutBases =
      py::make_tuple(base, py::handle(PyExc_TimeoutError)).release();
  static py::exception<TimeoutError> timeout(m, "CollectiveTimeout", timeoutBases.ptr());
  static py::exception<PeerError> peer(m, "PeerFailure", base.ptr());
  static py::exception<MismatchError> mismatch(m, "CollectiveMismatch", base.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const TimeoutError& e) {
      py::set_error(timeout, e.what());
    } catch (const PeerError& e) {
      py::object exc = peer;
      PyObject* inst = PyObject_CallFunction(exc.ptr(), "s", e.what());
      if (inst) {
        PyObject_SetAttrString(inst, "peer_rank", py::int_(e.peer()).ptr());
        PyObject_SetAttrString(inst, "cause", py::str(toString(e.cause())).ptr());
        PyErr_SetObject(exc.ptr(), inst);
        Py_DECREF(inst);
      }
    } catch (const MismatchError& e) {
      py::set_error(mismatch, e.what());
    } catch (const Error& e) {
      py::set_error(base, e.what());
    }
  });
}

}  // namespace rr::bindings
