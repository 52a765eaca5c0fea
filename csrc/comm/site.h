// Call sites: where in the user's program each collective was issued ("train.py:57"),
// interned once to a small id so a collective carries 4 bytes, not a string. Error
// messages, stall reports, heartbeats and the flight recorder name them.
#pragma once

#include <cstdint>
#include <string>

namespace rr::comm {

constexpr uint32_t kNoSite = 0;

// Id of `name` (the same id for the same name); kNoSite once the table is full (4096).
// Thread-safe.
uint32_t internSite(const std::string& name);
// The name of an id ("" for kNoSite or an unknown id). Thread-safe.
std::string siteName(uint32_t id);

}  // namespace rr::comm
