// ringreduce._C.gpu: the CUDA kernels, the staging planner and the NCCL communicator for
// Python (ringreduce/gpu/ wraps these; user code should not need them directly).
//
// Buffers arrive as raw device pointers plus element counts and dtype/op codes (the codes
// of core/types.h, as ringreduce/_buffers.py defines them); streams as the integer value of
// a cudaStream_t. Python keeps the arrays alive. Everything that can block releases the GIL.
//
// registerGpu() must run after bindings::registerErrors(): its exception classes derive
// from RingReduceError, and its translator must be registered later to be tried first.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/types.h"
#include "cuda/dispatch.h"
#include "cuda/runtime.h"
#include "cuda/staging.h"
#include "nccl/comm.h"
#include "nccl/loader.h"

namespace py = pybind11;

namespace rr::bindings {
namespace {

void* asPtr(uintptr_t p) { return reinterpret_cast<void*>(p); }

DataType dtypeOf(int code) {
  if (code < 0 || code >= kNumDataTypes) RR_THROW(InvalidArgument, "unknown dtype code ", code);
  return static_cast<DataType>(code);
}

ReduceOp opOf(int code) {
  if (code < 0 || code >= kNumReduceOps) RR_THROW(InvalidArgument, "unknown reduce op code ", code);
  return static_cast<ReduceOp>(code);
}

cuda::staging::Direction directionOf(const std::string& d) {
  if (d == "device_to_wire") return cuda::staging::Direction::kDeviceToWire;
  if (d == "wire_to_device") return cuda::staging::Direction::kWireToDevice;
  throw InvalidArgument("direction must be 'device_to_wire' or 'wire_to_device', got '" + d + "'");
}

const nccl::Library& ncclLibrary() {
  const nccl::Library* lib = nccl::loaded();
  if (lib == nullptr) {
    throw nccl::NcclUnavailable(
        "NCCL is not loaded: call ringreduce.gpu.load_nccl() first (it finds libnccl.so.2)");
  }
  return *lib;
}

py::dict libraryInfo(const nccl::Library& lib) {
  py::dict d;
  d["path"] = lib.path;
  d["version"] = lib.version;
  d["version_code"] = lib.versionCode;
  d["nonblocking_init"] = lib.hasConfigInit;
  return d;
}

using WorkPtr = std::shared_ptr<nccl::NcclWork>;
using CommPtr = std::shared_ptr<nccl::NcclComm>;

}  // namespace

void registerGpu(py::module_& m) {
  py::module_ g = m.def_submodule("gpu", "CUDA kernels, staging planner and NCCL (internal)");

  py::object base = py::hasattr(m, "RingReduceError")
                        ? py::object(m.attr("RingReduceError"))
                        : py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  static py::exception<cuda::CudaUnavailable> cudaUnavailable(g, "CudaUnavailable", base.ptr());
  static py::exception<nccl::NcclUnavailable> ncclUnavailable(g, "NcclUnavailable", base.ptr());
  static py::exception<cuda::CudaError> cudaError(g, "CudaError", base.ptr());
  static py::exception<nccl::NcclError> ncclError(g, "NcclError", base.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const cuda::CudaUnavailable& e) {
      py::set_error(cudaUnavailable, e.what());
    } catch (const nccl::NcclUnavailable& e) {
      py::set_error(ncclUnavailable, e.what());
    } catch (const cuda::CudaError& e) {
      py::set_error(cudaError, e.what());
    } catch (const nccl::NcclError& e) {
      py::set_error(ncclError, e.what());
    }
  });

  // ---- build and device status (never touch the driver unless asked) ----
  g.def("built_with_cuda", &cuda::builtWithCuda);
  g.def("cuda_build_info", [] {
    py::dict d;
    d["built_with_cuda"] = cuda::builtWithCuda();
    d["archs"] = cuda::compiledArchs();
    d["runtime_version"] = cuda::runtimeVersion();
    return d;
  });
  g.def("cuda_device_status", [] {
    cuda::DeviceStatus s;
    {
      py::gil_scoped_release nogil;
      s = cuda::deviceStatus();
    }
    return py::make_tuple(s.count, s.driverVersion, s.reason);
  }, "(device count, driver version, reason when the count is 0)");
  g.def("require_device", &cuda::requireDevice, py::arg("device"));
  g.def("pointer_info", [](uintptr_t ptr) {
    cuda::PointerInfo i = cuda::pointerInfo(asPtr(ptr));
    py::dict d;
    d["device"] = i.device;
    d["is_device"] = i.isDevice;
    d["is_managed"] = i.isManaged;
    d["is_pinned_host"] = i.isPinnedHost;
    return d;
  }, py::arg("ptr"));

  // ---- staging primitives (ringreduce/gpu/staging.py, for non-torch CUDA arrays) ----
  // Pinned host memory as an integer address; the caller frees it with host_free_pinned.
  g.def("host_alloc_pinned", [](size_t bytes) {
    return reinterpret_cast<uintptr_t>(cuda::hostAllocPinned(bytes));
  }, py::arg("bytes"));
  g.def("host_free_pinned", [](uintptr_t ptr) { cuda::hostFreePinned(asPtr(ptr)); },
        py::arg("ptr"));
  // cudaMemcpyAsync(cudaMemcpyDefault) on `stream`: enqueues only, returns at once.
  g.def("memcpy_async", [](uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream) {
    cuda::memcpyAsync(asPtr(dst), asPtr(src), bytes, asPtr(stream));
  }, py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("stream"));
  g.def("stream_synchronize", [](uintptr_t stream) { cuda::streamSynchronize(asPtr(stream)); },
        py::arg("stream"), py::call_guard<py::gil_scoped_release>());

  // ---- reduce kernels ----
  g.def("kernel_table", [] {
    py::list out;
    for (const cuda::KernelInfo& k : cuda::kernelTable()) {
      py::dict d;
      d["dtype"] = toString(k.dtype);
      d["op"] = toString(k.op);
      d["accumulate"] = toString(k.accumulate);
      d["reduce_kernel"] = k.reduceKernel;
      d["finalize_kernel"] = k.finalizeKernel;
      d["widen_kernel"] = k.widenKernel;
      d["compiled"] = k.compiled;
      out.append(d);
    }
    return out;
  });
  g.def("cuda_reduce", [](int t, int op, uintptr_t dst, uintptr_t src, size_t n, uintptr_t s) {
    cuda::reduce(dtypeOf(t), opOf(op), asPtr(dst), asPtr(src), n, asPtr(s));
  }, py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("src"), py::arg("count"),
        py::arg("stream"));
  g.def("cuda_accumulate", [](int t, int op, uintptr_t acc, uintptr_t src, size_t n, uintptr_t s) {
    cuda::accumulate(dtypeOf(t), opOf(op), static_cast<float*>(asPtr(acc)), asPtr(src), n,
                     asPtr(s));
  }, py::arg("dtype"), py::arg("op"), py::arg("acc"), py::arg("src"), py::arg("count"),
        py::arg("stream"));
  g.def("cuda_widen", [](int t, uintptr_t src, uintptr_t dst, size_t n, uintptr_t s) {
    cuda::widen(dtypeOf(t), asPtr(src), static_cast<float*>(asPtr(dst)), n, asPtr(s));
  }, py::arg("dtype"), py::arg("src"), py::arg("dst"), py::arg("count"), py::arg("stream"));
  g.def("cuda_finalize",
        [](int t, int op, int world, uintptr_t acc, uintptr_t dst, size_t n, uintptr_t s) {
          cuda::finalize(dtypeOf(t), opOf(op), world, asPtr(acc), asPtr(dst), n, asPtr(s));
        },
        py::arg("dtype"), py::arg("op"), py::arg("world"), py::arg("acc"), py::arg("dst"),
        py::arg("count"), py::arg("stream"));

  // ---- staging planner (pure math) ----
  g.def("plan_staging",
        [](size_t count, size_t elemSize, size_t stagingBytes, int numBuffers,
           const std::string& direction) {
          cuda::staging::Plan p = cuda::staging::plan(count, elemSize, stagingBytes, numBuffers,
                                                      directionOf(direction));
          py::dict d;
          d["elem_size"] = p.elemSize;
          d["slot_bytes"] = p.slotBytes;
          d["slot_elems"] = p.slotElems;
          d["num_buffers"] = p.numBuffers;
          d["staging_bytes_used"] = p.stagingBytesUsed;
          py::list chunks, steps;
          for (const auto& c : p.chunks) {
            chunks.append(py::make_tuple(c.offset, c.count, c.byteOffset, c.bytes, c.slot,
                                         c.slotOffset));
          }
          for (const auto& s : p.steps) {
            steps.append(py::make_tuple(cuda::staging::toString(s.kind), s.chunk));
          }
          d["chunks"] = chunks;  // (offset, count, byte_offset, bytes, slot, slot_offset)
          d["steps"] = steps;    // (kind, chunk index) in issue order
          return d;
        },
        py::arg("count"), py::arg("elem_size"), py::arg("staging_bytes"), py::arg("num_buffers"),
        py::arg("direction"));

  // ---- NCCL ----
  g.def("nccl_load", [](const std::vector<std::string>& candidates) {
    const nccl::Library* lib;
    {
      py::gil_scoped_release nogil;
      lib = &nccl::load(candidates);
    }
    return libraryInfo(*lib);
  }, py::arg("candidates"));
  g.def("nccl_loaded", []() -> py::object {
    const nccl::Library* lib = nccl::loaded();
    if (lib == nullptr) return py::none();
    return libraryInfo(*lib);
  });
  g.def("nccl_version_string", &nccl::versionString, py::arg("code"));
  g.def("nccl_unique_id", [] {
    const nccl::Library& lib = ncclLibrary();
    std::string id;
    {
      py::gil_scoped_release nogil;
      id = nccl::getUniqueId(lib);
    }
    return py::bytes(id);
  });

  py::class_<nccl::NcclWork, WorkPtr>(g, "NcclWork")
      .def("wait",
           [](nccl::NcclWork& w, py::object timeout) {
             const double t = timeout.is_none() ? -1.0 : timeout.cast<double>();
             py::gil_scoped_release nogil;
             return w.wait(t);
           },
           py::arg("timeout") = py::none())
      .def("is_completed", &nccl::NcclWork::isCompleted)
      .def("synchronize_stream",
           [](nccl::NcclWork& w, uintptr_t stream) { w.synchronizeStream(asPtr(stream)); },
           py::arg("stream"))
      .def_property_readonly("what", &nccl::NcclWork::what)
      .def_property_readonly("seq", &nccl::NcclWork::seq);

  py::class_<nccl::NcclComm, CommPtr>(g, "NcclComm")
      .def(py::init([](py::bytes uniqueId, int rank, int world, int device, double timeout) {
             std::string id = uniqueId;
             // The device check comes first: it needs no NCCL and says what is missing.
             cuda::requireDevice(device);
             const nccl::Library& lib = ncclLibrary();
             py::gil_scoped_release nogil;
             return nccl::NcclComm::create(lib, id, rank, world, device, timeout);
           }),
           py::arg("unique_id"), py::arg("rank"), py::arg("world"), py::arg("device"),
           py::arg("timeout"))
      .def_property_readonly("rank", &nccl::NcclComm::rank)
      .def_property_readonly("world", &nccl::NcclComm::world)
      .def_property_readonly("device", &nccl::NcclComm::device)
      .def_property_readonly("failed", &nccl::NcclComm::failed)
      .def_property_readonly("destroyed", &nccl::NcclComm::destroyed)
      .def("allreduce",
           [](nccl::NcclComm& c, uintptr_t send, uintptr_t recv, size_t count, int t, int op,
              uintptr_t stream) {
             return c.allreduce(asPtr(send), asPtr(recv), count, dtypeOf(t), opOf(op),
                                asPtr(stream));
           },
           py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
           py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def("broadcast",
           [](nccl::NcclComm& c, uintptr_t send, uintptr_t recv, size_t count, int t, int root,
              uintptr_t stream) {
             return c.broadcast(asPtr(send), asPtr(recv), count, dtypeOf(t), root, asPtr(stream));
           },
           py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"),
           py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def("allgather",
           [](nccl::NcclComm& c, uintptr_t send, uintptr_t recv, size_t sendCount, int t,
              uintptr_t stream) {
             return c.allgather(asPtr(send), asPtr(recv), sendCount, dtypeOf(t), asPtr(stream));
           },
           py::arg("send"), py::arg("recv"), py::arg("send_count"), py::arg("dtype"),
           py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def("reduce_scatter",
           [](nccl::NcclComm& c, uintptr_t send, uintptr_t recv, size_t recvCount, int t, int op,
              uintptr_t stream) {
             return c.reduceScatter(asPtr(send), asPtr(recv), recvCount, dtypeOf(t), opOf(op),
                                    asPtr(stream));
           },
           py::arg("send"), py::arg("recv"), py::arg("recv_count"), py::arg("dtype"),
           py::arg("op"), py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def("barrier",
           [](nccl::NcclComm& c, uintptr_t stream) { return c.barrier(asPtr(stream)); },
           py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def("abort", &nccl::NcclComm::abort, py::arg("reason") = "aborted by the user",
           py::call_guard<py::gil_scoped_release>())
      .def("destroy", &nccl::NcclComm::destroy, py::call_guard<py::gil_scoped_release>());
}

}  // namespace rr::bindings
