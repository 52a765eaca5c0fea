// The "ringreduce" c10d Backend: the one file of the project that includes torch headers.
//
// torch.distributed keeps a C++ c10d::Backend per device in every ProcessGroup; DeviceMesh,
// DTensor, FSDP2, functional collectives, `_get_backend`, group names and device maps such
// as "cpu:ringreduce,cuda:nccl" all go through that object. Python cannot subclass
// c10d::Backend (torch has no trampoline for it), so this adapter is one: every operation
// forwards, with the GIL taken, to the Python object `impl` (ringreduce.backend's
// operations, which run them on the ringreduce core and return a torch Work). The core itself
// stays free of torch.
//
// Synchronous calls (torch sets opts.asyncOp = false for dist.all_reduce(t), broadcast and
// barrier without async_op) of one dense CPU tensor skip Python altogether: the core's C
// entry points (native_api.h) run them on this thread, and a completed Work is returned.
//
// Built by ringreduce/_c10d_build.py against the torch that is installed (on first use,
// cached per torch build), never by setup.py: a torch extension compiled against another
// torch crashes, so the build records the torch version it saw and the loader refuses a
// mismatch (TORCH_BUILD_VERSION below).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#if __has_include(<torch/csrc/distributed/c10d/py/PyProcessGroup.hpp>)  // torch >= 2.14
#include <torch/csrc/distributed/c10d/py/PyProcessGroup.hpp>
#else
#include <torch/csrc/distributed/c10d/PyProcessGroup.hpp>
#endif
#include <torch/csrc/Dtype.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>
#include <pybind11/chrono.h>

#include <array>
#include <chrono>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "native_api.h"

#ifndef RR_TORCH_VERSION
#define RR_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;

namespace {

// While torch's C++ calls into ringreduce's Python (DDP's buffer broadcast and bucket rebuild
// run inside a torch.compile'd forward), dynamo's frame hook is off, as torch._dynamo.disable
// turns it off: with it on, dynamo traced ringreduce's own functions and recompiled them for
// every shape (34 recompiles, a 6 s first step against gloo's 0.5 s; found by a helper).
// Needs the GIL.
class Untraced {
 public:
  Untraced() {
    py::object* set = setter();
    if (!set || set->is_none()) return;
    prior_ = (*set)(py::none());
    set_ = set;
  }
  // torch._C._dynamo.eval_frame.set_eval_frame, looked up once at module import (not in a
  // function-local static: its lock, taken with the GIL held, could deadlock an import that
  // releases the GIL). Never freed: it outlives the interpreter.
  static py::object*& setter() {
    static py::object* set = nullptr;
    return set;
  }
  static void init() { setter() = new py::object(lookup()); }
  ~Untraced() {
    if (!set_) return;
    try {
      (*set_)(prior_);
    } catch (const py::error_already_set&) {  // never seen; a destructor must not throw
    }
  }
  Untraced(const Untraced&) = delete;
  Untraced& operator=(const Untraced&) = delete;

 private:
  static py::object lookup() {
    try {
      return py::module_::import("torch._C._dynamo.eval_frame").attr("set_eval_frame");
    } catch (const py::error_already_set&) {  // a torch without dynamo: nothing to turn off
      return py::none();
    }
  }
  py::object* set_ = nullptr;
  py::object prior_;
};

// A tensor, a list of tensors or a list of such lists (a Work's value) as a C++ value; None
// for anything else. Runs no Python code (see PyWorkRef::getFuture).
c10::IValue tensorsOf(py::handle v) {
  if (THPVariable_Check(v.ptr())) return v.cast<at::Tensor>();
  if (!py::isinstance<py::list>(v) && !py::isinstance<py::tuple>(v)) return {};
  auto seq = py::reinterpret_borrow<py::sequence>(v);
  bool flat = true;
  for (auto item : seq) flat = flat && THPVariable_Check(item.ptr());
  if (flat) return c10::IValue(seq.cast<std::vector<at::Tensor>>());
  c10::impl::GenericList lists(c10::ListType::create(c10::TensorType::get()));
  for (auto item : seq) {
    c10::IValue one = tensorsOf(item);
    if (!one.isTensorList()) return {};
    lists.push_back(std::move(one));
  }
  return c10::IValue(std::move(lists));
}

// A Work returned by the Python side, kept alive (and its Python object with it) for as long
// as torch holds the C++ one. wait/getFuture go through torch's own trampoline (PyWork);
// completion and errors are asked of the Python object, which knows them.
class PyWorkRef : public c10d::Work {
 public:
  // type: work._get_op_type(), as gloo's Works say it.
  PyWorkRef(py::object w, uint64_t seq, int rank, c10d::OpType type)
      : c10d::Work(rank, type),
        work_(w.cast<c10::intrusive_ptr<c10d::Work>>()),
        py_(std::move(w)),
        seq_(seq) {}

