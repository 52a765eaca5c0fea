// Options of a communicator from Python, and the table of tunables Python reads.
#pragma once

#include <pybind11/pybind11.h>

#include "core/params.h"

namespace rr::bindings {

// Options from a dict of tunables (keys as in core/tunables.def) and the derived entries
// Python adds (alpha_us, spin_us, rank_labels, ...); shm_* and session entries are read
// elsewhere. Unknown keys and out-of-range values raise InvalidArgument.
Options optionsFromDict(const pybind11::dict& d);

// _C.TUNABLES: one dict per row of core/tunables.def (name, env, default, parse, shown,
// doc, core) -- what ringreduce/_env/tunables.py declares its Tunables from.
void registerTunables(pybind11::module_& m);

}  // namespace rr::bindings
