"""ringreduce-run (ringreduce/run.py): the ranks' output as it comes, what a rank leaves
behind at the end, torchrun's PET_* defaults (found by a helper's comparison with torchrun).
Helpers from test_launcher."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import test_launcher
from test_launcher import (
    RUN_PY,
    _assert_no_leftovers,
    _launch,
    _pids_with,
    _ranked_json,
    _run_module,
    _script,
)

marker = test_launcher.marker  # the fixture: a unique word to find a test's processes by

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")


def test_prefix_goes_at_each_line_start_and_after_a_redrawing_cr() -> None:
    prefixed = _run_module()._output.prefixed
    p = b"[rank 1] "
    assert prefixed(b"a\nb\rc\r\nd", p, True) == p + b"a\n" + p + b"b\r" + p + b"c\r\n" + p + b"d"
    assert prefixed(b"rest of a line\n", p, False) == b"rest of a line\n"  # no prefix at its end
    assert prefixed(b"\n", p, False) == b"\n"


@pytest.mark.timeout(60)
def test_a_partial_line_shows_before_its_line_ends(tmp_path: Path, marker: str) -> None:
    """A rank's print(end="") (a prompt, a progress bar) reaches the launcher's stdout at
    once; before, lines were read whole, so it waited for the newline. The rank ends its
    line only once the test saw the partial one."""
    flag = tmp_path / "seen"
    code = ("import os, sys, time\n"
            "print('abc', end='', flush=True)\n"
            f"while not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
            "print('def')\n")
    p = subprocess.Popen([sys.executable, str(RUN_PY), "-n", "1", "python", "-c", code, marker],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = b""
    try:
        deadline = time.monotonic() + 15
        while b"abc" not in out and time.monotonic() < deadline:
            if select.select([p.stdout], [], [], 0.1)[0]:
                out += os.read(p.stdout.fileno(), 4096)
        assert out == b"[rank 0] abc", out
        flag.touch()
        out += p.stdout.read()
        assert p.wait(timeout=30) == 0
    finally:
        flag.touch()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert out == b"[rank 0] abcdef\n", out
    _assert_no_leftovers(marker)


@pytest.mark.timeout(60)
def test_children_a_rank_leaves_get_sigterm_first(tmp_path: Path, marker: str) -> None:
    """A child a rank leaves running (a logger's upload) gets SIGTERM and the grace period
    when the job ends -- it was SIGKILLed at once -- and a detached one (its own session)
    holding the rank's output delays the end by at most 2 s, not 2 s per pipe."""
    (tmp_path / "child.py").write_text(textwrap.dedent(f"""
        import signal, sys, time
        def on_term(sig, frame):
            open({str(tmp_path)!r} + "/" + sys.argv[1], "w").close()
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(60)
    """))
    (tmp_path / "rank.py").write_text(textwrap.dedent(f"""
        import os, subprocess, sys
        child = [sys.executable, {str(tmp_path / "child.py")!r}, "term" + os.environ["RANK"]]
        c = subprocess.Popen(child + [sys.argv[1]], stdout=subprocess.PIPE)
        c.stdout.readline()  # its handler is in place
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", sys.argv[1]],
                         start_new_session=True)  # holds the rank's stdout and stderr
    """))
    t0 = time.monotonic()
    r = _launch("-n", "3", str(tmp_path / "rank.py"), marker)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("term")) == [
        "term0", "term1", "term2"], r.stderr
    assert took < 12, took  # was 3 ranks x 2 pipes x 2 s on top of the start
    for pid in _pids_with(marker):  # the detached sleepers: out of the launcher's reach
        os.kill(pid, signal.SIGKILL)
    _assert_no_leftovers(marker)


