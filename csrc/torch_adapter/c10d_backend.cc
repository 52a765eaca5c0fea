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
// Built by ringreduce/_c10d_build.py against the torch that is installed (on first use,
// cached per torch build), never by setup.py: a torch extension compiled against another
// torch crashes, so the build records the torch version it saw and the loader refuses a
// mismatch (TORCH_BUILD_VERSION below).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PyProcessGroup.hpp>
#include <torch/extension.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#ifndef RR_TORCH_VERSION
#define RR_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;

namespace {

// A Work returned by the Python side, kept alive (and its Python object with it) for as long
// as torch holds the C++ one. wait/getFuture go through torch's own trampoline (PyWork);
// completion and errors are asked of the Python object, which knows them.
class PyWorkRef : public c10d::Work {
 public:
  explicit PyWorkRef(py::object w)
      : work_(w.cast<c10::intrusive_ptr<c10d::Work>>()), py_(std::move(w)) {}

  ~PyWorkRef() override {
    py::gil_scoped_acquire gil;
    py_ = py::object();
  }

  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_completed")().cast<bool>();
  }

  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_success")().cast<bool>();
  }

  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return py_.attr("result")().cast<std::vector<at::Tensor>>();
  }

  void synchronize() override { wait(kNoTimeout); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object py_;
};

// PREMUL_SUM (sum of factor * x, the factor a double or a one-element tensor carried by the
// ReduceOp, where Python cannot see it): scale here, then reduce with SUM.
bool isPremul(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::PREMUL_SUM; }

at::Tensor premulScaled(const c10d::ReduceOp& op, const at::Tensor& t, bool inPlace) {
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "ringreduce: ReduceOp.PREMUL_SUM without a factor; make it with "
              "torch.distributed._make_nccl_premul_sum(factor)");
  if (s->tensor_factor.defined()) {
    at::Tensor f = s->tensor_factor.to(t.device(), t.scalar_type());
    return inPlace ? t.mul_(f) : t.mul(f);
  }
  return inPlace ? t.mul_(s->double_factor) : t.mul(s->double_factor);
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
      : c10d::Backend(rank, size), impl_(std::move(impl)) {}

  ~RingReduceBackend() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  const std::string getBackendName() const override { return "ringreduce"; }

  py::object impl() const { return impl_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t,
                                           const c10d::BroadcastOptions& o) override {
    return call("broadcast", t, o);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t,
                                           const c10d::AllreduceOptions& o) override {
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
    return call("barrier", o);
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
    ++seq_;
    py::gil_scoped_acquire gil;
    py::object w = impl_.attr(name)(args...);
    return c10::make_intrusive<PyWorkRef>(std::move(w));
  }

  void callVoid(const char* name) {
    py::gil_scoped_acquire gil;
    if (impl_) impl_.attr(name)();
  }

  py::object impl_;
  uint64_t seq_ = 0;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ringreduce's c10d Backend (built against the installed torch)";
  m.attr("TORCH_BUILD_VERSION") = RR_TORCH_VERSION;
  // Registered with torch's c10d::Backend as base, so torch accepts it from the creator
  // function and stores it in the ProcessGroup like gloo's or NCCL's.
  py::class_<RingReduceBackend, c10d::Backend, c10::intrusive_ptr<RingReduceBackend>>(
      m, "RingReduceBackend")
      .def(py::init<int, int, py::object>(), py::arg("rank"), py::arg("size"), py::arg("impl"))
      .def_property_readonly("impl", &RingReduceBackend::impl);
}
