"""Build ringreduce's C++ core (csrc/) into the extension ringreduce._C.

Plain setuptools + pybind11: no torch headers, no CMake. Every csrc/**/*.cc is compiled
with C++17, -O3 (-O1 for RINGREDUCE_SANITIZE) and warnings on (-Werror when
RINGREDUCE_WERROR=1, as CI sets it).
SIMD code is selected at run time (target attributes), never with -march=native.

CUDA (optional): with nvcc found and RINGREDUCE_CUDA unset/"auto" (or forced with "1"; "0"
turns it off), csrc/**/*.cu are compiled by nvcc for RINGREDUCE_CUDA_ARCH_LIST (or
TORCH_CUDA_ARCH_LIST; default "8.0;9.0+PTX", i.e. sm_80, sm_90 and PTX for newer GPUs),
the C++ sources see -DRINGREDUCE_WITH_CUDA, and the CUDA runtime is linked statically. The
static runtime loads the driver only on the first CUDA call, so the CUDA build imports and
runs CPU collectives on machines without a GPU or driver. NCCL is never linked: it is
dlopen'ed at run time (csrc/nccl/loader.h). Without CUDA the build is exactly the CPU one.

Compile jobs: `build_ext -j N` (or RINGREDUCE_BUILD_JOBS=N, e.g. under pip; default 2).
A build whose mode differs from the last one in this build folder (CUDA on/off, its
architectures, the flags above) recompiles everything instead of keeping the other mode's
extension.
"""

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.command.sdist import sdist

ROOT = Path(__file__).parent.resolve()


def _sources() -> list[str]:
    # csrc/torch_adapter/ includes torch headers: built at run time against the installed
    # torch (ringreduce/_c10d_build.py), never into _C. csrc/testing/ is the fault-injection
    # tests' module (_fault below), never in the library.
    srcs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cc")
                  if "torch_adapter" not in p.parts and "testing" not in p.parts)
    return srcs


def _flags() -> list[str]:
    san = os.environ.get("RINGREDUCE_SANITIZE")
    # A sanitized build is for checking, not speed: -O1 (the sanitizers' advice) compiles in
    # about half the time of -O3 (the ASan tests' build was ~3 min on 2 cores), and -g1 (line
    # tables: reports still name file and line) in two thirds of -g's.
    flags = ["-O1" if san else "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter",
             "-fvisibility=hidden"]
    if os.environ.get("RINGREDUCE_WERROR", "0") == "1":
        flags.append("-Werror")
    if san:
        flags += [f"-fsanitize={san}", "-fno-omit-frame-pointer", "-g1"]
    return flags


def _jobs() -> int:
    v = os.environ.get("RINGREDUCE_BUILD_JOBS", "2")
    if not v.strip().isdigit() or int(v) < 1:
        raise SystemExit(f"RINGREDUCE_BUILD_JOBS must be a whole number >= 1, got {v!r}")
    return int(v)


ParallelCompile("RINGREDUCE_BUILD_JOBS", default=_jobs()).install()

ext = Pybind11Extension(
    "ringreduce._C",
    _sources(),
    include_dirs=[str(ROOT / "csrc")],
    # Headers and X-macro tables (core/tunables.def): a change to one rebuilds the extension.
    depends=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*")
                   if p.suffix in (".h", ".def") and "torch_adapter" not in p.parts),
    cxx_std=17,
    extra_compile_args=_flags(),
    extra_link_args=["-pthread"]
    + ([f"-fsanitize={os.environ['RINGREDUCE_SANITIZE']}"] if os.environ.get("RINGREDUCE_SANITIZE") else []),
)

# RINGREDUCE_FAULT's actions (kill, stop, exit, hang its own process): a module of their own,
# loaded only when a test arms a rank, so that _C never ends its process (comm/fault.h).
fault_ext = Pybind11Extension(
    "ringreduce._fault",
    ["csrc/testing/fault_module.cc"],
    include_dirs=[str(ROOT / "csrc")],
    depends=["csrc/comm/fault.h"],
    cxx_std=17,
    extra_compile_args=_flags(),
    extra_link_args=ext.extra_link_args,
)



# ---- CUDA build (only when enabled; the CPU build above is untouched otherwise) ----------

DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"


def _find_nvcc():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def _cuda_wanted():
    """(nvcc path or None). RINGREDUCE_CUDA: "0" off, "1" required, unset/"auto" if found."""
    mode = os.environ.get("RINGREDUCE_CUDA", "auto").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return None
    if mode not in ("1", "on", "true", "yes", "auto", ""):
        raise SystemExit(f"RINGREDUCE_CUDA must be 0, 1 or auto, got {mode!r}")
    nvcc = _find_nvcc()
    if nvcc is None and mode != "auto" and mode != "":
        raise SystemExit(
            "RINGREDUCE_CUDA=1 but nvcc was not found: put the CUDA toolkit's bin/ on PATH or "
            "set CUDA_HOME (or build without CUDA: RINGREDUCE_CUDA=0)"
        )
    return nvcc


