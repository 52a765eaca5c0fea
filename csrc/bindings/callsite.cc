#include "bindings/callsite.h"

#include <Python.h>
#include <frameobject.h>

#include <cstring>
#include <unordered_map>

#include "comm/site.h"

namespace rr::bindings {
namespace {

constexpr uint32_t kSkip = UINT32_MAX;   // cache value: frame in a skipped directory
constexpr size_t kMaxCache = 1 << 16;    // (code, line) pairs remembered
constexpr int kMaxDepth = 64;            // frames walked at most

// A frame's position is (code object, last instruction): cheap to read, unlike the line
// number (a walk of the line table), which is computed only on a cache miss.
struct Key {
  const void* code;
  int lasti;
  bool operator==(const Key& o) const { return code == o.code && lasti == o.lasti; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.code) * 31u + static_cast<size_t>(k.lasti);
  }
};

int lastInstruction(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return f->f_lasti;
#endif
}

bool g_enabled = true;
std::vector<std::string> g_skip;
// Cached code objects are kept alive (one reference each) so an address is never reused.
std::unordered_map<Key, uint32_t, KeyHash> g_cache;

uint32_t classify(PyCodeObject* code, int line) {
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (!file) {
    PyErr_Clear();
    return comm::kNoSite;
  }
  for (const std::string& p : g_skip)
    if (std::strncmp(file, p.data(), p.size()) == 0) return kSkip;
  const char* base = std::strrchr(file, '/');
  return comm::internSite(std::string(base ? base + 1 : file) + ":" + std::to_string(line));
}

}  // namespace

void setCallSiteSkip(const std::vector<std::string>& prefixes) {
  g_skip = prefixes;
  for (auto& kv : g_cache) Py_DECREF(reinterpret_cast<PyObject*>(const_cast<void*>(kv.first.code)));
  g_cache.clear();
}

void setCallSitesEnabled(bool on) { g_enabled = on; }

namespace {
thread_local uint32_t tPinned = comm::kNoSite;
}  // namespace

void pinCallSite(uint32_t id) { tPinned = id; }

uint32_t currentCallSite() {
  if (!g_enabled) return comm::kNoSite;
  if (tPinned != comm::kNoSite) return tPinned;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  uint32_t id = comm::kNoSite;
  for (int depth = 0; f && depth < kMaxDepth; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    Key k{code, lastInstruction(f)};
    uint32_t v;
    auto it = g_cache.find(k);
    if (it != g_cache.end()) {
      v = it->second;
    } else {
      v = classify(code, PyFrame_GetLineNumber(f));
      if (g_cache.size() < kMaxCache) {
        Py_INCREF(code);
        g_cache.emplace(k, v);
      }
    }
    Py_DECREF(code);
    if (v != kSkip) {
      id = v;
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference (or null)
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return id;
}

}  // namespace rr::bindings
