// Raw CUDA runtime calls with plain types, defined in runtime_api.cu (CUDA build only) and
// wrapped by runtime.cc. Each returns the cudaError_t as an int (0 = success). Internal to
// csrc/cuda: everything else uses runtime.h.
#pragma once

#include <cstddef>

namespace rr::cuda::raw {

constexpr int kSuccess = 0;
constexpr int kErrorNotReady = 600;  // cudaErrorNotReady (values checked in runtime_api.cu)
constexpr int kErrorInsufficientDriver = 35;  // no driver, or one older than this runtime
constexpr int kErrorNoDevice = 100;

int getDeviceCount(int* count);
int driverVersion(int* version);
int runtimeVersion(int* version);
int getDevice(int* device);
int setDevice(int device);
// memoryType: 0 unregistered host, 1 pinned host, 2 device, 3 managed (cudaMemoryType).
int pointerAttributes(const void* ptr, int* memoryType, int* device);
int eventCreate(void** event);
int eventDestroy(void* event);
int eventRecord(void* event, void* stream);
int eventQuery(void* event);
int streamWaitEvent(void* stream, void* event);
int streamSynchronize(void* stream);
int malloc(void** ptr, size_t bytes);
int free(void* ptr);
int hostAlloc(void** ptr, size_t bytes);
int freeHost(void* ptr);
int memcpyAsync(void* dst, const void* src, size_t bytes, void* stream);
int memsetAsync(void* dst, int value, size_t bytes, void* stream);
// Clears the calling thread's last error (after a failed call that is not sticky).
int getLastError();
const char* errorName(int code);
const char* errorString(int code);

}  // namespace rr::cuda::raw
