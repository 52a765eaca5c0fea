"""Build and load the c10d Backend adapter (csrc/torch_adapter/c10d_backend.cc) against the
torch that is installed.

A torch C++ extension must match the torch it runs in, so the adapter is not built by
``pip install`` (whose isolated build has no torch): the first process that needs it
compiles it with the system C++ compiler (~1 min on 2 cores; one line on stderr says so),
into a cache directory keyed by the torch build, the Python version and the source, and
every later process (and the job's other ranks, which wait on a file lock) loads the cached
library. A library built for another torch is never loaded: the key differs, and the module
also records the torch version it was built against, which :func:`load` checks.

:func:`load` returns ``(module, None)`` or ``(None, reason)``; ringreduce.backend then falls
back to its Python process group and says in one line what is lost.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# Source tree / editable install first, then the copy a wheel carries (setup.py build_py).
_SOURCES = [_HERE.parent / "csrc" / "torch_adapter" / "c10d_backend.cc",
            _HERE / "_adapter" / "c10d_backend.cc"]
_BUILD_TIMEOUT_S = 900.0
_LOADED: list[Any] = []


def cache_root() -> Path:
    """$XDG_CACHE_HOME/ringreduce (default ~/.cache/ringreduce)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ringreduce"


def _private_tmp_root() -> Path:
    """$TMPDIR/ringreduce-cache-<uid>, made private to this user: where the adapter goes
    when the cache folder cannot be written (a read-only or missing HOME -- the backend then
    lost DeviceMesh/FSDP2, found by a helper). A folder there that another user made, or
    that others may write, is refused: a library in it is loaded into this process."""
    d = Path(tempfile.gettempdir()) / f"ringreduce-cache-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{d} is not a folder private to this user; set XDG_CACHE_HOME "
                              f"to a writable folder of yours")
    return d


def _source() -> Path | None:
    return next((p for p in _SOURCES if p.is_file()), None)


def _key(src: Path, torch: Any) -> str:
    h = hashlib.sha256()
    for part in (src.read_bytes(), (src.parent / "native_api.h").read_bytes(),
                 torch.__version__.encode(),
                 str(getattr(torch.version, "git_version", "")).encode(),
                 str(torch._C._GLIBCXX_USE_CXX11_ABI).encode(), sys.version.encode(),
                 str(sysconfig.get_config_var("EXT_SUFFIX")).encode()):
        h.update(part)
    return h.hexdigest()[:16]


def _cxx_std(cpp_extension: Any) -> str:
    """The C++ standard torch's headers ask for: ATen.h's guard (`__cplusplus < 202002L`:
    C++20, from torch 2.14; 201703L before), or, where no ATen.h is found, C++20 (what
    torch's own cpp_extension has built with since 2.13)."""
    years = {201703: "c++17", 202002: "c++20", 202302: "c++23"}
    for d in cpp_extension.include_paths():
        aten = Path(d) / "ATen" / "ATen.h"
        if aten.is_file():
            m = re.search(r"__cplusplus\s*<\s*(\d+)L", aten.read_text(errors="replace"))
            if m:
                return years.get(int(m.group(1)), "c++20")
    return "c++20"


def _compile(src: Path, out: Path, name: str, torch: Any) -> None:
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise FileNotFoundError("no C++ compiler (c++ or g++) on PATH; install g++")
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    cmd = [cxx, "-shared", "-fPIC", "-O2", f"-std={_cxx_std(cpp_extension)}",
           "-fvisibility=hidden", "-w",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={name}",
           "-DTORCH_API_INCLUDE_EXTENSION_H", f'-DRR_TORCH_VERSION="{torch.__version__}"',
           f"-I{sysconfig.get_paths()['include']}", f"-I{src.parent}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [str(src), "-o", str(out)]
    for d in cpp_extension.library_paths():
        cmd += [f"-L{d}", f"-Wl,-rpath,{d}"]
    cmd += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S,
                       check=False, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"compiling {src.name} failed ({' '.join(cmd[:2])} ...):\n"
                           f"{(p.stderr or p.stdout)[-2000:]}")


def _import(path: Path, name: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def build(torch: Any) -> Path:
    """The adapter library for this torch, compiled now if the cache lacks it."""
    src = _source()
    if src is None:
        raise FileNotFoundError(f"the adapter's source is missing (looked at {_SOURCES[0]} "
                                f"and {_SOURCES[1]}); reinstall ringreduce")
    key = _key(src, torch)
    name = f"ringreduce_c10d_{key}"
    sub = f"c10d-torch{torch.__version__}-{key}"
    d = cache_root() / sub
    lib = d / f"{name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if lib.is_file():
        return lib
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        try:
            d = _private_tmp_root() / sub
        except OSError as e2:
            raise PermissionError(f"cannot write the cache folder {d.parent} ({e}) nor a "
                                  f"private one under the temp folder ({e2}); set "
                                  f"XDG_CACHE_HOME to a writable folder") from e
        lib = d / lib.name
        d.mkdir(exist_ok=True)  # (a library already there is found under the lock below)
    with open(d / "lock", "w") as lock:  # the job's other ranks wait here, then load
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_file():
            return lib
        t0 = time.monotonic()
        print(f"ringreduce: building the c10d backend adapter for torch {torch.__version__} "
              f"into {d} (once per torch build, about a minute)...", file=sys.stderr,
              flush=True)
        tmp = d / f".{name}.{os.getpid()}.so"
        try:
            _compile(src, tmp, name, torch)
            os.replace(tmp, lib)
        finally:
            tmp.unlink(missing_ok=True)
        print(f"ringreduce: adapter built in {time.monotonic() - t0:.0f} s", file=sys.stderr,
              flush=True)
    return lib


def load() -> tuple[Any, str | None]:
    """(the adapter module, None), or (None, why it is unavailable)."""
    if _LOADED:
        return _LOADED[0], None
    import torch

    try:
        lib = build(torch)
        mod = _import(lib, lib.name.split(".")[0])
    except Exception as e:  # noqa: BLE001 - the caller falls back and says why
        return None, f"{type(e).__name__}: {e}"
    why = mismatch(mod.TORCH_BUILD_VERSION, torch.__version__, lib)
    if why is not None:
        return None, why
    _LOADED.append(mod)
    return mod, None


def mismatch(built_for: str, running: str, lib: Path) -> str | None:
    """Why a library built for torch `built_for` must not run in torch `running` (None:
    it may)."""
    if built_for == running:
        return None
    return (f"the adapter at {lib} was built for torch {built_for} but torch {running} is "
            f"running (a torch extension built for another torch crashes); delete "
            f"{lib.parent} and it is rebuilt for this torch on next use")
