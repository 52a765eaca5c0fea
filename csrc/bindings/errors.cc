#include "bindings/errors.h"

#include <string>

#include "bindings/signals.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/types.h"

namespace py = pybind11;

namespace rr::bindings {

namespace {

struct Classes {
  PyObject* base = nullptr;
  PyObject* timeout = nullptr;
  PyObject* peer = nullptr;
  PyObject* mismatch = nullptr;
};

Classes& classes() {
  static Classes c;
  return c;
}

// A signal that arrived while the call waited, whose handler has not run yet, goes first:
// Ctrl-C under ringreduce-run reaches every rank at once, and a rank whose main thread did
// not take the signal often sees a peer's goodbye ("rank 2 left the job") before its own
// 100 ms check -- then the pending KeyboardInterrupt struck while Python printed that
// PeerFailure, leaving "lost sys.stderr" instead of a traceback (found by a helper).
// True when a handler raised: its exception is set, with `what` noted on it.
bool signalFirst(const char* what) {
  if (PyErr_CheckSignals() == 0) return false;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != nullptr)
    addNote(value, std::string("ringreduce: this rank's call had also failed: ") + what);
  PyErr_Restore(type, value, tb);
  return true;
}

// Our exception types -> their Python classes. `anything`: also map foreign C++ exceptions
// (to RuntimeError) instead of leaving them to pybind11's next translator.
void translate(std::exception_ptr p, bool anything) {
  const Classes& c = classes();
  try {
    if (p) std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const TimeoutError& e) {
    if (signalFirst(e.what())) return;
    PyObject* inst = PyObject_CallFunction(c.timeout, "s", e.what());
    if (inst) {
      auto rankOrNone = [](int r) { return r >= 0 ? py::object(py::int_(r)) : py::none(); };
      PyObject_SetAttrString(inst, "waiting_for", rankOrNone(e.waitingFor()).ptr());
      PyObject_SetAttrString(inst, "peer_rank", rankOrNone(e.stuck()).ptr());
      PyObject_SetAttrString(inst, "relayed_by", rankOrNone(e.via()).ptr());
      PyErr_SetObject(c.timeout, inst);
      Py_DECREF(inst);
    }
  } catch (const PeerError& e) {
    if (signalFirst(e.what())) return;
    PyObject* inst = PyObject_CallFunction(c.peer, "s", e.what());
    if (inst) {
      PyObject_SetAttrString(inst, "peer_rank", py::int_(e.peer()).ptr());
      PyObject_SetAttrString(inst, "cause", py::str(toString(e.cause())).ptr());
      PyObject_SetAttrString(inst, "relayed_by",
                             e.via() >= 0 ? py::int_(e.via()).ptr() : Py_None);
      PyErr_SetObject(c.peer, inst);
      Py_DECREF(inst);
    }
  } catch (const MismatchError& e) {
    if (signalFirst(e.what())) return;
    PyObject* inst = PyObject_CallFunction(c.mismatch, "s", e.what());
    if (inst) {  // the rank whose call differs from this one's; the rank that said so
      PyObject_SetAttrString(inst, "peer_rank", e.peer() >= 0 ? py::int_(e.peer()).ptr() : Py_None);
      PyObject_SetAttrString(inst, "relayed_by", e.via() >= 0 ? py::int_(e.via()).ptr() : Py_None);
      PyErr_SetObject(c.mismatch, inst);
      Py_DECREF(inst);
    }
  } catch (const Interrupted& e) {
    if (!reraiseSignalError(e)) PyErr_SetString(c.base, e.what());
  } catch (const Error& e) {
    if (!signalFirst(e.what())) PyErr_SetString(c.base, e.what());
  } catch (const std::exception& e) {
    if (!anything) throw;
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    if (!anything) throw;
    PyErr_SetString(PyExc_RuntimeError, "ringreduce: unknown C++ exception");
  }
}

}  // namespace

void setPythonError(std::exception_ptr p) { translate(p, true); }

std::string messageOf(const py::error_already_set& e) {
  try {
    std::string text = py::str(e.value()).cast<std::string>();
    // KeyboardInterrupt and SystemExit say nothing themselves
    return text.empty() ? py::str(e.type().attr("__name__")).cast<std::string>() : text;
  } catch (...) {
    return "";
  }
}

int culpritOf(const py::error_already_set& e, const std::vector<int>& labels, int size,
              bool* outside) {
  *outside = false;
  try {
    py::object named = py::getattr(e.value(), "peer_rank", py::none());
    if (!py::isinstance<py::int_>(named)) return -1;
    const int world = named.cast<int>();
    if (world < 0) return -1;
    const int r = rankOf(labels, size, world);
    *outside = r < 0;  // a rank of the job outside this communicator
    return r < 0 ? world : r;
  } catch (...) {
    return -1;
  }
}

void registerErrors(py::module_& m) {
  // RingReduceError <- RuntimeError; CollectiveTimeout also <- builtins.TimeoutError.
  static py::exception<Error> base(m, "RingReduceError", PyExc_RuntimeError);
  static py::handle timeoutBases =
      py::make_tuple(base, py::handle(PyExc_TimeoutError)).release();
  static py::exception<TimeoutError> timeout(m, "CollectiveTimeout", timeoutBases.ptr());
  static py::exception<PeerError> peer(m, "PeerFailure", base.ptr());
  // Class defaults, for instances made in Python (ringreduce._rendezvous) too.
  for (const char* a : {"peer_rank", "cause", "relayed_by"}) py::setattr(peer, a, py::none());
  // The causes (PeerFailure.cause) of a peer that will say no goodbye (core/error.h isGone).
  py::list gone;
  for (PeerCause c = PeerCause::kClosed; c <= PeerCause::kHandshake;
       c = static_cast<PeerCause>(static_cast<int>(c) + 1))
    if (isGone(c)) gone.append(toString(c));
  py::setattr(peer, "GONE_CAUSES", py::tuple(gone));
  for (const char* a : {"peer_rank", "waiting_for", "relayed_by"})
    py::setattr(timeout, a, py::none());
  static py::exception<MismatchError> mismatch(m, "CollectiveMismatch", base.ptr());
  for (const char* a : {"peer_rank", "relayed_by"}) py::setattr(mismatch, a, py::none());
  classes() = Classes{base.ptr(), timeout.ptr(), peer.ptr(), mismatch.ptr()};
  py::register_exception_translator([](std::exception_ptr p) { translate(p, false); });
  installSignalCheck();  // waits in the core run Python's signal handlers (Ctrl-C)
}

}  // namespace rr::bindings
