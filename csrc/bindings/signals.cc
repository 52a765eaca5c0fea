// core/interrupt.h's check, in Python terms: while a wait of the core runs on Python's main
// thread, run the pending signal handlers there (Ctrl-C's KeyboardInterrupt) and carry the
// exception a handler raised out of the C++ call (errors.cc re-raises it).
#include "bindings/signals.h"

#include <pthread.h>
#include <pythread.h>
#include <signal.h>

#include <string>
#include <vector>

#include "core/interrupt.h"

namespace py = pybind11;

namespace rr::bindings {

namespace {

// core/interrupt.h's check: Python runs signal handlers only on its main thread.
unsigned long gMainThread = 0;

// The exception a signal handler raised on this thread, until translate() re-raises it.
struct Raised {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* tb = nullptr;
};
thread_local Raised tRaised;

bool isFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// torch's DataLoader SIGCHLD handler (torch.utils.data._utils.signal_handling), installed
// once a DataLoader starts workers, with no handler of the program's before it (its closure's
// previous_handler is None): it calls torch's C check of its workers, which raises if one
// died -- no collective, nothing that re-enters the library. Before, any num_workers > 0
// DataLoader kept Ctrl-C from stopping a collective. Attribute reads of a function and its
// code object run no bytecode.
bool isDataLoaderHandler(PyObject* h) {
  if (!PyFunction_Check(h)) return false;
  bool ok = false;
  PyObject* mod = PyFunction_GetModule(h);  // borrowed
  PyObject* qual = PyObject_GetAttrString(h, "__qualname__");
  PyObject* vars = PyObject_GetAttrString(PyFunction_GetCode(h), "co_freevars");
  PyObject* cells = PyFunction_GetClosure(h);  // borrowed
  if (mod != nullptr && qual != nullptr && vars != nullptr && cells != nullptr &&
      PyUnicode_Check(mod) && PyUnicode_Check(qual) && PyTuple_Check(vars) &&
      PyTuple_Check(cells) && PyTuple_GET_SIZE(vars) == PyTuple_GET_SIZE(cells) &&
      PyUnicode_CompareWithASCIIString(mod, "torch.utils.data._utils.signal_handling") == 0 &&
      PyUnicode_CompareWithASCIIString(qual, "_set_SIGCHLD_handler.<locals>.handler") == 0) {
    ok = true;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(vars); ++i) {
      PyObject* name = PyTuple_GET_ITEM(vars, i);
      if (PyUnicode_Check(name) &&
          PyUnicode_CompareWithASCIIString(name, "previous_handler") == 0 &&
          PyCell_GET(PyTuple_GET_ITEM(cells, i)) != Py_None)
        ok = false;  // the program's own handler runs after torch's
    }
  }
  Py_XDECREF(qual);
  Py_XDECREF(vars);
  PyErr_Clear();
  return ok;
}

// Run the handlers only while every signal's Python handler is one that can do nothing but
// raise or exit (SIG_DFL, SIG_IGN, Python's own Ctrl-C handler, torch's DataLoader SIGCHLD
// check above): a handler of the program's own -- Lightning's SIGTERM / SLURM requeue
// handlers save checkpoints, which run collectives -- could re-enter the library in
// mid-collective; with one installed, handlers run after the call returns, as before. Only C
// functions of _signal are called here: any Python bytecode would itself run (and here
// swallow) the pending handlers.
bool onlyDefaultHandlers() {
  static PyObject* getsignal = nullptr;  // never released: no destructor after finalization
  static PyObject* ctrlC = nullptr;
  static std::vector<int> signals;
  if (getsignal == nullptr) {
    PyObject* mod = PyImport_ImportModule("_signal");
    PyObject* valid = mod ? PyObject_CallMethod(mod, "valid_signals", nullptr) : nullptr;
    PyObject* it = valid ? PyObject_GetIter(valid) : nullptr;
    std::vector<int> found;
    for (PyObject* s; it && (s = PyIter_Next(it)) != nullptr; Py_DECREF(s))
      found.push_back(static_cast<int>(PyLong_AsLong(s)));
    Py_XDECREF(it);
    Py_XDECREF(valid);
    PyObject* dflt = mod ? PyObject_GetAttrString(mod, "default_int_handler") : nullptr;
    PyObject* get = mod ? PyObject_GetAttrString(mod, "getsignal") : nullptr;
    Py_XDECREF(mod);
    if (get == nullptr || dflt == nullptr || PyErr_Occurred()) {
      PyErr_Clear();
      Py_XDECREF(get);
      Py_XDECREF(dflt);
      return false;
    }
    signals = std::move(found);
    ctrlC = dflt;
    getsignal = get;
  }
  for (int s : signals) {
    PyObject* h = PyObject_CallFunction(getsignal, "i", s);
    if (h == nullptr) {
      PyErr_Clear();
      return false;
    }
    const bool dflt = h == Py_None || h == ctrlC || PyLong_Check(h) ||  // ints: SIG_DFL, SIG_IGN
                      (s == SIGCHLD && isDataLoaderHandler(h));
    Py_DECREF(h);
    if (!dflt) return false;
  }
  return true;
}

bool runSignalHandlers(std::string* what) {
  if (PyThread_get_thread_ident() != gMainThread || isFinalizing()) return false;
  PyGILState_STATE st = PyGILState_Ensure();
  const bool raised = onlyDefaultHandlers() && PyErr_CheckSignals() != 0;
  if (raised) {
    Py_XDECREF(tRaised.type);
    Py_XDECREF(tRaised.value);
    Py_XDECREF(tRaised.tb);
    PyErr_Fetch(&tRaised.type, &tRaised.value, &tRaised.tb);
    PyErr_NormalizeException(&tRaised.type, &tRaised.value, &tRaised.tb);
    *what = reinterpret_cast<PyTypeObject*>(tRaised.type)->tp_name;
  }
  PyGILState_Release(st);
  return raised;
}

// The handler's own exception (KeyboardInterrupt, torchrun's SignalException), with a note
// saying where it stopped us; false if this thread has none.
bool reraiseHandlers(const Interrupted& e) {
  Raised r = tRaised;
  tRaised = Raised{};
  if (r.type == nullptr) return false;
  if (r.value != nullptr) addNote(r.value, std::string("ringreduce: ") + e.what());
  PyErr_Restore(r.type, r.value, r.tb);
  return true;
}

}  // namespace

void installSignalCheck() {
  gMainThread = py::module_::import("threading").attr("main_thread")().attr("ident")
                    .cast<unsigned long>();
  pthread_atfork(nullptr, nullptr, [] { gMainThread = PyThread_get_thread_ident(); });
  setInterruptCheck(runSignalHandlers);
}

bool reraiseSignalError(const Interrupted& e) { return reraiseHandlers(e); }

void addNote(PyObject* exc, const std::string& note) {
  PyObject* ok = PyObject_CallMethod(exc, "add_note", "s", note.c_str());
  if (ok == nullptr) PyErr_Clear();
  Py_XDECREF(ok);
}

}  // namespace rr::bindings
