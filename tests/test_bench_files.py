"""ringreduce-bench's result files and result checks on large buffers: files are replaced
whole or not at all (bench/outfile.py), and -c's expected results and comparisons take a few
buffers' worth of memory (bench/checks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_checking_a_large_buffer_takes_a_few_copies_of_it():
    """-c's buffers and checks of a 16 MiB float16 all-reduce and a 4-rank all-to-all: a few
    buffers' worth of memory (the comparison's float64 temporaries took 24x the buffer, the
    all-to-all's expected result n whole patterns; an accepted run was killed for memory)."""
    code = """if True:
        import resource, torch
        from ringreduce.bench import checks
        from ringreduce.bench.metrics import make_case
        def peak():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        import sys
        op, dtype, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
        checks._PATTERN_STEP = 1 << 17  # its int64 temporaries: 1 MiB, not 8
        torch.ones(1 << 20).sum()
        base = peak()  # the lifetime peak: one case per process
        case = make_case(op, 16 << 20, dtype, world)
        b = checks.make_buffers(case, dtype, 1, world, "sum", 0, True)
        b.out.copy_(b.expected)
        assert checks.count_wrong(b.out, b.expected) == 0
        print((peak() - base) / (16 << 20))
    """
    for case in (("allreduce", "float16", "2"), ("alltoall", "float32", "4")):
        r = subprocess.run([sys.executable, "-c", code, *case], capture_output=True,
                           text=True, timeout=300, check=False)
        assert r.returncode == 0, r.stderr[-3000:]
        assert float(r.stdout) < 6, (case, r.stdout)  # inp, out/initial, expected: ~4 with steps


def test_outputs_are_replaced_whole_or_not_at_all(tmp_path):
    """A write that fails part way (a full disk, a file-size limit) leaves the previous
    --json / --csv / --plot file as it was (it left a truncated JSON), and nothing beside it;
    links, /dev/stdout-like targets and bind-mounted files still work."""
    from ringreduce.bench import outfile, report

    js = tmp_path / "r.json"
    outfile.write_json(str(js), {"old": 1})
    with pytest.raises(TypeError):
        outfile.write_json(str(js), {"new": object()})  # fails half way through the dump
    with pytest.raises(OSError), outfile.replacing(str(js)) as f:
        f.write('{"new": ')
        raise OSError(27, "File too large")
    assert json.loads(js.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    outfile.write_json(str(js), {"new": 2})
    assert json.loads(js.read_text()) == {"new": 2}
    mask = os.umask(0)
    os.umask(mask)
    assert js.stat().st_mode & 0o777 == 0o666 & ~mask  # as open() makes a file
    report.write_csv(str(tmp_path / "r.csv"), [])
    assert (tmp_path / "r.csv").read_text().strip() == ",".join(report.CSV_FIELDS)
    # an existing file keeps its mode; a link's file is replaced and the link stays
    os.chmod(js, 0o640)
    (tmp_path / "latest.json").symlink_to(js)
    outfile.write_json(str(tmp_path / "latest.json"), {"new": 3})
    assert (tmp_path / "latest.json").is_symlink() and json.loads(js.read_text()) == {"new": 3}
    assert js.stat().st_mode & 0o777 == 0o640
    # no regular file (/dev/stdout, a pipe): written to, never renamed over
    (tmp_path / "out").symlink_to("/dev/null")
    outfile.write_json(str(tmp_path / "out"), {"new": 4})
    assert os.readlink(tmp_path / "out") == "/dev/null" and not os.path.isfile("/dev/null")
    # a file that cannot be renamed over (a bind mount's EBUSY): its contents are copied in
    import errno

    def busy(src, dst):
        raise OSError(errno.EBUSY, "Device or resource busy")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "replace", busy)
        outfile.write_json(str(js), {"new": 5})
    assert json.loads(js.read_text()) == {"new": 5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "out", "r.csv",
                                                         "r.json"]