def _gencode_flags(spec):
    """TORCH_CUDA_ARCH_LIST style ("8.0;9.0+PTX", "80 90", "sm_90a") -> nvcc -gencode flags."""
    flags = []
    for tok in re.split(r"[;,\s]+", spec.strip()):
        if not tok:
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+)(?:\.(\d+))?([af]?)(\+PTX)?", tok, re.IGNORECASE)
        if not m:
            raise SystemExit(
                f"bad CUDA architecture {tok!r} in {spec!r}: use e.g. '8.0;9.0+PTX' or '80 90'"
            )
        major, minor, suffix, ptx = m.groups()
        num = (major + (minor or "")) if minor is not None or len(major) == 1 else major
        if len(num) == 1:
            num += "0"
        arch = num + suffix.lower()
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        if ptx:
            flags += ["-gencode", f"arch=compute_{arch},code=compute_{arch}"]
    if not flags:
        raise SystemExit(f"no CUDA architectures in {spec!r}")
    return flags


def _cuda_lib_dirs(nvcc, probe):
    """Directories holding libcudart_static.a, as nvcc itself would link (it knows its TOP)."""
    dirs = []
    try:
        out = subprocess.run([nvcc, "-dryrun", "-c", probe, "-o", os.devnull],
                             capture_output=True, text=True, check=False)
        for line in (out.stdout + out.stderr).splitlines():
            if "LIBRARIES=" in line:
                dirs += [d for d in re.findall(r'-L"?([^"\s]+)"?', line) if not d.endswith("stubs")]
    except OSError:
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    dirs += [str(Path(home) / "lib64"), str(Path(home) / "lib")]
    good = [d for d in dirs if (Path(d) / "libcudart_static.a").is_file()]
    if not good:
        raise SystemExit(f"libcudart_static.a not found (looked in {dirs}); set CUDA_HOME")
    return good[:1]


class BuildExt(build_ext):
    """build_ext that honours -j and rebuilds when the build mode changed (setuptools keeps
    an extension newer than its sources, whatever it was built with: a CUDA build followed
    by RINGREDUCE_CUDA=0 -- or the reverse -- silently kept the other mode's module)."""

    def mode(self) -> str:
        return " ".join(["cpu", *_flags()])

    def check_compiler(self) -> None:
        """Say which compiler is missing before nvcc or setuptools fail on it (without g++,
        nvcc's "Failed to preprocess host compiler properties" came first; found by a
        helper)."""
        cxx = getattr(self.compiler, "compiler_cxx", None) or []  # links C++ (pybind11)
        for exe in {self.compiler.compiler_so[0], self.compiler.linker_so[0], *cxx[:1]}:
            if shutil.which(exe) is None:
                raise SystemExit(
                    f"ringreduce: the C++ compiler {exe!r} is not on PATH: install g++ "
                    f"(apt-get install g++) or name one with CC/CXX")

    def build_extensions(self):
        self.check_compiler()
        if self.parallel:  # pybind11's parallel compile reads the variable at compile time
            os.environ["RINGREDUCE_BUILD_JOBS"] = str(max(1, int(self.parallel)))
        stamp = Path(self.build_temp) / "ringreduce-build-mode"
        want = self.mode()
        if not stamp.is_file() or stamp.read_text() != want:
            self.force = True
        super().build_extensions()
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(want)


class CudaBuildExt(BuildExt):
    """Compiles csrc/**/*.cu with nvcc, then builds the extension with the objects linked in."""

    nvcc = None

    @staticmethod
    def arch_spec() -> str:
        return (os.environ.get("RINGREDUCE_CUDA_ARCH_LIST") or os.environ.get("TORCH_CUDA_ARCH_LIST")
                or DEFAULT_CUDA_ARCHS)

    def mode(self) -> str:
        return " ".join(["cuda", str(self.nvcc), self.arch_spec(), *_flags()])

    def build_extensions(self):
        self.check_compiler()
        cu = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cu"))
        if not cu:
            raise SystemExit("ringreduce: no CUDA sources (csrc/**/*.cu) in this source tree, "
                             "which is incomplete; build without CUDA: RINGREDUCE_CUDA=0")
        spec = self.arch_spec()
        flags = ["-std=c++17", "-O3", "-I" + str(ROOT / "csrc"), "-DRINGREDUCE_WITH_CUDA",
                 "-Xcompiler=-fPIC,-fvisibility=hidden,-Wall,-Wextra,-Wno-unused-parameter",
                 *_gencode_flags(spec)]
        if os.environ.get("RINGREDUCE_WERROR", "0") == "1":
            flags += ["-Werror=all-warnings", "-Xcompiler=-Werror"]
        out_dir = Path(self.build_temp) / "cuda"
        out_dir.mkdir(parents=True, exist_ok=True)
        headers = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".h", ".cuh", ".def")]
        newest_header = max((p.stat().st_mtime for p in headers), default=0.0)
        stamp = " ".join([self.nvcc, *flags])

        def compile_one(src):
            obj = out_dir / (src.replace("/", "_").replace(".cu", ".o"))
            flag_file = obj.with_suffix(".flags")
            fresh = (obj.is_file() and flag_file.is_file() and flag_file.read_text() == stamp
                     and obj.stat().st_mtime >= max(newest_header, (ROOT / src).stat().st_mtime))
            if not fresh:
                cmd = [self.nvcc, *flags, "-c", str(ROOT / src), "-o", str(obj)]
                print(" ".join(cmd), flush=True)
                subprocess.run(cmd, check=True)
                flag_file.write_text(stamp)
            return str(obj)

        jobs = max(1, int(self.parallel or _jobs()))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            objects = list(pool.map(compile_one, cu))
        lib_dirs = _cuda_lib_dirs(self.nvcc, str(ROOT / cu[0]))
        for e in self.extensions:
            if e.name != ext.name:  # _fault links no CUDA
                continue
            e.extra_objects = list(e.extra_objects or []) + objects
            e.define_macros = list(e.define_macros or []) + [("RINGREDUCE_WITH_CUDA", "1")]
            e.library_dirs = list(e.library_dirs or []) + lib_dirs
            e.libraries = list(e.libraries or []) + ["cudart_static", "dl", "rt", "pthread"]
        super().build_extensions()