  ~PyWorkRef() override {
    py::gil_scoped_acquire gil;
    py_ = py::object();
  }

  bool wait(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;  // the Python wait releases it while it blocks
    Untraced off;
    return work_->wait(timeout);
  }

  // The Python Future's value converted to a C++ one here, not by a Python callback: torch
  // completes the child future (DDP's reducer reads it) on the calling thread -- the main
  // thread in backward(), where Python code ran the pending Ctrl-C handler: "RuntimeError:
  // Cannot extract tensors from value: KeyboardInterrupt" instead of gloo's KeyboardInterrupt
  // once backward() returns. A failure (the exception object the completer set) fails it.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    py::gil_scoped_acquire gil;
    Untraced off;
    auto raw = py_.attr("raw_future")().cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>();
    return raw->fut->then(
        [](c10::ivalue::Future& parent) -> c10::IValue {
          if (parent.hasError()) std::rethrow_exception(parent.exception_ptr());
          py::gil_scoped_acquire gil;
          py::object v = torch::jit::toPyObject(parent.value());
          if (PyExceptionInstance_Check(v.ptr())) {
            auto type = py::type::handle_of(v).attr("__name__").cast<std::string>();
            throw std::runtime_error(type + ": " + py::str(v).cast<std::string>());
          }
          c10::IValue out = tensorsOf(v);
          return out.isNone() ? parent.value() : out;
        },
        c10::AnyType::get());
  }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    Untraced off;
    return py_.attr("is_completed")().cast<bool>();
  }

  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    Untraced off;
    return py_.attr("is_success")().cast<bool>();
  }

  // work.exception() after a failure (gloo: the error; torch's default here: None). The
  // Python error is kept whole, so torch's binding hands back our exception object.
  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    Untraced off;
    py::object e = py_.attr("exception")();
    if (e.is_none()) return nullptr;
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
    return std::make_exception_ptr(py::error_already_set());
  }

  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    Untraced off;
    return py_.attr("result")().cast<std::vector<at::Tensor>>();
  }

  void synchronize() override { wait(kNoTimeout); }

  // recv / recvAnysource: the sender's group rank (torch's work._source_rank()).
  int sourceRank() const override {
    py::gil_scoped_acquire gil;
    Untraced off;
    return py_.attr("source_rank")().cast<int>();
  }

  // work._get_sequence_number(): the group's operation count when this one was issued, as
  // gloo's (the first is 1).
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object py_;
  uint64_t seq_;
};

// A collective that already ran (the synchronous path: no call of its own timeout, which
// the Python side sets, e.g. dist.barrier(timeout=)): torch still calls wait() on it.
class DoneWork : public c10d::Work {
 public:
  DoneWork(std::vector<at::Tensor> out, uint64_t seq, int rank, c10d::OpType type)
      : c10d::Work(rank, type), out_(std::move(out)), seq_(seq) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return out_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(out_));
    return f;
  }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  std::vector<at::Tensor> out_;
  uint64_t seq_;
};

