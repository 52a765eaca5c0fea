// _C.FastCall(kind, fallback, slot): a callable standing in for a Python API function whose
// commonest call is latency-bound -- rr.barrier(), rr.allreduce(ndarray) on the world,
// rr.send(ndarray, peer) / rr.recv(ndarray, peer) on tag 0 once the pair's channel exists.
// Those run here on the communicator whose handle the slot holds (ringreduce._state._FAST,
// _SEND, _RECV, kept in step with init/destroy and p2p channels); every other call,
// argument or state goes to `fallback`, the Python function, which does the checks and
// explains errors. A Python frame costs ~0.6 us on a slow VM: more than a shared-memory
// barrier. Attributes (__doc__, __name__, __wrapped__ for inspect.signature) come from
// the fallback.
#include "bindings/fastcall.h"

#include <structmember.h>

#include "bindings/callsite.h"
#include "bindings/native_api.h"
#include "torch_adapter/native_api.h"

namespace py = pybind11;

namespace rr::bindings {

int numpyDtypeCode(const py::dtype& dt) {
  char bo = dt.byteorder();
  if (bo == '>') return -1;
  char kind = dt.kind();
  ssize_t size = dt.itemsize();
  if (kind == 'f') return size == 4 ? 0 : size == 8 ? 1 : size == 2 ? 2 : -1;
  if (kind == 'i') return size == 1 ? 4 : size == 4 ? 6 : size == 8 ? 7 : -1;
  if (kind == 'u') return size == 1 ? 5 : -1;
  return -1;
}

namespace {

enum Kind { kBarrier = 0, kAllreduce = 1, kSend = 2, kRecv = 3 };

struct FastCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  int kind;
  PyObject* fallback;
  // kBarrier, kAllreduce: [world handle capsule or None, default algorithm code];
  // kSend, kRecv: [this rank, [tag-0 channel handle toward/from each rank, or None]].
  PyObject* slot;
  unsigned long long hits;  // calls that took the fast path (tests check it is taken)
};

// Another thread may rewrite a slot whenever this one runs Python code -- a dtype's
// attribute, a garbage collection's finalizer, the call site's lookup -- not only while the
// GIL is released (destroy(), init(), a re-made channel drop the capsule, whose destructor
// frees the handle). So a call takes its own reference to what it reads from a slot at
// once, and keeps it until the native call is back (found under AddressSanitizer: a
// heap-use-after-free in the handle's weak_ptr::lock(); then by CI, a capsule freed between
// the read and the call: "PyCapsule_GetPointer called with invalid PyCapsule object").
py::object held(PyObject* list, Py_ssize_t i) {
  return py::reinterpret_borrow<py::object>(PyList_GET_ITEM(list, i));
}

// Run `f(handle, site)` with the GIL released; NULL with the exception set on failure.
// The caller holds `cap` (held()).
template <typename F>
PyObject* runNative(const py::object& cap, F&& f) {
  void* h = PyCapsule_GetPointer(cap.ptr(), RR_NATIVE_COMM_CAPSULE);
  if (h == nullptr) return nullptr;
  unsigned site = currentCallSite();
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = f(nativeTable(), h, site);
  Py_END_ALLOW_THREADS
  if (rc != 0) return nullptr;
  Py_RETURN_NONE;
}

// 1: done; -1: failed (exception set); 0: not a call for the fast path.
int fastAllreduce(FastCall* self, const py::object& cap, PyObject* x) {
  long algo = PyLong_AsLong(PyList_GET_ITEM(self->slot, 1));  // read with the capsule
  if (algo < 0) {
    PyErr_Clear();
    return 0;
  }
  if (!py::isinstance<py::array>(x)) return 0;
  auto a = py::reinterpret_borrow<py::array>(x);
  int code = numpyDtypeCode(a.dtype());
  if (code < 0 || !(a.flags() & py::array::c_style) || !a.writeable() || a.size() == 0)
    return 0;
  void* ptr = a.mutable_data();
  auto count = static_cast<size_t>(a.size());
  PyObject* r = runNative(cap, [&](const rr_native_api& api, void* h, unsigned site) {
    return api.allreduce(h, ptr, count, code, /*sum*/ 0, static_cast<int>(algo), site);
  });
  if (r == nullptr) return -1;
  Py_DECREF(r);
  return 1;
}

// rr.send(x, peer) / rr.recv(x, peer) on tag 0 of a channel made earlier: a broadcast on
// the pair's two-rank channel, rooted at the sender (ranks [lo, hi]: root 0 when lo sends).
int fastP2P(FastCall* self, PyObject* x, PyObject* peerObj) {
  const bool sending = self->kind == kSend;
  const py::object handles = held(self->slot, 1);
  long me = PyLong_AsLong(PyList_GET_ITEM(self->slot, 0));
  if (!PyList_Check(handles.ptr()) || !PyLong_CheckExact(peerObj)) return 0;
  long peer = PyLong_AsLong(peerObj);
  if (peer < 0 || peer >= PyList_GET_SIZE(handles.ptr())) {
    PyErr_Clear();
    return 0;
  }
  const py::object cap = held(handles.ptr(), peer);
  if (!PyCapsule_CheckExact(cap.ptr()) || !py::isinstance<py::array>(x)) return 0;
  auto a = py::reinterpret_borrow<py::array>(x);
  int code = numpyDtypeCode(a.dtype());
  if (code < 0 || !(a.flags() & py::array::c_style) || a.size() == 0 ||
      (!sending && !a.writeable()))
    return 0;
  int root = sending ? (me < peer ? 0 : 1) : (peer < me ? 0 : 1);
  void* ptr = const_cast<void*>(a.data());
  auto count = static_cast<size_t>(a.size());
  PyObject* r = runNative(cap, [&](const rr_native_api& api, void* h, unsigned site) {
    return api.broadcast(h, ptr, count, code, root, site);
  });
  if (r == nullptr) return -1;
  Py_DECREF(r);
  return 1;
}

PyObject* call(PyObject* o, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<FastCall*>(o);
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames == nullptr) {
    int done = 0;
    const py::object cap = held(self->slot, 0);
    if (self->kind == kBarrier && nargs == 0 && PyCapsule_CheckExact(cap.ptr())) {
      ++self->hits;
      return runNative(cap, [](const rr_native_api& api, void* h, unsigned site) {
        return api.barrier(h, site);
      });
    }
    try {  // pybind11's numpy accessors may throw: never past this C entry point
      if (self->kind == kAllreduce && nargs == 1 && PyCapsule_CheckExact(cap.ptr()))
        done = fastAllreduce(self, cap, args[0]);
      else if ((self->kind == kSend || self->kind == kRecv) && nargs == 2)
        done = fastP2P(self, args[0], args[1]);
    } catch (py::error_already_set& e) {
      e.restore();
      return nullptr;
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return nullptr;
    }
    self->hits += done != 0;
    if (done < 0) return nullptr;
    if (done > 0 && self->kind == kRecv) {  // recv returns src
      Py_INCREF(args[1]);  // (Py_NewRef is Python 3.10's: pyproject allows 3.9)
      return args[1];
    }
    if (done > 0) Py_RETURN_NONE;
  }
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

PyObject* getattro(PyObject* o, PyObject* name) {
  auto* self = reinterpret_cast<FastCall*>(o);
  if (PyUnicode_Check(name)) {
    if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0) {
      Py_INCREF(self->fallback);
      return self->fallback;
    }
    for (const char* own : {"__doc__", "__module__", "__name__", "__qualname__"})
      if (PyUnicode_CompareWithASCIIString(name, own) == 0)
        return PyObject_GetAttr(self->fallback, name);
  }
  PyObject* r = PyObject_GenericGetAttr(o, name);
  if (r != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
  PyErr_Clear();
  return PyObject_GetAttr(self->fallback, name);
}

void dealloc(PyObject* o) {
  auto* self = reinterpret_cast<FastCall*>(o);
  PyObject_GC_UnTrack(o);
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->slot);
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);  // instances of heap types hold a reference to their type
}

int traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<FastCall*>(o);
  Py_VISIT(self->fallback);
  Py_VISIT(self->slot);
  return 0;
}

PyObject* create(PyTypeObject* type, PyObject* args, PyObject* kw) {
  int kind;
  PyObject *fallback, *slot;
  static const char* names[] = {"kind", "fallback", "slot", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iOO!", const_cast<char**>(names), &kind,
                                   &fallback, &PyList_Type, &slot))
    return nullptr;
  if (kind < kBarrier || kind > kRecv) {
    PyErr_SetString(PyExc_ValueError, "FastCall kind: 0 barrier, 1 allreduce, 2 send, 3 recv");
    return nullptr;
  }
  if (!PyCallable_Check(fallback) || PyList_GET_SIZE(slot) != 2) {
    PyErr_SetString(PyExc_TypeError, "FastCall(kind, callable fallback, 2-item list)");
    return nullptr;
  }
  auto* self = reinterpret_cast<FastCall*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = call;
  self->kind = kind;
  self->hits = 0;
  Py_INCREF(fallback);
  self->fallback = fallback;
  Py_INCREF(slot);
  self->slot = slot;
  return reinterpret_cast<PyObject*>(self);
}

PyObject* repr(PyObject* o) {
  return PyObject_Repr(reinterpret_cast<FastCall*>(o)->fallback);
}

PyTypeObject* makeType() {
  static PyMemberDef members[] = {
      {const_cast<char*>("__vectorcalloffset__"), T_PYSSIZET,
       static_cast<Py_ssize_t>(offsetof(FastCall, vectorcall)), READONLY, nullptr},
      {const_cast<char*>("fast_calls"), T_ULONGLONG,
       static_cast<Py_ssize_t>(offsetof(FastCall, hits)), READONLY,
       const_cast<char*>("calls that took the fast path")},
      {nullptr, 0, 0, 0, nullptr}};
  static PyType_Slot slots[] = {
      {Py_tp_new, reinterpret_cast<void*>(create)},
      {Py_tp_dealloc, reinterpret_cast<void*>(dealloc)},
      {Py_tp_traverse, reinterpret_cast<void*>(traverse)},
      {Py_tp_getattro, reinterpret_cast<void*>(getattro)},
      {Py_tp_repr, reinterpret_cast<void*>(repr)},
      {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
      {Py_tp_members, members},
      {Py_tp_doc, const_cast<char*>(
                      "A latency-bound API call run without a Python frame (fastcall.cc).")},
      {0, nullptr}};
  static PyType_Spec spec = {"ringreduce._C.FastCall", sizeof(FastCall), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
                                 Py_TPFLAGS_HAVE_VECTORCALL,
                             slots};
  return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
}

}  // namespace

void registerFastCall(py::module_& m) {
  PyTypeObject* t = makeType();
  if (t == nullptr) throw py::error_already_set();
  m.add_object("FastCall", py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(t)));
}

}  // namespace rr::bindings
