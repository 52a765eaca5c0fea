// Which line of the user's program issued a collective: the innermost Python frame outside
// the skipped directories (ringreduce itself, torch), as "file.py:LINE" interned to a
// comm/site.h id. Cached per (code object, instruction): a hit costs a few pointer walks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rr::bindings {

// Frames whose file name starts with one of these are skipped. GIL held.
void setCallSiteSkip(const std::vector<std::string>& prefixes);
// RINGREDUCE_CALL_SITES=0 turns the lookup off (every site is then 0). GIL held.
void setCallSitesEnabled(bool on);
// The current call site id (0 = unknown or disabled). GIL held.
uint32_t currentCallSite();
// A helper thread issuing calls for the user's thread (ringreduce/p2p.py) reports that
// thread's call site (an id from currentCallSite) instead of its own frames; 0 unpins.
void pinCallSite(uint32_t id);

}  // namespace rr::bindings
