"""Wire-protocol fuzzing (issue #7 item 7).

1. tests/cpp/fuzz_wire*.cc, built with AddressSanitizer + UBSan (needs only g++, not the
   built extension), feeds random and mutated frames, handshakes and heartbeat datagrams
   to the real receive paths of csrc/transport for a bounded time (about 20 s when CI=true,
   10 s otherwise; RINGREDUCE_FUZZ_SECONDS overrides, RINGREDUCE_FUZZ_SEED fixes the seed).
   Its self-test and an injected bug show that its checks can fail.
2. A live job initialises while this process sends ~200 fuzzed handshakes to each
   accepting rank's listener: every one must be refused with the right status, and the job
   must still connect and reduce correctly.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import _cpp_check
import fuzz_workers
import pytest
from _spawn import run_world_raw
from error_workers import _ACK, _AUTH, _HELLO, _MAGIC, _VERSION, _recv_all

# Keeps both CPUs busy (an AddressSanitizer build, then the fuzz loop): one such test at a time under
# pytest-xdist (tests/_xdist_locks.py).
pytestmark = pytest.mark.cpu_heavy

ROOT = Path(__file__).resolve().parent.parent
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
SOURCES = ["csrc/core/crc32c.cc", "csrc/core/interrupt.cc", "csrc/core/log.cc",
           "csrc/core/sha256.cc", "csrc/core/types.cc",
           "csrc/transport/frame.cc", "csrc/transport/heartbeat.cc",
           "csrc/transport/tcp/socket.cc", "csrc/transport/tcp/handshake.cc",
           "csrc/transport/tcp/tcp_connection.cc", "csrc/transport/tcp/pipe.cc",
           "csrc/transport/tcp/link.cc", "csrc/transport/tcp/link_pump.cc",
           "tests/cpp/fuzz_wire_frames.cc", "tests/cpp/fuzz_wire_handshake.cc",
           "tests/cpp/fuzz_wire_heartbeat.cc"]
# Any allocation over 64 MiB aborts (an attacker-chosen length must never get that far);
# leaks fail the run at exit.
ASAN_OPTIONS = ("detect_leaks=1:max_allocation_size_mb=64:allocator_may_return_null=0:"
                "halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1")
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"
MIN_ITERATIONS_PER_S = 20  # about 600/s on a 2-core CI box; far below means a stall


def _seconds() -> float:
    if os.environ.get("RINGREDUCE_FUZZ_SECONDS"):
        return float(os.environ["RINGREDUCE_FUZZ_SECONDS"])
    return 20.0 if os.environ.get("CI", "").lower() == "true" else 10.0


@pytest.fixture(scope="module")
def fuzz_wire(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cpp_check.build(tmp_path_factory.mktemp("fuzz_wire"), "fuzz_wire", SOURCES,
                            ("-O1", "-g1", *SANITIZE, "-pthread"), "the wire-protocol fuzzer")


def _run(exe: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS=UBSAN_OPTIONS)
    return subprocess.run([str(exe), *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.timeout(_cpp_check.BUILD_TIMEOUT_S + 120)
def test_fuzzer_self_test_accepts_valid_and_rejects_mutated(fuzz_wire: Path) -> None:
    """Fixed cases through the same checks as the fuzz loop: a valid frame is delivered,
    mutated ones raise the right error, handshakes and heartbeats are checked both ways."""
    run = _run(fuzz_wire, "--self-test", "--seed", "1", timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"fuzz_wire --self-test failed:\n{out[-6000:]}"
    for line in ("valid frame accepted -> ok", "mutated count rejected -> MismatchError",
                 "bad magic rejected -> PeerError", "corrupted payload rejected by CRC -> PeerError",
                 "half frame waits for its deadline -> blocked-until-deadline",
                 "half frame then close rejected -> PeerError",
                 "abort frame with a 2^64-1 reason length -> PeerError",
                 "real handshake captured and mirrored",
                 "forged heartbeats left PeerStatus unchanged",
                 "a heartbeat of an earlier init is refused by the next",
                 "goodbye read while idle, then close -> left",
                 "fuzz_wire: self-test OK"):
        assert line in out, f"missing {line!r} in:\n{out[-6000:]}"


@pytest.mark.timeout(_cpp_check.BUILD_TIMEOUT_S + 120)
def test_fuzzer_fails_on_an_injected_bug(fuzz_wire: Path) -> None:
    """--inject-bug flips a bit of every delivered payload: the run must fail, so a green
    fuzz run means the comparisons ran."""
    run = _run(fuzz_wire, "--inject-bug", "--seconds", "10", "--seed", "3", timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode != 0, f"the injected bug went unnoticed:\n{out[-3000:]}"
    assert "FAILURE" in out and "differs from what was sent" in out, out[-3000:]


@pytest.mark.timeout(_cpp_check.BUILD_TIMEOUT_S + 180)
def test_fuzz_wire_protocol_under_sanitizers(fuzz_wire: Path) -> None:
    """The bounded fuzz run: no crash, no sanitizer report, no leak, no oversized
    allocation, no hang, no wrong result."""
    seconds = _seconds()
    seed = os.environ.get("RINGREDUCE_FUZZ_SEED") or str(random.SystemRandom().randrange(2**63))
    run = _run(fuzz_wire, "--seconds", str(seconds), "--seed", seed, timeout=seconds + 120)
    out = run.stdout + run.stderr
    repro = (f"reproduce: RINGREDUCE_FUZZ_SEED={seed} RINGREDUCE_FUZZ_SECONDS={seconds} "
             f"python -m pytest tests/test_fuzz.py -k sanitizers")
    assert run.returncode == 0, f"fuzz_wire failed (exit {run.returncode}); {repro}\n{out[-8000:]}"
    m = re.search(r"fuzz_wire: OK iterations=(\d+) frames=(\d+) idle=(\d+) handshakes=(\d+) "
                  r"datagrams=(\d+) mismatch_checks=(\d+) per_s=\d+ max_alloc=(\d+)", out)
    assert m, f"no OK line; {repro}\n{out[-4000:]}"
    iters, frames, idle, handshakes, datagrams, _, max_alloc = map(int, m.groups())
    print(m.group(0))
    assert iters >= MIN_ITERATIONS_PER_S * seconds, f"only {iters} iterations in {seconds} s"
    assert min(frames, idle, handshakes, datagrams) > 0, m.group(0)
    assert max_alloc < 64 << 20, m.group(0)


# ------------------------------------------------------------------ live ranks

_PAD = struct.Struct("<20xi")  # Auth.pad, the last int32 of the fixed fields


def _auth_mac(secret: str, hello_nonce: bytes, nonce: bytes, rank: int, world: int,
              target: int) -> bytes:
    msg = b"C" + hello_nonce + nonce + struct.pack("<iii", rank, world, target)
    return hmac.new(secret.encode(), msg, hashlib.sha256).digest()


def _signed_auth(secret: str, hello_nonce: bytes, rank: int, world: int, target: int) -> bytes:
    nonce = os.urandom(16)
    return _AUTH.pack(_MAGIC, _VERSION, rank, world, target, 0, nonce,
                      _auth_mac(secret, hello_nonce, nonce, rank, world, target))


def _expected_status(msg: bytes, hello_nonce: bytes, secret: str, me: int, world: int) -> int:
    """The listener's refusal code for these 72 bytes (handshake.cc's order of checks)."""
    magic, version, rank, w, target, pad, nonce, mac = _AUTH.unpack(msg[:_AUTH.size])
    if magic != _MAGIC or version != _VERSION or pad != 0:
        return 1  # kBadMagic
    if not hmac.compare_digest(mac, _auth_mac(secret, hello_nonce, nonce, rank, w, target)):
        return 5  # kBadAuth
    if w != world:
        return 2  # kWrongWorld
    if target != me or rank <= me or rank >= world:
        return 3  # kBadRank
    return 0


def _flip(data: bytes, rng: random.Random, flips: int = 1) -> bytes:
    b = bytearray(data)
    for _ in range(flips):
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def _one_stranger(host: str, port: int, me: int, world: int, secret: str, rng: random.Random,
                  stale: list[bytes], stats: dict) -> None:
    """One fuzzed handshake against rank `me`'s listener; records what happened."""
    with socket.create_connection((host, port), timeout=10) as s:
        s.settimeout(10)
        raw = _recv_all(s, _HELLO.size)
        hello = _HELLO.unpack(raw)
        if list(hello[:4]) != [_MAGIC, _VERSION, me, world]:
            stats["errors"].append(f"rank {me} sent hello {hello[:4]}")
            return
        nonce = hello[4]
        valid_claim = world - 1  # the rank that has not connected yet
        kind = rng.randrange(9)
        if kind == 0:    # random bytes
            msg = os.urandom(_AUTH.size)
        elif kind == 1:  # the listener's own hello, mutated, padded out to an Auth
            msg = _flip(raw, rng, rng.randint(1, 3)) + os.urandom(_AUTH.size - _HELLO.size)
        elif kind == 2:  # well-formed, claims the missing rank, MAC without the secret
            msg = _AUTH.pack(_MAGIC, _VERSION, valid_claim, world, me, 0, os.urandom(16), os.urandom(32))
        elif kind == 3:  # replay: signed for an earlier hello's nonce
            msg = stale[rng.randrange(len(stale))] if stale else os.urandom(_AUTH.size)
        elif kind == 4:  # knows the secret, claims what it may not
            rank, w, target = rng.choice([(valid_claim, world + 1, me), (valid_claim, world, me + 1),
                                          (me, world, me), (world, world, me), (-1, world, me)])
            msg = _signed_auth(secret, nonce, rank, w, target)
        elif kind == 5:  # valid, then one to three bits flipped
            msg = _flip(_signed_auth(secret, nonce, valid_claim, world, me), rng, rng.randint(1, 3))
        elif kind == 6:  # valid but for a non-zero pad (outside the MAC)
            msg = bytearray(_signed_auth(secret, nonce, valid_claim, world, me))
            _PAD.pack_into(msg, 0, rng.choice([1, -1, 1 << 16]))
            msg = bytes(msg)
        elif kind == 7:  # not a handshake at all
            msg = (b"GET / HTTP/1.0\r\n\r\n" + b"\x00" * 100)[:_AUTH.size]
        else:            # truncated, then closed: no answer, just a closed connection
            msg = _signed_auth(secret, nonce, valid_claim, world, me)[:rng.randrange(_AUTH.size)]
        stale.append(_signed_auth(secret, nonce, valid_claim, world, me))
        del stale[:-16]
        if kind == 8:
            s.sendall(msg)
            s.shutdown(socket.SHUT_WR)
            rest = _recv_all(s)
            stats["truncated"] += 1
            if rest:
                stats["errors"].append(f"rank {me} answered a truncated handshake: {rest!r}")
            return
        want = _expected_status(msg, nonce, secret, me, world)
        if want == 0:  # never send a message that would take the missing rank's place
            stats["errors"].append(f"attacker bug: kind {kind} would be accepted")
            return
        if rng.random() < 0.1:
            for i in range(len(msg)):  # byte by byte
                s.sendall(msg[i:i + 1])
        else:
            s.sendall(msg)
        ack = _recv_all(s, _ACK.size)
        got = list(_ACK.unpack(ack)[:2]) if len(ack) == _ACK.size else ack
        stats["refused"][want] = stats["refused"].get(want, 0) + 1
        if got != [_MAGIC, want]:
            stats["errors"].append(f"rank {me}: kind {kind} answered {got}, expected status {want}")


