// pybind11 module ringreduce._C: the only C++ that knows about Python. It takes raw
// pointers + element counts (the Python layer validated the tensors/arrays and keeps them
// alive), releases the GIL around everything that can block, and maps C++ exceptions to
// Python classes.
#include <array>
#include <algorithm>
#include <exception>
#include <system_error>
#include <utility>

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/callsite.h"
#include "bindings/errors.h"
#include "bindings/fastcall.h"
#include "bindings/native_api.h"
#include "bindings/options.h"
#include "bindings/shm_setup.h"
#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "comm/communicator.h"
#include "comm/site.h"
#include "core/chunking.h"
#include "core/crc32c.h"
#include "core/deadline.h"
#include "core/error.h"
#include "core/log.h"
#include "reduce/reduce.h"
#include "runtime/executor.h"
#include "transport/select.h"
#include "transport/shm/segment.h"
#include "transport/tcp/dialer.h"
#include "transport/tcp/link_table.h"
#include "transport/tcp/mesh.h"

namespace py = pybind11;
using namespace rr;

namespace rr::bindings {
void registerGpu(pybind11::module_& m);  // gpu.cc
}

namespace {

// set_call_timeout's: the collectives this thread issues wait at most this long (< 0: their
// communicator's timeout). Read when a collective is issued, so a queued one keeps it.
thread_local double tCallTimeout = -1;

// `fn` run with its communicator's call timeout set to `sec` (cleared after, also on a throw).
runtime::Task withCallTimeout(runtime::Task fn, double sec) {
  return [fn = std::move(fn), sec](comm::Communicator& cm) {
    struct Clear {
      comm::Communicator& c;
      ~Clear() { c.setCallTimeout(-1); }
    } clear{cm};
    cm.setCallTimeout(sec);
    fn(cm);
  };
}

// What Python sees as _C.Listener: the TCP listener and the UDP heartbeat socket, both
// bound before addresses are exchanged.
struct PyListener {
  explicit PyListener(const std::string& host)
      : tcp(host), hb(std::make_unique<transport::Heartbeat>(host)) {}
  transport::tcp::Listener tcp;
  std::unique_ptr<transport::Heartbeat> hb;
};

// Start `hb` sending to every peer, or (`overlay`: sparse mode) to the overlay only, which
// alone watches this rank all the time (others only while they wait for it: Heartbeat::want).
void startHeartbeat(transport::Heartbeat& hb, int rank, int world,
                    const std::vector<std::string>& hbAddrs, const std::string& secret,
                    const py::dict& opts, const Options& o, const std::vector<int>* overlay) {
  if (static_cast<int>(hbAddrs.size()) != world)
    throw InvalidArgument("need one heartbeat address per rank");
  std::vector<uint8_t> always;
  if (overlay) {
    always.assign(static_cast<size_t>(world), 0);
    for (int p : *overlay) always[static_cast<size_t>(p)] = 1;
  }
  std::string session = opts.contains("session") ? opts["session"].cast<std::string>() : "";
  hb.setName(o.groupName.empty() ? "world" : o.groupName, o.p2pChannel);
  hb.setCarrier(o.rankLabels.empty());  // the world's: groups and channels go quiet beside it
  hb.start(rank, hbAddrs, transport::heartbeatKey(secret, session), o.heartbeatIntervalSec,
           always);
}

// Owns the executor; what Python sees as _C.Communicator.
class PyComm {
 public:
  PyComm(int rank, int world, PyListener& pl, const std::vector<std::string>& addrs,
         const std::string& secret, const py::dict& opts, const std::vector<std::string>& hbAddrs,
         const py::object& shmStore, const py::object& probe,
         std::shared_ptr<transport::tcp::LinkTable> links, uint64_t streamId,
         const std::vector<uint64_t>& linkIds) try {
    transport::tcp::Listener& listener = pl.tcp;
    Options o = bindings::optionsFromDict(opts);
    // A set-up stops when another rank failed (Python's probe raises: a posted failure, a
    // watched peer gone); the connections made are told, naming the rank it names.
    transport::tcp::StillWanted check;
    if (!probe.is_none())
      check = [&probe, &o, world] {
        py::gil_scoped_acquire gil;
        try {
          probe();
        } catch (py::error_already_set& e) {
          bool outside = false;
          const int culprit = bindings::culpritOf(e, o.rankLabels, world, &outside);
          throw transport::tcp::StoppedFor(bindings::messageOf(e), culprit, outside,
                                           std::current_exception());
        }
      };
    if (world < 1 || rank < 0 || rank >= world)
      throw InvalidArgument("rank " + std::to_string(rank) + " out of range for world size " +
                            std::to_string(world));
    if (static_cast<int>(addrs.size()) != world)
      throw InvalidArgument("need one address per rank");
    bindings::ShmPlan plan = bindings::shmFromDict(opts, rank, world, o);
    // Options::socketless: shared memory reaches every rank, and the store can stand in for
    // the mesh while the segments are set up.
    const bool socketless = o.socketless && !plan.prefix.empty() && !shmStore.is_none() &&
                            static_cast<int>(plan.members.size()) == world;
    std::vector<std::unique_ptr<transport::Connection>> conns;
    const bool sparse = socketless || world > std::max(o.fullMeshMax, 1);
    std::vector<int> overlay;  // connected at init and watched; socketless: none, all watched
    if (sparse && !socketless) overlay = transport::tcp::overlayPeers(rank, world);
    std::unique_ptr<transport::Dialer> dialer;
    // Heartbeats start before connecting: a peer whose set-up ends later (a slow connect,
    // shared memory set-up, a store call) is heard from meanwhile, not taken for a silent
    // one by a rank already waiting in its first collective (found by a test: a 3 s slower
    // set-up made the other rank fail with "stopped responding ... never heard from").
    const bool beat = !hbAddrs.empty() && o.heartbeatTimeoutSec > 0 && pl.hb;
    if (beat) startHeartbeat(*pl.hb, rank, world, hbAddrs, secret, opts, o,
                             sparse && !socketless ? &overlay : nullptr);
    // A failed set-up stops them (without a goodbye): its peers learn why another way.
    struct StopOnThrow {
      transport::Heartbeat* hb;
      ~StopOnThrow() {
        if (hb && std::uncaught_exceptions() > 0) hb->stop();
      }
    } stopOnThrow{beat ? pl.hb.get() : nullptr};
    // Connecting and set-up: what the rendezvous before left of RINGREDUCE_CONNECT_TIMEOUT
    // (init waits at most that in all), not a fresh one; later lazy connections get their own.
    const Deadline d = Deadline::after(
        opts.contains("setup_seconds")
            ? std::min(opts["setup_seconds"].cast<double>(), o.connectTimeoutSec)
            : o.connectTimeoutSec);
    try {
      py::gil_scoped_release nogil;
      transport::tcp::Identity me{rank, world, secret, o.rankLabels};
      if (sparse) {
        conns = transport::tcp::connectSubset(me, listener, addrs, overlay, d, check);
        dialer = std::make_unique<transport::tcp::TcpDialer>(me, std::move(listener), addrs);
      } else if (links) {  // a group's: streams on the links the process's groups share
        conns = transport::tcp::connectOverLinks(me, listener, addrs, *links, streamId, linkIds,
                                                 d, check);
        listener.close();
      } else {
        conns = transport::tcp::connectMesh(me, listener, addrs, d, check);
        listener.close();  // nobody else may connect after init
      }
    } catch (const transport::tcp::StoppedFor& e) {
      e.rethrowOriginal();
    } catch (const TimeoutError& e) {  // ranks as users know them (a group's: world ranks;
      const auto& l = o.rankLabels;     // -1, unknown, stays)
      throw TimeoutError(e.what(), rankLabel(l, e.waitingFor()), rankLabel(l, e.stuck()),
                         rankLabel(l, e.via()));
    } catch (const PeerError& e) {
      if (e.outside()) throw;
      throw PeerError(rankLabel(o.rankLabels, e.peer()), e.cause(), e.what(),
                      rankLabel(o.rankLabels, e.via()));
    }
    auto comm = std::make_unique<comm::Communicator>(rank, world, std::move(conns), o);
    if (socketless)
      for (int p = 0; p < world; ++p)
        if (p != rank) overlay.push_back(p);
    if (dialer) comm->setDialer(std::move(dialer), overlay);
    if (!plan.prefix.empty()) {
      bindings::ShmMeeting meet =
          socketless ? bindings::meetOverStore(shmStore) : bindings::meetOverTcp(*comm);
      {
        py::gil_scoped_release nogil;
        comm->beginSetup(std::max(d.pollMs(), 100) / 1000.0);
        bindings::setupShm(*comm, plan, meet);
        comm->endSetup();
        if (socketless) comm->watchLocalProcesses();
      }
    }
    if (beat) {
      comm->setHeartbeat(std::move(pl.hb));  // stopped by the communicator from now on
      stopOnThrow.hb = nullptr;
    }
    exec_ = std::make_shared<runtime::Executor>(std::move(comm));
    runtime::Executor::joinFamily(exec_);  // a point-to-point channel's (else nothing)
  } catch (const std::system_error& e) {  // a thread of the set-up (heartbeats, links, a name
    if (e.code() != std::errc::resource_unavailable_try_again) throw;  // lookup) not started
    throw Error(detail::concat("rank ", rankLabel(bindings::optionsFromDict(opts).rankLabels,
                                                  rank),
                               " could not start a thread while connecting (", e.what(),
                               "): ", comm::kThreadLimitText));
  }