// The core's C entry points for one group, from the Python side's `native()`: (api capsule,
// communicator handle, default algorithm, {torch dtype: code}, {RedOpType: code}).
class Native {
 public:
  void init(const py::object& impl) {
    if (!py::hasattr(impl, "native")) return;
    py::object n = impl.attr("native")();
    if (n.is_none()) return;
    auto t = n.cast<py::tuple>();
    auto* api = static_cast<const rr_native_api*>(
        PyCapsule_GetPointer(t[0].ptr(), RR_NATIVE_API_CAPSULE));
    void* comm = PyCapsule_GetPointer(t[1].ptr(), RR_NATIVE_COMM_CAPSULE);
    if (api == nullptr || comm == nullptr || api->version != RR_NATIVE_API_VERSION) {
      PyErr_Clear();  // an older/newer core: the Python path still works
      return;
    }
    dtype_.fill(-1);
    op_.fill(-1);
    for (auto kv : t[3].cast<py::dict>()) {
      if (!THPDtype_Check(kv.first.ptr())) continue;
      auto st = static_cast<size_t>(reinterpret_cast<THPDtype*>(kv.first.ptr())->scalar_type);
      if (st < dtype_.size()) dtype_[st] = kv.second.cast<int>();
    }
    for (auto kv : t[4].cast<py::dict>()) {
      auto k = kv.first.cast<size_t>();
      if (k < op_.size()) op_[k] = kv.second.cast<int>();
    }
    algo_ = t[2].cast<int>();
    if (t.size() > 5 && PyByteArray_Check(t[5].ptr()) && PyByteArray_Size(t[5].ptr()) >= 1) {
      flag_ = PyByteArray_AsString(t[5].ptr());
      keepFlag_ = t[5];
    }
    keep_ = t[1];
    comm_ = comm;
    api_ = api;
  }
  void release() {  // GIL held
    keep_ = py::object();
    keepFlag_ = py::object();
    flag_ = nullptr;
    api_ = nullptr;
  }
  // Whether an earlier async collective of the group may still have outputs to copy (the
  // Python side's byte, written under the GIL; read here without it).
  bool copiesPending() const {
    return flag_ != nullptr && *static_cast<volatile const char*>(flag_) != 0;
  }

  // The dtype code of a tensor the core can take as is (dense, contiguous, CPU), else -1.
  int code(const at::Tensor& x) const {
    if (api_ == nullptr || !x.defined() || !x.device().is_cpu() || x.layout() != at::kStrided ||
        !x.is_contiguous() || x.numel() == 0)
      return -1;
    auto st = static_cast<size_t>(x.scalar_type());
    return st < dtype_.size() ? dtype_[st] : -1;
  }
  int op(const c10d::ReduceOp& o, int dtype) const {
    auto k = static_cast<size_t>(o.op_);
    int c = k < op_.size() ? op_[k] : -1;
    return c >= 0 && api_->reduction_ok(dtype, c) ? c : -1;
  }

  void allreduce(at::Tensor& x, int dtype, int op) {
    check(nogil([&](unsigned site) {
      return api_->allreduce(comm_, x.data_ptr(), static_cast<size_t>(x.numel()), dtype, op,
                             algo_, site);
    }));
  }
  void broadcast(at::Tensor& x, int dtype, int root) {
    check(nogil([&](unsigned site) {
      return api_->broadcast(comm_, x.data_ptr(), static_cast<size_t>(x.numel()), dtype, root,
                             site);
    }));
  }
  void barrier() {
    check(nogil([&](unsigned site) { return api_->barrier(comm_, site); }));
  }
  bool ready() const { return api_ != nullptr; }

 private:
  // Run `f(call site)` without the GIL (torch's bindings released it; a caller that holds
  // it, e.g. a torch op invoked from Python, gets it released for the wait).
  template <typename F>
  int nogil(F&& f) {
    unsigned site;
    if (PyGILState_Check()) {
      site = api_->call_site();
      py::gil_scoped_release nogil;
      return f(site);
    }
    {
      py::gil_scoped_acquire gil;
      site = api_->call_site();
    }
    return f(site);
  }
  static void check(int rc) {
    if (rc == 0) return;
    py::gil_scoped_acquire gil;  // the core set the Python exception (culprit named)
    throw py::error_already_set();
  }