class SdistAll(sdist):
    """An sdist builds and tests as a clone does (found by a helper: it built from the
    extension's sources only, so the c10d adapter, built at run time, the CUDA sources, the
    tests' helpers and the examples were missing and a wheel from it failed)."""

    TREES = ("csrc", "tests", "bench", "examples", ".ci")

    def make_distribution(self) -> None:  # (setuptools' list comes from egg_info)
        for name in self.tracked():
            self.filelist.append(name)
        self.filelist.sort()
        self.filelist.remove_duplicates()
        super().make_distribution()

    def tracked(self) -> list[str]:
        """The trees' files git tracks (not build outputs, logs or caches); outside a git
        checkout (an sdist rebuilt from an sdist) every file but bytecode and objects."""
        try:
            out = subprocess.run(["git", "ls-files", "-z", "--", *self.TREES], cwd=ROOT,
                                 capture_output=True, check=True, timeout=60).stdout
            names = [n for n in out.decode().split("\0") if n]
            if names:
                return names
        except (OSError, subprocess.SubprocessError):
            pass
        return [str(p.relative_to(ROOT)) for top in self.TREES for p in sorted(
                (ROOT / top).rglob("*")) if p.is_file() and "__pycache__" not in p.parts
                and p.suffix not in (".pyc", ".so", ".o")]


class BuildPyWithAdapter(build_py):
    """Wheels carry the c10d adapter's source (ringreduce/_adapter/), which the installed
    package compiles against the installed torch on first use (ringreduce/_c10d_build.py)."""

    def run(self) -> None:
        super().run()
        dst = Path(self.build_lib) / "ringreduce" / "_adapter"
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("c10d_backend.cc", "native_api.h"):  # the adapter's whole source
            shutil.copy2(ROOT / "csrc" / "torch_adapter" / name, dst)


_TOP_LEVEL = {name: f"ringreduce/_toplevel/{name}"
              for name in ("_ringreduce_autoload", "_ringreduce_run")}


class EditableWheel(editable_wheel):
    """A compat editable install (``--config-settings editable_mode=compat``) is a .pth of
    folders: setuptools' names only the project's root, where the two top-level packages
    are not, so `import torch` failed (torch raises when a backend's entry point does not
    import). Their folder goes in too. (setuptools' strategy object is private: a version
    without `path_entries` installs as before.)"""

    def _select_strategy(self, name: str, tag: str, build_lib: str) -> object:
        strategy = super()._select_strategy(name, tag, build_lib)
        entries = getattr(strategy, "path_entries", None)  # (strict mode's has them too)
        if str(self.mode).lower() == "compat" and isinstance(entries, list):
            entries.append(ROOT / "ringreduce" / "_toplevel")
        return strategy

_NVCC = _cuda_wanted()
CudaBuildExt.nvcc = _NVCC
setup(ext_modules=[ext, fault_ext],
      cmdclass={"build_ext": BuildExt if _NVCC is None else CudaBuildExt,
                "build_py": BuildPyWithAdapter, "sdist": SdistAll,
                "editable_wheel": EditableWheel},
      # torch's entry point and ringreduce-run's (pyproject.toml) load top-level packages of
      # their own, so that loading them never imports ringreduce (see the two __init__.py).
      # Each lives in a folder of its own name under ringreduce/_toplevel (no package), which
      # a compat editable install puts on sys.path (EditableWheel).
      packages=find_packages(include=["ringreduce*"]) + list(_TOP_LEVEL),
      package_dir=_TOP_LEVEL)
