"""Build ringreduce's C++ core (csrc/) into the extension ringreduce._C.

Plain setuptools + pybind11: no torch headers, no CMake. Every csrc/**/*.cc is compiled
with C++17, -O3 and warnings on (-Werror when RINGREDUCE_WERROR=1, as CI sets it).
SIMD code is selected at run time (target attributes), never with -march=native.
"""

import os
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, ParallelCompile
from setuptools import setup

ROOT = Path(__file__).parent.resolve()


def _sources() -> list[str]:
    srcs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cc"))
    return srcs


def _flags() -> list[str]:
    flags = ["-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
    if os.environ.get("RINGREDUCE_WERROR", "0") == "1":
        flags.append("-Werror")
    if os.environ.get("RINGREDUCE_SANITIZE"):
        san = os.environ["RINGREDUCE_SANITIZE"]
        flags += [f"-fsanitize={san}", "-fno-omit-frame-pointer", "-g"]
    return flags


ParallelCompile("RINGREDUCE_BUILD_JOBS", default=2).install()

ext = Pybind11Extension(
    "ringreduce._C",
    _sources(),
    include_dirs=[str(ROOT / "csrc")],
    cxx_std=17,
    extra_compile_args=_flags(),
    extra_link_args=["-pthread"]
    + ([f"-fsanitize={os.environ['RINGREDUCE_SANITIZE']}"] if os.environ.get("RINGREDUCE_SANITIZE") else []),
)

setup(ext_modules=[ext])