@pytest.mark.timeout(60)
def test_torchruns_pet_variables_are_defaults(marker: str) -> None:
    """torchrun reads each option from PET_<OPTION> (Kubeflow's PyTorchJob sets them): so
    does ringreduce-run, below the command line (they were ignored: 1 rank)."""
    env = dict(os.environ, PET_NPROC_PER_NODE="2", PET_MASTER_PORT="29743")
    r = _launch(_script("print_env.py"), marker, env=env)
    assert r.returncode == 0, r.stderr
    ranks = _ranked_json(r.stdout)
    assert sorted(ranks) == [0, 1] and {i["MASTER_PORT"] for i in ranks.values()} == {"29743"}
    r = _launch("-n", "1", _script("print_env.py"), marker, env=env)
    assert r.returncode == 0 and sorted(_ranked_json(r.stdout)) == [0], r.stderr
    r = _launch(_script("print_env.py"), marker, env=dict(env, PET_NNODES="2"))
    assert r.returncode == 2 and "starts ranks on this host only" in r.stderr, r.stderr
    # a bad value is named as the variable (it was named as the option, never typed)
    r = _launch(_script("print_env.py"), marker, env=dict(env, PET_MASTER_PORT="99999"))
    assert r.returncode == 2 and "PET_MASTER_PORT='99999' (torchrun's default for " \
        "--master-port): '99999' is not a TCP port" in r.stderr, r.stderr
    r = _launch("--master-port", "29744", _script("print_env.py"), marker,
                env=dict(env, PET_MASTER_PORT="99999"))  # the command line's wins
    assert r.returncode == 0, r.stderr
    _assert_no_leftovers(marker)


@pytest.mark.timeout(60)
def test_the_launchers_message_starts_a_line_of_its_own(tmp_path: Path, marker: str) -> None:
    """A rank's open line (a progress bar on stderr) when the launcher reports another
    rank's failure: the message starts its own line, not glued to the bar (found by a
    review), and the bar keeps its prefix."""
    (tmp_path / "rank.py").write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.stderr.write("45%|###")
            sys.stderr.flush()
            time.sleep(60)
        time.sleep(1)
        sys.exit(3)
    """))
    r = _launch("-n", "2", "--grace-period", "1", str(tmp_path / "rank.py"), marker)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.splitlines()
    assert "[rank 1] 45%|###" in lines, r.stderr
    assert any(ln.startswith("ringreduce-run: rank 0 (pid") for ln in lines), r.stderr
    _assert_no_leftovers(marker)


def test_an_unfinished_utf8_character_waits_for_its_rest() -> None:
    split = _run_module()._output.split_utf8
    e = "é".encode()  # 2 bytes; "€" 3, "𝄞" 4
    assert split(b"a" + e[:1]) == (b"a", e[:1]) and split(b"a" + e) == (b"a" + e, b"")
    assert split("€".encode()[:2]) == (b"", "€".encode()[:2])
    assert split(b"x" + "𝄞".encode()[:3]) == (b"x", "𝄞".encode()[:3])
    assert split(b"plain\n") == (b"plain\n", b"") and split(b"") == (b"", b"")


@pytest.mark.timeout(60)
def test_another_ranks_line_does_not_split_a_character(tmp_path: Path, marker: str) -> None:
    """Rank 0 writes the first byte of "é", rank 1 a whole line, then rank 0 the rest: the
    newline that ends rank 0's open line went between the two bytes (an invalid UTF-8
    sequence on the screen); the unfinished character now waits for its rest."""
    (tmp_path / "rank.py").write_text(textwrap.dedent(f"""
        import os, time
        flags = {str(tmp_path)!r}
        def wait(name):
            while not os.path.exists(os.path.join(flags, name)):
                time.sleep(0.01)
            time.sleep(0.2)  # the launcher has copied what came before
        if os.environ["RANK"] == "0":
            os.write(1, b"a" + "é".encode()[:1])
            open(os.path.join(flags, "first"), "w").close()
            wait("other")
            os.write(1, "é".encode()[1:] + b"b\\n")
        else:
            wait("first")
            os.write(1, b"other line\\n")
            open(os.path.join(flags, "other"), "w").close()
    """))
    p = subprocess.run([sys.executable, str(RUN_PY), "-n", "2", str(tmp_path / "rank.py"),
                        marker], capture_output=True, timeout=30, check=False)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode("utf-8")  # strict: a split character fails here
    assert "[rank 1] other line\n" in text and "éb\n" in text, text
    _assert_no_leftovers(marker)


def test_after_python_s_double_dash_comes_a_script_whatever_its_name() -> None:
    """`python -- -c x` runs a script named -c (python's rule); the launcher ran -c's code."""
    run = _run_module()
    script = _script("print_env.py")
    assert run._command([sys.executable, "-O", "--", script, "a"], False) == [
        sys.executable, "-O", "-u", "--", script, "a"]
    with pytest.raises(run._UsageError, match="script '-c' not found"):
        run._command([sys.executable, "--", "-c", "print(1)"], False)
    with pytest.raises(run._UsageError, match="no program given"):
        run._command([sys.executable, "--"], False)
