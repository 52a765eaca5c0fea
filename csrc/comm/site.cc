#include "comm/site.h"

#include <mutex>
#include <unordered_map>
#include <vector>

namespace rr::comm {
namespace {

constexpr size_t kMaxSites = 4096;

struct Table {
  std::mutex mu;
  std::vector<std::string> names{""};  // id 0 = kNoSite
  std::unordered_map<std::string, uint32_t> ids;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: collectives may run during exit
  return *t;
}

}  // namespace

uint32_t internSite(const std::string& name) {
  if (name.empty()) return kNoSite;
  Table& t = table();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.ids.find(name);
  if (it != t.ids.end()) return it->second;
  if (t.names.size() >= kMaxSites) return kNoSite;
  auto id = static_cast<uint32_t>(t.names.size());
  t.names.push_back(name);
  t.ids.emplace(name, id);
  return id;
}

std::string siteName(uint32_t id) {
  Table& t = table();
  std::lock_guard<std::mutex> g(t.mu);
  return id < t.names.size() ? t.names[id] : std::string();
}

}  // namespace rr::comm
