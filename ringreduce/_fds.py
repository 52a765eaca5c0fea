"""File descriptors: check, before a communicator connects, that this process may open
what it will need, and raise the soft limit (up to the hard one) when it is too low.

A communicator keeps about three descriptors per connected peer (TCP connection, shared
memory, their bookkeeping). Up to RINGREDUCE_FULL_MESH_MAX ranks every peer is connected
at init; above it only the O(log n) overlay is, and other peers on first use -- an
all_to_all may still end up connected to everyone, so that is what the limit is raised for.
The common default soft limit (1,024) is below what a 512-rank full mesh needs.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("ringreduce")

PER_PEER = 3  # descriptors per connected peer, measured (bench/scaling.json: fds vs n)
SLACK = 64    # the process's own files, sockets of the store, eventfds (what is advised)
MIN_SLACK = 24  # what a world needs beyond its peers' (listener, heartbeat, store, eventfds,
                # segments; measured 13-19 at 2-3 ranks): below it init is refused
GROUP_SLACK = 16  # a group's or channel's own: listener, heartbeat socket, eventfds, segments


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError as e:  # not one left to list them with: all are open
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if e.errno in (errno.EMFILE, errno.ENFILE) and soft > 0 else SLACK


def tcp_sockets() -> int:
    """This process's TCP sockets, listening or connected (its descriptors whose socket
    /proc/net/tcp or tcp6 lists): what a group's connections cost beyond descriptors."""
    inodes: set = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                inodes.update(line.split()[9] for line in f.readlines()[1:])
        except OSError:
            pass
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        n += target.startswith("socket:[") and target[8:-1] in inodes
    return n


def full_mesh(world: int, options: Mapping[str, Any]) -> bool:
    """Whether a communicator of `world` ranks connects (and watches) every pair at init: at
    most RINGREDUCE_FULL_MESH_MAX ranks (`options` without it: the tunable's default). Above
    it the communicator is sparse: each rank connects its overlay only."""
    most = options.get("full_mesh_max")
    if most is None:
        from ._env.tunables import Tunables

        most = Tunables().full_mesh_max
    return world <= max(int(most), 1)


def eager_peers(rank: int, world: int, options: Mapping[str, Any]) -> int:
    """Peers a communicator of `world` ranks connects at init (see full_mesh)."""
    if full_mesh(world, options):
        return world - 1
    from . import _C

    return len(_C.overlay_peers(rank, world))


def ensure(world: int, eager_peers: int, what: str = "init", slack: int = SLACK) -> None:
    """Make sure `eager_peers` connections fit now (else raise, saying how many are needed)
    and that connecting to all `world - 1` peers later fits (raise the soft limit to the
    hard one if needed; warn when even that is too low). `slack`: descriptors beyond the
    connections (a group or channel opens fewer than a world: GROUP_SLACK)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    now = open_fds()
    need_now = now + PER_PEER * eager_peers + slack
    need_all = now + PER_PEER * (world - 1) + slack
    need_min = now + PER_PEER * eager_peers + min(slack, MIN_SLACK)
    if soft != inf and soft < need_all:
        target = need_all if hard == inf else min(hard, max(need_all, soft))
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("%s: raised the open-file soft limit from %d to %d (%d ranks need about "
                     "%d)", what, soft, target, world, need_all)
            soft = target
    if soft != inf and soft < need_min:
        # (Refused at need_now, 64 spare, a user whose hard limit is 64 could not start 2
        # ranks needing 13-25 files, which gloo runs -- a helper.)
        raise RuntimeError(
            f"{what}: {world} ranks need at least {need_min} open files in this process "
            f"({now} open, {PER_PEER} per connected peer x {eager_peers} peers, "
            f"{need_min - now - PER_PEER * eager_peers} for the communicator; {need_now} "
            f"advised) but the limit is {soft} (hard limit {hard}); raise it before starting "
            f"the job (`ulimit -n {need_all}`, or LimitNOFILE= / `--ulimit nofile=` in "
            f"systemd / docker; every further group or point-to-point channel of {world} "
            f"ranks takes a few more -- 2-3 measured on one host, up to "
            f"{PER_PEER * eager_peers} where it connects its members itself)"
            + (", or lower RINGREDUCE_FULL_MESH_MAX so init connects fewer peers"
               if world > 16 else ""))
    if soft != inf and soft < need_now:
        log.warning("%s: open-file limit %d (hard %d) leaves %d descriptors beside the "
                    "connections: a further group, channel or file of the program may fail "
                    "with 'Too many open files'; raise `ulimit -n` to %d", what, soft, hard,
                    soft - now - PER_PEER * eager_peers, need_all)
    if soft != inf and soft < need_all:
        log.warning("%s: open-file limit %d (hard %d) covers %d peers, not all %d: a "
                    "collective that connects every pair (all_to_all) may fail with 'Too many "
                    "open files'; raise `ulimit -n` to %d", what, soft, hard,
                    (soft - now - slack) // PER_PEER, world - 1, need_all)
