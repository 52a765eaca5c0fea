#include "nccl/loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <memory>
#include <mutex>

namespace rr::nccl {
namespace {

constexpr const char* kSoname = "libnccl.so.2";

std::mutex gMu;
std::unique_ptr<Library> gLib;  // set once, never freed (NCCL is never unloaded)

bool isDirectory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

template <class Fn>
bool resolve(void* h, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(::dlsym(h, name));
  return out != nullptr;
}

// Resolves every entry point; returns the missing required symbol's name, or "".
std::string resolveAll(void* h, Library& lib) {
#define RR_REQUIRE(field, sym) \
  if (!resolve(h, sym, lib.field)) return sym;
  RR_REQUIRE(getVersion, "ncclGetVersion")
  RR_REQUIRE(getUniqueId, "ncclGetUniqueId")
  RR_REQUIRE(commInitRank, "ncclCommInitRank")
  RR_REQUIRE(allReduce, "ncclAllReduce")
  RR_REQUIRE(broadcast, "ncclBroadcast")
  RR_REQUIRE(allGather, "ncclAllGather")
  RR_REQUIRE(reduceScatter, "ncclReduceScatter")
  RR_REQUIRE(commGetAsyncError, "ncclCommGetAsyncError")
  RR_REQUIRE(commAbort, "ncclCommAbort")
  RR_REQUIRE(commDestroy, "ncclCommDestroy")
  RR_REQUIRE(getErrorString, "ncclGetErrorString")
  RR_REQUIRE(groupStart, "ncclGroupStart")
  RR_REQUIRE(groupEnd, "ncclGroupEnd")
#undef RR_REQUIRE
  resolve(h, "ncclCommInitRankConfig", lib.commInitRankConfig);
  resolve(h, "ncclCommFinalize", lib.commFinalize);
  resolve(h, "ncclGetLastError", lib.getLastError);
  return "";
}

}  // namespace

std::string versionString(int code) {
  int major, minor, patch;
  if (code >= 10000) {  // NCCL_VERSION(X, Y, Z) = X*10000 + Y*100 + Z since 2.9
    major = code / 10000;
    minor = (code % 10000) / 100;
    patch = code % 100;
  } else {  // X*1000 + Y*100 + Z before
    major = code / 1000;
    minor = (code % 1000) / 100;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

const char* resultName(abi::Result r) {
  switch (r) {
    case abi::kSuccess: return "ncclSuccess";
    case abi::kUnhandledCudaError: return "ncclUnhandledCudaError";
    case abi::kSystemError: return "ncclSystemError";
    case abi::kInternalError: return "ncclInternalError";
    case abi::kInvalidArgument: return "ncclInvalidArgument";
    case abi::kInvalidUsage: return "ncclInvalidUsage";
    case abi::kRemoteError: return "ncclRemoteError";
    case abi::kInProgress: return "ncclInProgress";
  }
  return "ncclResult(unknown)";
}

std::string Library::describe(abi::Result r, abi::Comm comm) const {
  std::string s = std::string(resultName(r)) + " (" + (getErrorString ? getErrorString(r) : "?") + ")";
  if (getLastError) {
    const char* last = getLastError(comm);
    if (last && *last) s += ": " + std::string(last);
  }
  if (r == abi::kRemoteError || r == abi::kSystemError) {
    s += "; a peer may have died or the network failed (NCCL_DEBUG=WARN shows details)";
  }
  return s;
}

void Library::check(abi::Result r, const char* what, abi::Comm comm) const {
  if (r == abi::kSuccess) return;
  throw NcclError(r, std::string(what) + " failed: " + describe(r, comm));
}

const Library* loaded() {
  std::lock_guard<std::mutex> g(gMu);
  return gLib.get();
}

const Library& load(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> g(gMu);
  if (gLib) return *gLib;
  std::string tried, errors;
  for (const std::string& cand : candidates) {
    if (cand.empty()) continue;
    const bool dir = isDirectory(cand);
    const bool bare = cand.find('/') == std::string::npos;
    const std::string path = dir ? cand + "/" + kSoname : cand;
    tried += (tried.empty() ? "" : ", ") +
             (bare ? cand + " on the system library path (LD_LIBRARY_PATH, ldconfig)"
                   : dir ? std::string(kSoname) + " in " + cand : cand);
    ::dlerror();
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = ::dlerror();
      errors += "\n  " + path + ": " + (e ? e : "dlopen failed");
      continue;
    }
    auto lib = std::make_unique<Library>();
    lib->path = path;
    const std::string missing = resolveAll(h, *lib);
    if (!missing.empty()) {
      errors += "\n  " + path + ": has no symbol " + missing + " (not NCCL, or NCCL too old)";
      ::dlclose(h);
      continue;
    }
    int code = 0;
    if (lib->getVersion(&code) != abi::kSuccess) {
      errors += "\n  " + path + ": ncclGetVersion failed";
      ::dlclose(h);
      continue;
    }
    lib->versionCode = code;
    lib->version = versionString(code);
    if (code < kMinVersionCode) {
      errors += "\n  " + path + ": NCCL " + lib->version +
                " is too old; ringreduce needs NCCL >= 2.10 (bfloat16, avg)";
      ::dlclose(h);
      continue;
    }
    lib->hasConfigInit = lib->commInitRankConfig != nullptr && code >= 21400;
    gLib = std::move(lib);
    return *gLib;
  }
  if (tried.empty()) tried = "(no candidates)";
  throw NcclUnavailable(
      "NCCL not found: tried " + tried + errors +
      "\ninstall it with `pip install nvidia-nccl-cu12` (or nvidia-nccl-cu13 for CUDA 13), or "
      "set RINGREDUCE_NCCL_PATH to libnccl.so.2 or the directory that holds it");
}

}  // namespace rr::nccl
