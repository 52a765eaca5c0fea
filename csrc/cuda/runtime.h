// The CUDA runtime as the rest of the library sees it: a few throwing wrappers with plain
// types (a stream or event is a void*), so no file outside csrc/cuda/*.cu includes a CUDA
// header and a build without nvcc still compiles and links.
//
// Built with CUDA (RINGREDUCE_WITH_CUDA, set by setup.py when nvcc compiled runtime.cu and
// reduce_kernels.cu): the wrappers call the statically linked CUDA runtime, which loads the
// driver (libcuda.so.1) lazily on the first call -- importing ringreduce._C never touches
// the driver, so a CUDA build imports and runs CPU collectives on a machine without a GPU.
// Built without CUDA: deviceStatus() reports that, and every other call throws
// CudaUnavailable saying how to get a CUDA build.
//
// Thread safety: the CUDA runtime is thread-safe; so are these wrappers.
#pragma once

#include <cstddef>
#include <string>

#include "core/error.h"

namespace rr::cuda {

// A CUDA call failed; the message names the call and CUDA's error name and text.
class CudaError : public Error {
 public:
  CudaError(int code, const std::string& what) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// No usable CUDA: a build without nvcc, no driver, or no device. Says what to do.
class CudaUnavailable : public Error {
 public:
  using Error::Error;
};

// True when this extension was compiled with nvcc (the CUDA kernels are in it).
bool builtWithCuda();
// "sm_80,sm_90" style list of the architectures compiled in ("" without CUDA).
std::string compiledArchs();
// CUDA runtime version this build was compiled against (e.g. 13000), 0 without CUDA.
int runtimeVersion();

struct DeviceStatus {
  int count = 0;       // usable devices (0 when anything is missing)
  int driverVersion = 0;
  std::string reason;  // why count is 0, with what to do; empty when count > 0
};
// Never throws; the first call may load the driver (slow, once).
DeviceStatus deviceStatus();

// Throws CudaUnavailable ("no CUDA device ...") unless `device` exists.
void requireDevice(int device);
int currentDevice();
void setDevice(int device);

// Device index owning `ptr`, or -1 for host memory CUDA does not know (pageable memory).
// Managed and pinned host memory report the device they were registered with.
struct PointerInfo {
  int device = -1;
  bool isDevice = false;   // device or managed memory: a kernel may read it
  bool isManaged = false;
  bool isPinnedHost = false;
};
PointerInfo pointerInfo(const void* ptr);

// Events (created without timing) and streams; all throw CudaError on failure.
void* eventCreate();
void eventDestroy(void* event) noexcept;
void eventRecord(void* event, void* stream);
// True once all work captured by the event finished; throws if that work failed.
bool eventDone(void* event);
void streamWaitEvent(void* stream, void* event);
void streamSynchronize(void* stream);

void* deviceMalloc(size_t bytes);
void deviceFree(void* ptr) noexcept;
void* hostAllocPinned(size_t bytes);
void hostFreePinned(void* ptr) noexcept;
// cudaMemcpyAsync with cudaMemcpyDefault (unified addressing decides the direction).
void memcpyAsync(void* dst, const void* src, size_t bytes, void* stream);
void memsetAsync(void* dst, int value, size_t bytes, void* stream);

// Throws CudaError for a nonzero cudaError_t code returned by a raw launcher.
void check(int code, const char* what);
// cudaGetErrorName / cudaGetErrorString of a code ("" without CUDA).
std::string errorName(int code);
std::string errorString(int code);

}  // namespace rr::cuda