  // Callers hold the GIL: it guards exec_ itself (destroy() swaps it out under the GIL).
  runtime::Executor& ex() { return *held(); }

  // A reference that keeps the executor alive while the caller uses it without the GIL: a
  // destroy() on another thread meanwhile aborts the call but frees nothing under it.
  std::shared_ptr<runtime::Executor> held() {
    if (!exec_) throw Error(comm::kDestroyedText);
    return exec_;
  }

  // Run `fn` as a collective: queued and returned as Work when async, else run to completion.
  py::object run(runtime::Task fn, const std::string& what, bool async) {
    std::shared_ptr<runtime::Executor> e = held();
    uint32_t site = bindings::currentCallSite();
    if (tCallTimeout >= 0) fn = withCallTimeout(std::move(fn), tCallTimeout);
    if (async) {
      std::shared_ptr<runtime::Work> w = e->submit(std::move(fn), what, site);
      return py::cast(w);
    }
    py::gil_scoped_release nogil;
    e->runSync(std::move(fn), what, site);
    return py::none();
  }

  ~PyComm() {
    if (exec_ && exec_->forked()) forgetAfterFork();
  }

  void destroy() {
    if (exec_ && exec_->forked()) return forgetAfterFork();  // nothing of it is ours to end
    std::shared_ptr<runtime::Executor> e = std::move(exec_);  // under the GIL: later calls see
    if (!e) return;                                           // "destroyed" at once
    py::gil_scoped_release nogil;
    e->shutdown();  // aborts and waits out a collective running on another thread
    failedAtDestroy_ = e->comm().failed();  // the executor thread has stopped
    lostPeer_ = e->comm().lostPeer();
    if (lostPeer_ < 0) lostPeer_ = e->comm().unsaidPeer();  // ended without a word: no "bye"
    e.reset();      // freed here, or by the last thread still returning from a call
  }