def _attacker(outdir: Path, world: int, secret: str, per_rank: int, stats: dict) -> None:
    try:
        addrs_file = outdir / "addrs.json"
        deadline = time.monotonic() + 60
        while not addrs_file.exists():
            if time.monotonic() > deadline:
                stats["errors"].append("the job never published its addresses")
                return
            time.sleep(0.01)
        addrs = json.loads(addrs_file.read_text())["tcp"]

        def hammer(me: int) -> None:
            host, port = addrs[me].rsplit(":", 1)
            rng = random.Random(1000 + me)
            stale: list[bytes] = []
            for _ in range(per_rank):
                try:
                    _one_stranger(host.strip("[]"), int(port), me, world, secret, rng, stale, stats)
                except (OSError, struct.error) as e:
                    stats["errors"].append(f"rank {me}: {type(e).__name__}: {e}")
                stats["sent"][me] += 1

        # Every rank but the last runs an accept loop now (the last one is being held).
        threads = [threading.Thread(target=hammer, args=(r,), daemon=True) for r in range(world - 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
    except Exception as e:  # noqa: BLE001 - reported through stats
        stats["errors"].append(f"attacker: {type(e).__name__}: {e}")
    finally:
        (outdir / "go").write_text("go")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_live_ranks_refuse_fuzzed_handshakes_during_init(tmp_path: Path, world: int) -> None:
    """~200 random and mutated handshakes (mutated hellos, forged, replayed, re-signed with
    bad fields, bit-flipped, non-zero pad, truncated) hit every accepting rank while the job
    waits for its last rank. Each is refused with the status the protocol prescribes; the
    job then initialises and its all-reduces match numpy."""
    per_rank = 200
    secret = os.urandom(16).hex()
    stats: dict = {"errors": [], "sent": [0] * world, "refused": {}, "truncated": 0}
    th = threading.Thread(target=_attacker, args=(tmp_path, world, secret, per_rank, stats),
                          daemon=True)
    th.start()
    outs = run_world_raw(world, fuzz_workers.hold_init_for_attacker, str(tmp_path), 60.0,
                         timeout=120, init=False,
                         env={"RINGREDUCE_SECRET": secret, "RINGREDUCE_CONNECT_TIMEOUT": "90"})
    th.join(30)
    print(f"world {world}: strangers per rank {stats['sent']}, refusals by status "
          f"{stats['refused']}, truncated {stats['truncated']}")
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok for o in outs), story
    assert not stats["errors"], f"{stats['errors'][:10]}\n{story}"
    assert stats["sent"][:world - 1] == [per_rank] * (world - 1), stats
    assert outs[-1].value["held_s"] > 0 and (tmp_path / "go").exists(), outs[-1].value
    for o in outs:
        assert o.value["errors"] == [], f"rank {o.rank}: {o.value['errors']}"
    # Every stranger was refused, and the refusals cover each status code.
    assert set(stats["refused"]) == {1, 2, 3, 5}, stats["refused"]
    assert sum(stats["refused"].values()) + stats["truncated"] == per_rank * (world - 1), stats
