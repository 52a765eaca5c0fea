"""The kernel's floor for bench/rooted.py's TCP rows: the same bytes over plain sockets,
nothing else -- no headers, checks, pipelining or library. What no TCP implementation on
this machine can beat by much, so a bar above gloo / floor cannot be met here.

scatter: the root sends rank r its 64 MiB / n block (one socket per rank, in rank order)
and copies its own block into its output, as every scatter must. reduce: a binomial tree's
transfers only (64 MiB per edge, towards rank 0) without the arithmetic, which any
minimum-bytes reduce adds on top. Connections: a full mesh made through the store
(MASTER_ADDR/MASTER_PORT, as torchrun sets them), TCP_NODELAY, ringreduce's 4 MiB buffers.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

MIB = 1 << 20


def _mesh(rank: int, n: int) -> dict:
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), n,
                          rank == 0, timedelta(seconds=120))
    lst = _sock()
    lst.bind(("127.0.0.1", 0))
    lst.listen(n)
    store.set(f"port/{rank}", str(lst.getsockname()[1]))
    socks = {}
    for p in range(rank):  # the higher rank of a pair connects
        s = _sock()
        s.connect(("127.0.0.1", int(store.get(f"port/{p}"))))
        s.sendall(rank.to_bytes(4, "little"))
        socks[p] = s
    for _ in range(rank + 1, n):
        s, _addr = lst.accept()
        socks[int.from_bytes(_recv_exact(s, 4), "little")] = s
    for s in socks.values():
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lst.close()
    socks["store"] = store
    return socks


def _sock() -> socket.socket:
    """A TCP socket with ringreduce's 4 MiB buffers (transport/tcp/socket.cc), set before
    connect / listen so that the window scale fits them."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    return s


def _recv_exact(s: socket.socket, nbytes: int) -> bytes:
    buf = bytearray(nbytes)
    _recv_into(s, memoryview(buf))
    return bytes(buf)


def _recv_into(s: socket.socket, view: memoryview) -> None:
    """In 32 KiB reads, as ringreduce reads between local processes (whole-buffer reads run
    at about half the rate on loopback: transport/tcp/tcp_connection.cc)."""
    got = 0
    while got < len(view):
        k = s.recv_into(view[got:got + (32 << 10)])
        if not k:
            raise ConnectionError("peer closed")
        got += k


def floor_ops(rank: int, n: int):
    """(ops, reset, barrier, finish) as bench/rooted.py's _rr_ops / _gloo_ops."""
    import numpy as np

    socks = _mesh(rank, n)
    block = 64 * MIB // 4 // n
    full = np.repeat(np.arange(n, dtype=np.float32), block) if rank == 0 else None
    sout = np.zeros(block, np.float32)
    red = np.empty(64 * MIB // 4, np.float32)
    tmp = np.empty_like(red)

    def scatter() -> bool:
        sout.fill(-1)
        if rank == 0:
            for r in range(1, n):
                socks[r].sendall(memoryview(full[r * block:(r + 1) * block]).cast("B"))
            np.copyto(sout, full[:block])
        else:
            _recv_into(socks[0], memoryview(sout).cast("B"))
        return bool(sout[0] == rank and sout[-1] == rank)

    def reduce() -> bool:
        bit = 1
        while bit < n:  # receive from rank + bit while the bit is clear, then send to parent
            if rank & bit:
                socks[rank - bit].sendall(memoryview(red).cast("B"))
                break
            if rank + bit < n:
                _recv_into(socks[rank + bit], memoryview(tmp).cast("B"))
            bit <<= 1
        return True  # transfers only: nothing to check

    def barrier() -> None:
        one = b"\0"
        if rank == 0:
            for r in range(1, n):
                _recv_exact(socks[r], 1)
            for r in range(1, n):
                socks[r].sendall(one)
        else:
            socks[0].sendall(one)
            _recv_exact(socks[0], 1)

    def finish() -> None:
        for k, s in socks.items():
            if k != "store":
                s.close()

    return {"scatter": scatter, "reduce": reduce}, lambda: red.fill(rank + 1), barrier, finish