  // In a forked child (a DataLoader worker, os.fork()): this copy's executor thread, peers
  // and segments belong to the parent. Drop it without running its destructor (that would
  // say goodbye for the parent and wait for a thread that does not exist here).
  void forgetAfterFork() {
    if (!exec_) return;
    static auto* kept = new std::vector<std::shared_ptr<runtime::Executor>>();  // never freed
    kept->push_back(std::move(exec_));
  }

  std::shared_ptr<runtime::Executor> exec_;
  bool failedAtDestroy_ = false;
  int lostPeer_ = -1;
};

// The cluster model of `ringreduce-bench --model`'s arguments (checked).
collectives::ClusterModel clusterModel(int hosts, int local, double alphaUs, double betaNsPerByte,
                                       double shmAlphaUs, double shmBetaNsPerByte) {
  if (hosts < 1 || local < 1) throw InvalidArgument("hosts and local must be >= 1");
  collectives::ClusterModel m;
  m.hosts = hosts;
  m.local = local;
  m.alphaUs = alphaUs;
  m.betaNsPerByte = betaNsPerByte;
  m.shmAlphaUs = shmAlphaUs;
  m.shmBetaNsPerByte = shmBetaNsPerByte;
  return m;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringreduce C++ core";
  bindings::registerErrors(m);
  bindings::registerGpu(m);  // after registerErrors: its translator must be tried first

  // The one table of codes: Python reads these instead of copying the enums (types.h).
  py::dict dtypes, sizes, ops, algos;
  for (int i = 0; i < kNumDataTypes; ++i) {
    dtypes[toString(static_cast<DataType>(i))] = i;
    sizes[toString(static_cast<DataType>(i))] = elementSize(static_cast<DataType>(i));
  }
  for (int i = 0; i < kNumReduceOps; ++i) ops[toString(static_cast<ReduceOp>(i))] = i;
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kShm,
                      Algorithm::kHier})
    algos[toString(a)] = static_cast<int>(a);
  m.attr("DTYPE_CODES") = dtypes;
  m.attr("DTYPE_SIZES") = sizes;  // bytes per element
  m.attr("P2P_EAGER_BYTES") = collectives::p2pEagerBytes();
  m.attr("LATE_S") = static_cast<double>(transport::kLateNs) / 1e9;  // ringreduce/_awake.py
  m.attr("OP_CODES") = ops;
  m.attr("ALGO_CODES") = algos;
  py::dict kinds;  // collectives (fault injection names them; _env's table is checked against it)
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                           CollectiveKind::kBarrier, CollectiveKind::kAllGather,
                           CollectiveKind::kReduceScatter, CollectiveKind::kReduce,
                           CollectiveKind::kGather, CollectiveKind::kScatter,
                           CollectiveKind::kAllToAll})
    kinds[toString(k)] = static_cast<int>(k);
  m.attr("COLLECTIVE_CODES") = kinds;
  py::dict levels;  // RINGREDUCE_DEBUG's names -> log::Level
  for (int i = log::kOff; i <= log::kTrace; ++i) levels[log::kLevelNames[i]] = i;
  m.attr("LOG_LEVELS") = levels;
  m.attr("NATIVE_API") = bindings::nativeApi();
  bindings::registerTunables(m);
  bindings::registerFastCall(m);
  m.def("check_reduction", [](int dtype, int op) {
    checkReduction(static_cast<DataType>(dtype), static_cast<ReduceOp>(op));
  }, "Raise ValueError (saying what to do) when `op` cannot reduce `dtype`.");

  m.def(
      "set_call_timeout",
      [](double sec) { return std::exchange(tCallTimeout, sec < 0 ? -1.0 : sec); },
      py::arg("seconds"),
      "the collectives this thread issues from now on wait at most `seconds` (< 0: their "
      "communicator's timeout); returns the previous value");
  m.def("set_log_level", &log::setLevel);
  m.def("forget_first_failure", &comm::forgetFirstFailure);
  m.def("set_log_prefix", &log::setPrefix);
  m.def("isa_name", &reduce::isaName);
  // Tests only: every name lookup (numeric addresses skip it) sleeps this long first, to
  // show that init and connect give up at their deadline instead of hanging in getaddrinfo.
  m.def("_set_resolve_delay_for_testing", &transport::tcp::setResolveDelayForTesting);
  m.def("set_call_site_skip", &bindings::setCallSiteSkip,
        "Frames from files under these prefixes are not call sites (ringreduce, torch).");
  m.def("set_call_sites", &bindings::setCallSitesEnabled);
  m.def("current_call_site", [] { return comm::siteName(bindings::currentCallSite()); });
  m.def("call_site_id", &bindings::currentCallSite);
  m.def("pin_call_site", &bindings::pinCallSite,
        "This thread's calls report call site `id` (from call_site_id() on the user's thread).");
  // numpy's __array_interface__ builds a dict per call (~3 us here): the data pointer alone.
  m.def("array_data", [](const py::array& a) { return reinterpret_cast<uintptr_t>(a.data()); },
        py::arg("array"), "Address of a numpy array's first element.");
  m.def("crc32c", [](py::bytes b) {
    std::string s = b;
    return crc32c(s.data(), s.size());
  });
  auto checkParts = [](int parts, int i) {
    if (parts < 1 || i < 0 || i >= parts) throw InvalidArgument("need parts >= 1 and 0 <= i < parts");
  };
  m.def("chunk_offset", [checkParts](size_t count, int parts, int i) {
    checkParts(parts, i);
    return chunking::chunkOffset(count, parts, i);
  });
  m.def("chunk_len", [checkParts](size_t count, int parts, int i) {
    checkParts(parts, i);
    return chunking::chunkLen(count, parts, i);
  });
  m.def("shm_slot_bytes", [](int local, int slots, size_t capacity) {
    transport::shm::ShmConfig cfg;
    cfg.slots = slots;
    collectives::planShmSlots(local, capacity, &cfg);
    return std::make_pair(cfg.chunkBytes, cfg.copyBytes);
  }, py::arg("local"), py::arg("slots"), py::arg("capacity") = 0,
     "(chunk, copy unit) bytes of shared memory's slots for `local` ranks on a host whose "
     "/dev/shm holds `capacity` bytes (0: unknown)");
  m.def("select_shm", [](const std::vector<std::string>& hosts, int rank, const std::string& t) {
    transport::ShmLayout l = transport::selectShm(hosts, rank, t);
    return py::make_tuple(l.members, l.slicePeers, l.reason);
  }, py::arg("hosts"), py::arg("rank"), py::arg("transport") = "auto",
     "(ranks sharing memory with `rank`, its hierarchical ring peers, why) from every rank's "
     "host identity and RINGREDUCE_TRANSPORT: what a new communicator uses");
  m.def("shm_capacity", &transport::shm::capacityBytes, "size of /dev/shm in bytes (0: unknown)");
  m.def("choose_allreduce", [](int world, size_t bytes, const py::dict& opts) {
    return static_cast<int>(collectives::chooseAllreduce(bindings::optionsFromDict(opts), world, bytes));
  });
  m.def("predict_allreduce_cluster",
        [](const std::string& algo, int hosts, int local, size_t bytes, double alphaUs,
           double betaNsPerByte, double shmAlphaUs, double shmBetaNsPerByte) {
          collectives::ClusterModel m =
              clusterModel(hosts, local, alphaUs, betaNsPerByte, shmAlphaUs, shmBetaNsPerByte);
          using A = collectives::ModelAlgo;
          A a = algo == "ring" ? A::kRing : algo == "recursive_doubling" ? A::kRecursiveDoubling
              : algo == "binomial_tree" ? A::kBinomialTree : algo == "hier" ? A::kHier
              : throw InvalidArgument("algo: ring, recursive_doubling, binomial_tree or hier, not '" + algo + "'");
          return collectives::predictAllreduceCluster(m, a, bytes);
        },
        py::arg("algo"), py::arg("hosts"), py::arg("local"), py::arg("bytes"),
        py::arg("alpha_us"), py::arg("beta_ns_per_byte"), py::arg("shm_alpha_us") = kShmAlphaUs,
        py::arg("shm_beta_ns_per_byte") = kShmBetaNsPerByte,
        "Predicted all-reduce seconds on hosts x local ranks (collectives/cost_model.cc).");
  m.def("pick_allreduce_cluster",
        [](int hosts, int local, size_t bytes, double alphaUs, double betaNsPerByte,
           double shmAlphaUs, double shmBetaNsPerByte) {
          using A = collectives::ModelAlgo;
          A a = collectives::pickAllreduceCluster(
              clusterModel(hosts, local, alphaUs, betaNsPerByte, shmAlphaUs, shmBetaNsPerByte),
              bytes);
          return std::string(a == A::kRing ? "ring" : a == A::kHier ? "hier" : "recursive_doubling");
        },
        py::arg("hosts"), py::arg("local"), py::arg("bytes"), py::arg("alpha_us"),
        py::arg("beta_ns_per_byte"), py::arg("shm_alpha_us") = kShmAlphaUs,
        py::arg("shm_beta_ns_per_byte") = kShmBetaNsPerByte,
        "What the planner picks for 'auto' on hosts x local ranks (collectives/planner.cc): "
        "ring, recursive_doubling or hier.");
  m.def("_p2p_families", &runtime::Executor::familyCounts,
        "(families, channels) of point-to-point channels alive in this process (tests)");
  m.def("overlay_peers", &transport::tcp::overlayPeers, py::arg("rank"), py::arg("world"),
        "Peers a rank connects and watches at init above RINGREDUCE_FULL_MESH_MAX ranks.");
  m.def("predict_allreduce", [](int algo, int world, size_t bytes, const py::dict& opts) {
    return collectives::predictAllreduce(bindings::optionsFromDict(opts), static_cast<Algorithm>(algo),
                                         world, bytes);
  });

  py::class_<PyListener>(m, "Listener")
      .def(py::init<const std::string&>(), py::arg("host"))
      .def_property_readonly("port", [](PyListener& l) { return l.tcp.port(); })
      .def_property_readonly("heartbeat_port", [](PyListener& l) { return l.hb ? l.hb->port() : 0; })
      .def_property_readonly("host", [](PyListener& l) { return l.tcp.host(); })
      .def("close", [](PyListener& l) { l.tcp.close(); l.hb.reset(); });

  py::class_<transport::tcp::LinkTable, std::shared_ptr<transport::tcp::LinkTable>>(
      m, "LinkTable", "This process's connections to its job's other processes that groups "
      "share (unless RINGREDUCE_GROUP_LINKS=0); the world owns it")
      .def(py::init<>())
      .def("__len__", &transport::tcp::LinkTable::size)
      .def("ids", &transport::tcp::LinkTable::ids, py::arg("world_ranks"),
           "per world rank, the id of the link to its process set-ups publish (0: none)")
      .def("close", &transport::tcp::LinkTable::close, py::arg("seconds"),
           py::call_guard<py::gil_scoped_release>());

  py::class_<runtime::Work, std::shared_ptr<runtime::Work>>(m, "Work")
      .def("wait",
           [](runtime::Work& w, py::object timeout) {
             double t = timeout.is_none() ? -1.0 : timeout.cast<double>();
             py::gil_scoped_release nogil;
             return w.wait(t);
           },
           py::arg("timeout") = py::none())
      .def("is_completed", &runtime::Work::isCompleted)
      .def_property_readonly("what", &runtime::Work::what);
  m.def("ring_completion_bell", &runtime::ringCompletionBell,
        "wake completion_bell's waiters (a Work stand-in of Python's completed)");
  m.def("completion_bell", &runtime::completionBell, "rings of the completion bell so far");
  m.def("await_completion_bell", &runtime::awaitCompletionBell, py::arg("seen"),
        py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "wait until the bell's count differs from `seen` (a Work completed) or `timeout` s");

  py::class_<PyComm>(m, "Communicator")
      .def(py::init<int, int, PyListener&, const std::vector<std::string>&, const std::string&,
                    const py::dict&, const std::vector<std::string>&, const py::object&,
                    const py::object&, std::shared_ptr<transport::tcp::LinkTable>, uint64_t,
                    const std::vector<uint64_t>&>(),
           py::arg("rank"), py::arg("world"), py::arg("listener"), py::arg("addrs"),
           py::arg("secret"), py::arg("options"), py::arg("heartbeat_addrs") = std::vector<std::string>(),
           py::arg("shm_store") = py::none(), py::arg("probe") = py::none(),
           py::arg("links") = nullptr, py::arg("stream_id") = 0,
           py::arg("link_ids") = std::vector<uint64_t>())
      .def_property_readonly("rank", [](PyComm& c) { return c.ex().comm().rank(); })
      .def_property_readonly("world", [](PyComm& c) { return c.ex().comm().world(); })
      .def("plan_of",
           [](PyComm& c, const std::string& kind, size_t bytes, int algo) {
             using namespace collectives;
             std::shared_ptr<runtime::Executor> e = c.held();
             Communicator& cm = e->comm();
             QuietPlans quiet;
             Algorithm a;
             if (kind == "allreduce") a = planAllreduce(cm, static_cast<Algorithm>(algo), bytes);
             else if (kind == "broadcast") a = planBroadcast(cm, bytes);
             else if (kind == "barrier") a = planBarrier(cm);
             else if (kind == "reduce") a = planReduce(cm, bytes);
             else if (kind == "gather") a = planDirect(cm, CollectiveKind::kGather, bytes);
             else if (kind == "scatter") a = planDirect(cm, CollectiveKind::kScatter, bytes);
             else if (kind == "alltoall") a = planDirect(cm, CollectiveKind::kAllToAll, bytes);
             else if (kind == "allgather")  // bytes: the whole output, as the bench counts it
               a = planGatherAll(cm, CollectiveKind::kAllGather, bytes, bytes / static_cast<size_t>(cm.world()));
             else if (kind == "reduce_scatter")  // bytes: the whole input
               a = planGatherAll(cm, CollectiveKind::kReduceScatter, bytes, bytes);
             else throw InvalidArgument("plan: unknown collective '" + kind + "'");
             return std::string(toString(a));
           },
           py::arg("kind"), py::arg("bytes"), py::arg("algo") = 0,
           "What the planner (collectives/planner.cc) runs for this collective and size: "
           "'shm', 'ring', 'tree', 'hier' or 'auto' (direct / pairwise); nothing is logged")
      .def("probe_peers", [](PyComm& c, const std::vector<int>& waitedFor, bool anyOf) {
             std::shared_ptr<runtime::Executor> e = c.held();
             py::gil_scoped_release nogil;
             e->probeIdle(waitedFor, anyOf);
           },
           py::arg("waited_for") = std::vector<int>(), py::arg("any_of") = false,
           "Raise PeerFailure if a peer is known to be gone (between collectives only); a "
           "peer of waited_for that left the job (said goodbye) counts as gone -- unless "
           "any_of (a receive from any of them), which asks unwatched ones for heartbeats")
      .def("peer_context", [](PyComm& c, int peer) {
             std::shared_ptr<runtime::Executor> e = c.held();
             py::gil_scoped_release nogil;
             return e->tryBetween(
                 [peer](comm::Communicator& cm) { return cm.peerContext(peer); }, std::string());
           },
           py::arg("peer"),
           "'; rank 3 (pid 42) was last heard 0.2 s earlier, in allreduce #7 ...' from its "
           "heartbeats (a stall report's words), or '' if not heard -- or while a collective "
           "runs (never waits for one)")
      .def("incoming", [](PyComm& c, int peer) { return c.ex().incomingIdle(peer); },
           py::arg("peer"),
           "True when `peer` has started a collective this rank has not (a message waits) or "
           "its connection has news, and nothing runs here; never blocks")
      .def("allreduce",
           [](PyComm& c, uintptr_t ptr, size_t count, int dtype, int op, int algo, bool async) {
             auto fn = [=](comm::Communicator& cm) {
               collectives::allreduce(cm, reinterpret_cast<void*>(ptr), count,
                                      static_cast<DataType>(dtype), static_cast<ReduceOp>(op),
                                      static_cast<Algorithm>(algo));
             };
             return c.run(fn, "allreduce", async);
           })
      .def("allreduce_coalesced",
           [](PyComm& c, const std::vector<uintptr_t>& ptrs, const std::vector<size_t>& counts,
              int dtype, int op, int algo, bool async) {
             if (ptrs.size() != counts.size())
               throw py::value_error("allreduce_coalesced: one count per pointer");
             std::vector<collectives::Piece> pieces;
             for (size_t i = 0; i < ptrs.size(); ++i)
               pieces.push_back({reinterpret_cast<void*>(ptrs[i]), counts[i]});
             auto fn = [pieces = std::move(pieces), dtype, op, algo](comm::Communicator& cm) {
               collectives::allreduceCoalesced(cm, pieces, static_cast<DataType>(dtype),
                                               static_cast<ReduceOp>(op),
                                               static_cast<Algorithm>(algo));
             };
             return c.run(fn, "allreduce", async);
           })
      .def("allreduce_fast",
           // Synchronous all-reduce of a numpy array with every check done here: the small-
           // message path without Python-side attribute lookups. Returns False (nothing
           // done) when the array needs the general path, which also produces the errors.
           [](PyComm& c, py::handle obj, int op, int algo) {
             if (!py::isinstance<py::array>(obj)) return false;
             auto a = py::reinterpret_borrow<py::array>(obj);
             int code = bindings::numpyDtypeCode(a.dtype());
             if (code < 0 || !(a.flags() & py::array::c_style) || !a.writeable()) return false;
             void* ptr = a.mutable_data();
             size_t count = static_cast<size_t>(a.size());
             auto fn = [=](comm::Communicator& cm) {
               collectives::allreduce(cm, ptr, count, static_cast<DataType>(code),
                                      static_cast<ReduceOp>(op), static_cast<Algorithm>(algo));
             };
             uint32_t site = bindings::currentCallSite();
             std::shared_ptr<runtime::Executor> e = c.held();
             py::gil_scoped_release nogil;
             e->runSync(fn, "allreduce", site);
             return true;
           })
      .def("broadcast",
           [](PyComm& c, uintptr_t ptr, size_t count, int dtype, int root, bool async) {
             auto fn = [=](comm::Communicator& cm) {
               collectives::broadcast(cm, reinterpret_cast<void*>(ptr), count,
                                      static_cast<DataType>(dtype), root);
             };
             return c.run(fn, "broadcast", async);
           })
      .def("barrier",
           [](PyComm& c, bool async) {
             return c.run([](comm::Communicator& cm) { collectives::barrier(cm); }, "barrier", async);
           })
      .def("allgather",
           [](PyComm& c, uintptr_t in, uintptr_t out, size_t count, int dtype, bool async) {
             auto fn = [=](comm::Communicator& cm) {
               collectives::allgather(cm, reinterpret_cast<const void*>(in),
                                      reinterpret_cast<void*>(out), count,
                                      static_cast<DataType>(dtype));
             };
             return c.run(fn, "allgather", async);
           })
      .def("reduce_scatter",
           [](PyComm& c, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, bool async) {
             auto fn = [=](comm::Communicator& cm) {
               collectives::reduceScatter(cm, reinterpret_cast<const void*>(in),
                                          reinterpret_cast<void*>(out), count,
                                          static_cast<DataType>(dtype), static_cast<ReduceOp>(op));
             };
             return c.run(fn, "reduce_scatter", async);
           })
      .def("reduce",
           [](PyComm& c, uintptr_t ptr, size_t count, int dtype, int op, int root, bool async) {
             auto fn = [=](comm::Communicator& cm) {
               collectives::reduce(cm, reinterpret_cast<void*>(ptr), count,
                                   static_cast<DataType>(dtype), static_cast<ReduceOp>(op), root);
             };
             return c.run(fn, "reduce", async);
           })
      .def("gather",
           [](PyComm& c, uintptr_t in, uintptr_t out, size_t count, int dtype, int root,
              bool async) {
             auto fn = [=](comm::Communicator& cm) {
               collectives::gather(cm, reinterpret_cast<const void*>(in),
                                   reinterpret_cast<void*>(out), count,
                                   static_cast<DataType>(dtype), root);
             };
             return c.run(fn, "gather", async);
           })
      .def("scatter",
           [](PyComm& c, uintptr_t in, uintptr_t out, size_t count, int dtype, int root,
              bool async) {
             auto fn = [=](comm::Communicator& cm) {
               collectives::scatter(cm, reinterpret_cast<const void*>(in),
                                    reinterpret_cast<void*>(out), count,
                                    static_cast<DataType>(dtype), root);
             };
             return c.run(fn, "scatter", async);
           })
      .def("alltoall",
           // Counts and offsets in elements, one per rank (copied: the call may be async).
           [](PyComm& c, uintptr_t in, std::vector<size_t> sc, std::vector<size_t> so,
              uintptr_t out, std::vector<size_t> rc, std::vector<size_t> ro, int dtype,
              bool async) {
             const size_t n = static_cast<size_t>(c.ex().comm().world());
             if (sc.size() != n || so.size() != n || rc.size() != n || ro.size() != n)
               throw InvalidArgument("alltoall: counts and offsets need one entry per rank");
             auto fn = [=](comm::Communicator& cm) {
               collectives::alltoall(cm, reinterpret_cast<const void*>(in), sc.data(), so.data(),
                                     reinterpret_cast<void*>(out), rc.data(), ro.data(),
                                     static_cast<DataType>(dtype));
             };
             return c.run(fn, "alltoall", async);
           })
      .def("native_handle", [](PyComm& c) { return bindings::nativeHandle(c.held()); },
           "Opaque handle for the C entry points of _C.NATIVE_API (torch_adapter/native_api.h)")
      .def("abort", [](PyComm& c) { if (c.exec_) c.exec_->abort(); })
      // The collectives begun from now on wait at most `seconds` (torch's setTimeout).
      .def("set_timeout", [](PyComm& c, double seconds) { c.ex().comm().setTimeout(seconds); })
      // Fail this communicator for a failure elsewhere in this process, naming world rank
      // `culprit` (a point-to-point channel that could not be made: its siblings fail too).
      .def("fail_from",
           [](PyComm& c, const std::string& why, int culprit) {
             if (c.exec_) c.exec_->failFrom(why, transport::Culprit{culprit, PeerCause::kAborted, true});
           })
      .def("destroy", &PyComm::destroy)
      .def("forget_after_fork", &PyComm::forgetAfterFork)
      // After destroy(): whether the communicator had failed or been aborted (then peers
      // may be gone, and destroy's farewell through the store waits less for them).
      .def_property_readonly("failed_at_destroy", [](PyComm& c) { return c.failedAtDestroy_; })
      // After destroy(): the rank (of this communicator) it found dead or frozen, or that its
      // farewell found ended without a word (Communicator::unsaidPeer), or -1.
      .def_property_readonly("lost_peer_at_destroy", [](PyComm& c) { return c.lostPeer_; })
      .def_property_readonly("destroyed", [](PyComm& c) { return !c.exec_; })
      .def("set_tracing", [](PyComm& c, bool on) { c.ex().comm().recorder().setTracing(on); })
      .def("set_flight_path", [](PyComm& c, const std::string& p) { c.ex().comm().setFlightPath(p); })
      .def("set_fault",
           // Fault injection (RINGREDUCE_FAULT; see comm/fault.h). Before any collective.
           // `fire`: ringreduce._fault.FIRE, the hook that carries the action out.
           [](PyComm& c, int kind, uint64_t seq, const std::string& point,
              const std::string& action, const std::string& stamp, const py::capsule& fire) {
             if (fire.name() == nullptr || std::string(fire.name()) != comm::kFireCapsule)
               throw InvalidArgument("set_fault: `fire` must be ringreduce._fault.FIRE");
             comm::FaultPlan f;
             f.fire = reinterpret_cast<comm::FaultPlan::Fire>(fire.get_pointer());
             f.kind = static_cast<uint8_t>(kind);
             f.seq = seq;
             f.point = comm::faultPointFromString(point);
             f.action = comm::faultActionFromString(action);
             f.stampPath = stamp;
             c.ex().comm().setFault(std::move(f));
           },
           py::arg("kind"), py::arg("seq"), py::arg("point"), py::arg("action"),
           py::arg("stamp"), py::arg("fire"))
      .def("trace_events", [](PyComm& c) {
        // Called after the collectives of interest finished (destroy, or a quiet moment).
        py::list out;
        for (const comm::Record& r : c.ex().comm().recorder().trace()) {
          py::dict d;
          d["seq"] = r.seq;
          d["collective"] = toString(static_cast<CollectiveKind>(r.kind));
          d["algo"] = toString(static_cast<Algorithm>(r.algo));
          d["dtype"] = toString(static_cast<DataType>(r.dtype));
          d["op"] = toString(static_cast<ReduceOp>(r.op));
          d["root"] = r.root;
          d["count"] = r.count;
          d["bytes"] = r.bytes;
          d["start_us"] = r.startUs;
          d["end_us"] = r.endUs;
          d["ok"] = r.ok;
          out.append(d);
        }
        return out;
      })
      .def("cma_bytes",
           // Bytes this rank read from local peers with process_vm_readv (transport/shm/cma.h).
           [](PyComm& c) {
             auto* d = c.ex().comm().shm();
             return d ? d->cmaBytes() : uint64_t{0};
           })
      .def("cma_readable",
           // Whether this rank may read every local peer's memory (probed once; cma.h).
           [](PyComm& c) {
             auto* d = c.ex().comm().shm();
             return d != nullptr && d->cmaReadable();
           })
      .def("bytes_sent",
           // Payload bytes sent over TCP by this rank so far (comm/communicator.h).
           [](PyComm& c) { return c.ex().comm().payloadBytesSent(); })
      .def("link_stats",
           // What this rank keeps open to its peers: TCP connections, heartbeat targets and
           // datagrams sent so far (bench/scaling.py divides by time).
           [](PyComm& c) {
             std::shared_ptr<runtime::Executor> e = c.held();
             // Between collectives: a lazy connect changes the table under a reader.
             std::array<long long, 6> v{};
             {
               py::gil_scoped_release nogil;
               v = e->between([](comm::Communicator& cm) {
                 const transport::Heartbeat* hb = cm.heartbeat();
                 int watched = 0;
                 for (int p = 0; p < cm.world(); ++p) watched += p != cm.rank() && cm.watched(p);
                 return std::array<long long, 6>{
                     cm.openConnections(), hb ? hb->targets() : 0,
                     hb ? static_cast<long long>(hb->sent()) : 0, watched,
                     cm.watchedProcesses(),  // pidfds (socketless groups)
                     hb ? static_cast<long long>(hb->skipped()) : 0};
               });
             }
             py::dict d;
             d["connections"] = v[0];
             d["heartbeat_targets"] = v[1];
             d["heartbeat_sent"] = v[2];
             d["watched"] = v[3];
             d["processes_watched"] = v[4];
             d["heartbeat_skipped"] = v[5];  // idle: the world's heartbeat spoke for it
             return d;
           })
      .def_property_readonly("uses_shm", [](PyComm& c) { return c.ex().comm().shm() != nullptr; })
      .def_property_readonly("plan", [](PyComm& c) {
        auto& cm = c.ex().comm();
        if (!cm.shm()) return std::string("tcp");
        return std::string(cm.shmAll() ? "shm" : "hier");
      });
}