  const rr_native_api* api_ = nullptr;
  void* comm_ = nullptr;
  int algo_ = 0;
  std::array<int, 64> dtype_{};
  std::array<int, 16> op_{};
  py::object keep_;
  char* flag_ = nullptr;
  py::object keepFlag_;
};

// PREMUL_SUM (sum of factor * x, the factor a double or a one-element tensor carried by the
// ReduceOp, where Python cannot see it): scale here, then reduce with SUM.
bool isPremul(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::PREMUL_SUM; }

at::Tensor premulScaled(const c10d::ReduceOp& op, const at::Tensor& t, bool inPlace) {
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "ringreduce: ReduceOp.PREMUL_SUM without a factor; make it with "
              "torch.distributed._make_nccl_premul_sum(factor)");
  // Before scaling: an integer tensor times a float factor fails in torch's mul_ (in place)
  // or silently becomes a float copy that the reduce then blames on the output. A
  // RuntimeError, as gloo's refusal of the op (`except RuntimeError` catches both).
  TORCH_CHECK(at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()),
              "ringreduce: ReduceOp.PREMUL_SUM scales by a floating-point factor and needs a "
              "floating-point tensor, got ", t.scalar_type(), "; use SUM and scale yourself, or "
              "convert the tensor to a float dtype");
  if (s->tensor_factor.defined()) {
    at::Tensor f = s->tensor_factor.to(t.device(), t.scalar_type());
    return inPlace ? t.mul_(f) : t.mul(f);
  }
  return inPlace ? t.mul_(s->double_factor) : t.mul(s->double_factor);
}

// The OpType a gloo Work of the same call says (work._get_op_type()), by our Python name.
c10d::OpType opType(const std::string& name) {
  using T = c10d::OpType;
  static const std::unordered_map<std::string, T> types = {
      {"broadcast", T::BROADCAST},
      {"allreduce", T::ALLREDUCE},
      {"allreduce_coalesced", T::ALLREDUCE_COALESCED},
      {"reduce", T::REDUCE},
      {"allgather", T::ALLGATHER},
      {"_allgather_base", T::_ALLGATHER_BASE},
      {"allgather_coalesced", T::ALLGATHER_COALESCED},
      {"allgather_into_tensor_coalesced", T::COALESCED},
      {"gather", T::GATHER},
      {"scatter", T::SCATTER},
      {"reduce_scatter", T::REDUCE_SCATTER},
      {"_reduce_scatter_base", T::_REDUCE_SCATTER_BASE},
      {"reduce_scatter_tensor_coalesced", T::REDUCE_SCATTER_TENSOR_COALESCED},
      {"alltoall_base", T::ALLTOALL_BASE},
      {"alltoall", T::ALLTOALL},
      {"send", T::SEND},
      {"recv", T::RECV},
      {"recv_anysource", T::RECVANYSOURCE},
      {"barrier", T::BARRIER}};
  auto it = types.find(name);
  return it == types.end() ? T::UNKNOWN : it->second;
}

template <typename Opts>
Opts asSum(const Opts& o) {
  Opts s = o;
  s.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return s;
}

class RingReduceBackend : public c10d::Backend {
 public:
  RingReduceBackend(int rank, int size, py::object impl)
      : c10d::Backend(rank, size), impl_(std::move(impl)) {
    native_.init(impl_);
  }

  ~RingReduceBackend() override {
    py::gil_scoped_acquire gil;
    native_.release();
    impl_ = py::object();
  }

  const std::string getBackendName() const override { return "ringreduce"; }

