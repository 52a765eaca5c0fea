// The raw CUDA runtime calls behind runtime.h, compiled by nvcc only. Nothing here runs at
// load time: the statically linked runtime initialises itself (and dlopens the driver) on
// the first call.
#include <cuda_runtime.h>

#include "cuda/runtime_api.h"

namespace rr::cuda::raw {

static_assert(kSuccess == cudaSuccess, "cudaSuccess changed");
static_assert(kErrorNotReady == cudaErrorNotReady, "cudaErrorNotReady changed");
static_assert(kErrorInsufficientDriver == cudaErrorInsufficientDriver, "code changed");
static_assert(kErrorNoDevice == cudaErrorNoDevice, "cudaErrorNoDevice changed");
static_assert(cudaMemoryTypeUnregistered == 0 && cudaMemoryTypeHost == 1 &&
                  cudaMemoryTypeDevice == 2 && cudaMemoryTypeManaged == 3,
              "cudaMemoryType values changed");

int getDeviceCount(int* count) { return cudaGetDeviceCount(count); }
int driverVersion(int* version) { return cudaDriverGetVersion(version); }
int runtimeVersion(int* version) { return cudaRuntimeGetVersion(version); }
int getDevice(int* device) { return cudaGetDevice(device); }
int setDevice(int device) { return cudaSetDevice(device); }

int pointerAttributes(const void* ptr, int* memoryType, int* device) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e != cudaSuccess) return e;
  *memoryType = static_cast<int>(a.type);
  *device = a.device;
  return 0;
}

int eventCreate(void** event) {
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  *event = e;
  return r;
}
int eventDestroy(void* event) { return cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
int eventRecord(void* event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
}
int eventQuery(void* event) { return cudaEventQuery(static_cast<cudaEvent_t>(event)); }
int streamWaitEvent(void* stream, void* event) {
  return cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event),
                             0);
}
int streamSynchronize(void* stream) {
  return cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
}
int malloc(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
int free(void* ptr) { return cudaFree(ptr); }
int hostAlloc(void** ptr, size_t bytes) {
  return cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
}
int freeHost(void* ptr) { return cudaFreeHost(ptr); }
int memcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
}
int memsetAsync(void* dst, int value, size_t bytes, void* stream) {
  return cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream));
}
int getLastError() { return cudaGetLastError(); }
const char* errorName(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }
const char* errorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace rr::cuda::raw
