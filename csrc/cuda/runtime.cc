// runtime.h on top of runtime_api.cu (CUDA build) or as stubs that explain how to get CUDA
// (build without nvcc). This file is compiled by g++ in both builds; only the CUDA build
// defines RINGREDUCE_WITH_CUDA and links the raw calls.
#include "cuda/runtime.h"

#include <string>

#ifdef RINGREDUCE_WITH_CUDA
#include "cuda/launch.h"
#include "cuda/runtime_api.h"
#endif

namespace rr::cuda {
namespace {

constexpr const char* kNoCudaBuild =
    "CUDA is not available: ringreduce was built without CUDA (nvcc was not found at build time, or "
    "RINGREDUCE_CUDA=0); reinstall with nvcc on PATH (or CUDA_HOME set) and RINGREDUCE_CUDA=1, "
    "e.g. RINGREDUCE_CUDA=1 pip install --no-build-isolation .";

}  // namespace

#ifdef RINGREDUCE_WITH_CUDA

bool builtWithCuda() { return true; }

std::string compiledArchs() {
  // "800,900" -> "sm_80,sm_90"
  std::string in = kern::compiledArchs(), out, cur;
  auto flush = [&] {
    if (cur.empty()) return;
    if (!out.empty()) out += ",";
    out += "sm_" + (cur.size() > 1 ? cur.substr(0, cur.size() - 1) : cur);
    cur.clear();
  };
  for (char c : in) {
    if (c >= '0' && c <= '9') cur += c;
    else flush();
  }
  flush();
  return out;
}

int runtimeVersion() {
  int v = 0;
  raw::runtimeVersion(&v);
  return v;
}

std::string errorName(int code) {
  const char* s = raw::errorName(code);
  return s ? s : "cudaError(" + std::to_string(code) + ")";
}
std::string errorString(int code) {
  const char* s = raw::errorString(code);
  return s ? s : "unknown CUDA error";
}

void check(int code, const char* what) {
  if (code == raw::kSuccess) return;
  raw::getLastError();  // a non-sticky error must not resurface in the next call
  if (code == raw::kErrorNoDevice || code == raw::kErrorInsufficientDriver) {
    throw CudaUnavailable(detail::concat("no CUDA device: ", what, " failed with ",
                                         errorName(code), " (", errorString(code),
                                         "); check nvidia-smi and CUDA_VISIBLE_DEVICES"));
  }
  throw CudaError(code, detail::concat(what, " failed: ", errorName(code), ": ",
                                       errorString(code)));
}

DeviceStatus deviceStatus() {
  DeviceStatus s;
  raw::driverVersion(&s.driverVersion);  // 0 when no driver is installed
  int n = 0;
  const int e = raw::getDeviceCount(&n);
  if (e != raw::kSuccess) {
    raw::getLastError();
    s.count = 0;
    s.reason = detail::concat(
        "no CUDA device: cudaGetDeviceCount failed with ", errorName(e), " (", errorString(e),
        ")", s.driverVersion == 0 ? "; no NVIDIA driver was found (is libcuda.so.1 installed?)"
                                  : "",
        "; check nvidia-smi and CUDA_VISIBLE_DEVICES");
    return s;
  }
  s.count = n;
  if (n == 0) s.reason = "no CUDA device: the driver reports 0 devices (check CUDA_VISIBLE_DEVICES)";
  return s;
}

void requireDevice(int device) {
  DeviceStatus s = deviceStatus();
  if (s.count == 0) throw CudaUnavailable(s.reason);
  if (device < 0 || device >= s.count) {
    RR_THROW(CudaUnavailable, "no CUDA device ", device, ": this process sees ", s.count,
             " device(s) (0..", s.count - 1, "); pick a device index in range or check "
             "CUDA_VISIBLE_DEVICES and LOCAL_RANK");
  }
}

int currentDevice() {
  int d = 0;
  check(raw::getDevice(&d), "cudaGetDevice");
  return d;
}

void setDevice(int device) {
  requireDevice(device);
  check(raw::setDevice(device), "cudaSetDevice");
}

PointerInfo pointerInfo(const void* ptr) {
  PointerInfo info;
  int type = 0, dev = -1;
  const int e = raw::pointerAttributes(ptr, &type, &dev);
  if (e != raw::kSuccess) {
    raw::getLastError();
    // Older runtimes report plain host memory as cudaErrorInvalidValue: treat as host.
    return info;
  }
  info.device = type == 0 ? -1 : dev;
  info.isDevice = type == 2 || type == 3;
  info.isManaged = type == 3;
  info.isPinnedHost = type == 1;
  return info;
}

void* eventCreate() {
  void* e = nullptr;
  check(raw::eventCreate(&e), "cudaEventCreateWithFlags");
  return e;
}
void eventDestroy(void* event) noexcept {
  if (event) raw::eventDestroy(event);
}
void eventRecord(void* event, void* stream) {
  check(raw::eventRecord(event, stream), "cudaEventRecord");
}
bool eventDone(void* event) {
  const int e = raw::eventQuery(event);
  if (e == raw::kErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}
void streamWaitEvent(void* stream, void* event) {
  check(raw::streamWaitEvent(stream, event), "cudaStreamWaitEvent");
}
void streamSynchronize(void* stream) {
  check(raw::streamSynchronize(stream), "cudaStreamSynchronize");
}
void* deviceMalloc(size_t bytes) {
  void* p = nullptr;
  check(raw::malloc(&p, bytes), "cudaMalloc");
  return p;
}
void deviceFree(void* ptr) noexcept {
  if (ptr) raw::free(ptr);
}
void* hostAllocPinned(size_t bytes) {
  void* p = nullptr;
  check(raw::hostAlloc(&p, bytes), "cudaHostAlloc");
  return p;
}
void hostFreePinned(void* ptr) noexcept {
  if (ptr) raw::freeHost(ptr);
}
void memcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  check(raw::memcpyAsync(dst, src, bytes, stream), "cudaMemcpyAsync");
}
void memsetAsync(void* dst, int value, size_t bytes, void* stream) {
  if (bytes == 0) return;
  check(raw::memsetAsync(dst, value, bytes, stream), "cudaMemsetAsync");
}

#else  // !RINGREDUCE_WITH_CUDA

bool builtWithCuda() { return false; }
std::string compiledArchs() { return ""; }
int runtimeVersion() { return 0; }
std::string errorName(int) { return ""; }
std::string errorString(int) { return ""; }

DeviceStatus deviceStatus() {
  DeviceStatus s;
  s.reason = kNoCudaBuild;
  return s;
}

[[noreturn]] static void unavailable() { throw CudaUnavailable(kNoCudaBuild); }

void check(int code, const char*) {
  if (code != 0) unavailable();
}
void requireDevice(int) { unavailable(); }
int currentDevice() { unavailable(); }
void setDevice(int) { unavailable(); }
PointerInfo pointerInfo(const void*) { unavailable(); }
void* eventCreate() { unavailable(); }
void eventDestroy(void*) noexcept {}
void eventRecord(void*, void*) { unavailable(); }
bool eventDone(void*) { unavailable(); }
void streamWaitEvent(void*, void*) { unavailable(); }
void streamSynchronize(void*) { unavailable(); }
void* deviceMalloc(size_t) { unavailable(); }
void deviceFree(void*) noexcept {}
void* hostAllocPinned(size_t) { unavailable(); }
void hostFreePinned(void*) noexcept {}
void memcpyAsync(void*, const void*, size_t, void*) { unavailable(); }
void memsetAsync(void*, int, size_t, void*) { unavailable(); }

#endif

}  // namespace rr::cuda