  // ProcessGroup.split_group / dist.split_group: torch asks for the options, then each rank
  // of the parent calls split() with the new group's sorted ranks in the parent and its store; a
  // member gets its new backend (a ringreduce group set up through that store, as
  // dist.new_group's), any other rank null.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    py::gil_scoped_acquire gil;
    Untraced off;
    const double secs = impl_.attr("timeout_seconds")().cast<double>();
    return c10::make_intrusive<Options>(
        "ringreduce", std::chrono::milliseconds(static_cast<int64_t>(secs * 1000.0)));
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override {
    py::gil_scoped_acquire gil;
    Untraced off;
    const double secs = opts ? static_cast<double>(opts->timeout.count()) / 1000.0 : 0.0;
    py::object b = impl_.attr("split")(py::cast(store), ranks, secs,
                                       opts ? opts->group_name : std::string());
    if (b.is_none()) return nullptr;
    return b.cast<c10::intrusive_ptr<c10d::Backend>>();
  }

  // While an earlier async collective of this group may have outputs to copy, a
  // synchronous call takes the Python path, which makes those copies first, as gloo's
  // worker runs a group's work in order (ringreduce/backend.py: _Ops._issued).
  bool copiesPending() const { return native_.copiesPending(); }

  py::object impl() const { return impl_; }
  // Calls that took the synchronous path (tests and benchmarks check it is taken).
  uint64_t directCalls() const { return direct_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t,
                                           const c10d::BroadcastOptions& o) override {
    if (!o.asyncOp && t.size() == 1 && o.rootTensor == 0 && o.rootRank >= 0 &&
        o.rootRank < size_ && o.timeout == c10d::kUnsetTimeout && !copiesPending()) {
      int dt = native_.code(t[0]);
      if (dt >= 0) {
        ++seq_;
        ++direct_;
        native_.broadcast(t[0], dt, static_cast<int>(o.rootRank));
        return c10::make_intrusive<DoneWork>(t, seq_, rank_, c10d::OpType::BROADCAST);
      }
    }
    return call("broadcast", t, o);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t,
                                           const c10d::AllreduceOptions& o) override {
    if (!o.asyncOp && t.size() == 1 && !o.sparseIndices.has_value() &&
        o.timeout == c10d::kUnsetTimeout && !copiesPending()) {
      int dt = native_.code(t[0]);
      int op = dt >= 0 ? native_.op(o.reduceOp, dt) : -1;
      if (op >= 0) {
        ++seq_;
        ++direct_;
        native_.allreduce(t[0], dt, op);
        return c10::make_intrusive<DoneWork>(t, seq_, rank_, c10d::OpType::ALLREDUCE);
      }
    }
    if (!isPremul(o.reduceOp)) return call("allreduce", t, o);
    for (auto& x : t) premulScaled(o.reduceOp, x, true);
    auto s = asSum(o);
    return call("allreduce", t, s);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& t, const c10d::AllreduceCoalescedOptions& o) override {
    if (!isPremul(o.reduceOp)) return call("allreduce_coalesced", t, o);
    for (auto& x : t) premulScaled(o.reduceOp, x, true);
    auto s = asSum(o);
    return call("allreduce_coalesced", t, s);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t,
                                        const c10d::ReduceOptions& o) override {
    if (!isPremul(o.reduceOp)) return call("reduce", t, o);
    for (auto& x : t) premulScaled(o.reduceOp, x, true);  // non-root inputs: unspecified
    auto s = asSum(o);
    return call("reduce", t, s);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out,
                                           std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override {
    return call("allgather", out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o) override {
    return call("_allgather_base", out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
      const c10d::AllgatherOptions& o) override {
    return call("allgather_coalesced", out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
      const c10d::AllgatherOptions& o) override {
    return call("allgather_into_tensor_coalesced", out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out,
                                        std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override {
    return call("gather", out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out,
                                         std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override {
    return call("scatter", out, in, o);
  }
  // Inputs of a reduce-scatter are the caller's: PREMUL_SUM scales copies of them.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out,
                                                std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override {
    if (!isPremul(o.reduceOp)) return call("reduce_scatter", out, in, o);
    std::vector<std::vector<at::Tensor>> scaled = in;
    for (auto& l : scaled)
      for (auto& x : l) x = premulScaled(o.reduceOp, x, false);
    auto s = asSum(o);
    return call("reduce_scatter", out, scaled, s);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o) override {
    if (!isPremul(o.reduceOp)) return call("_reduce_scatter_base", out, in, o);
    at::Tensor scaled = premulScaled(o.reduceOp, in, false);
    auto s = asSum(o);
    return call("_reduce_scatter_base", out, scaled, s);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
      const c10d::ReduceScatterOptions& o) override {
    if (!isPremul(o.reduceOp)) return call("reduce_scatter_tensor_coalesced", out, in, o);
    std::vector<at::Tensor> scaled;
    for (auto& x : in) scaled.push_back(premulScaled(o.reduceOp, x, false));
    auto s = asSum(o);
    return call("reduce_scatter_tensor_coalesced", out, scaled, s);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& outSplit,
                                               std::vector<int64_t>& inSplit,
                                               const c10d::AllToAllOptions& o) override {
    return call("alltoall_base", out, in, outSplit, inSplit, o);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& out,
                                          std::vector<at::Tensor>& in,
                                          const c10d::AllToAllOptions& o) override {
    return call("alltoall", out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override {
    return call("send", t, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override {
    return call("recv", t, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override {
    return call("recv_anysource", t, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    if (!o.asyncOp && native_.ready() && o.timeout == c10d::kUnsetTimeout && !copiesPending()) {
      ++seq_;
      ++direct_;
      native_.barrier();
      return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>(), seq_, rank_,
                                          c10d::OpType::BARRIER);
    }
    return call("barrier", o);
  }
  // dist.monitored_barrier (torch 2.14 runs it on any CPU backend; 2.13 on gloo only).
  void monitoredBarrier(const c10d::BarrierOptions& o, bool waitAllRanks) override {
    py::gil_scoped_acquire gil;
    Untraced off;
    impl_.attr("monitored_barrier")(static_cast<double>(o.timeout.count()) / 1000.0,
                                    waitAllRanks);
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    impl_.attr("set_timeout")(static_cast<double>(timeout.count()) / 1000.0);
  }
  // torch's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) compares these across
  // ranks: the number of operations issued on this group.
  void setSequenceNumberForGroup() override { seq_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  void abort() override { callVoid("abort"); }
  void shutdown() override { callVoid("shutdown"); }

 private:
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> call(const char* name, Args&... args) {
    const uint64_t seq = ++seq_;  // (a Future's callback in the call may issue another)
    py::gil_scoped_acquire gil;
    Untraced off;
    py::object w = impl_.attr(name)(args...);
    return c10::make_intrusive<PyWorkRef>(std::move(w), seq, rank_, opType(name));
  }

  void callVoid(const char* name) {
    py::gil_scoped_acquire gil;
    Untraced off;
    if (impl_) impl_.attr(name)();
  }

  py::object impl_;
  Native native_;
  uint64_t seq_ = 0;
  uint64_t direct_ = 0;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ringreduce's c10d Backend (built against the installed torch)";
  m.attr("TORCH_BUILD_VERSION") = RR_TORCH_VERSION;
  Untraced::init();
  // Registered with torch's c10d::Backend as base, so torch accepts it from the creator
  // function and stores it in the ProcessGroup like gloo's or NCCL's.
  py::class_<RingReduceBackend, c10d::Backend, c10::intrusive_ptr<RingReduceBackend>>(
      m, "RingReduceBackend")
      .def(py::init<int, int, py::object>(), py::arg("rank"), py::arg("size"), py::arg("impl"))
      .def_property_readonly("impl", &RingReduceBackend::impl)
      .def_property_readonly("direct_calls", &RingReduceBackend::directCalls)
      // gloo's and NCCL's name for Backend.setTimeout (torch's _set_pg_timeout passes only
      // theirs on): the group's calls begun from now on wait at most `timeout`.
      .def("_set_default_timeout", &RingReduceBackend::setTimeout, py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>());
}
