"""ringreduce-run's reading of the program to run: a script, -m module, `python [its
options] script`, --no-python executable (ringreduce/run.py loads this file by its path:
neither imports anything of the package)."""

from __future__ import annotations

import os
import re
import shutil
import sys

# Interpreter options that take a value (`python -W error -X dev train.py`).
_PY_OPTS_WITH_VALUE = ("-W", "-X", "-Q")


class UsageError(Exception):
    """A bad command line; printed as ``ringreduce-run: error: ...`` with exit code 2."""


_PYTHON_NAME = re.compile(r"python[0-9.]*$")


def _is_python(word: str) -> bool:
    """Whether ``word`` names a Python interpreter (mpirun's habit: ``-n 2 python x.py``)."""
    if word == sys.executable:
        return True
    return bool(_PYTHON_NAME.match(os.path.basename(word))) and shutil.which(word) is not None


def command(program: list[str], no_python: bool) -> list[str]:
    """The command each rank runs, or a UsageError saying what is wrong with ``program``."""
    if not program or program == ["-m"] or program[:2] == ["-m", ""]:
        raise UsageError("no program given: pass a script (train.py) or -m module, "
                          "followed by its arguments")
    if no_python:
        if program[0] == "-m" or shutil.which(program[0]) is None:
            raise UsageError(f"--no-python: {program[0]!r} is not an executable on PATH "
                              "or a path to one; drop --no-python to run a Python script")
        return list(program)
    python = sys.executable
    if _is_python(program[0]):  # `python train.py`: run it with the interpreter named
        python = shutil.which(program[0]) or program[0]
        flags, program = _interpreter_options(program[1:])
        if not program or program in (["-m"], ["-c"], ["--"]):
            raise UsageError(f"no program given after {python!r}: pass a script or -m module")
        if program[0] == "-c":
            return [python, *flags, "-u", *program]
        if program[0] != "-m":  # after --: a script, whatever its name (python's rule)
            _check_script(program[1] if program[0] == "--" else program[0], "use -m module")
        return [python, *flags, "-u", *program]
    if program[0] != "-m":
        _check_script(program[0], "use -m module to run a module, or --no-python to run an "
                                  "executable")
    return [python, "-u", *program]


def _interpreter_options(words: list[str]) -> tuple[list[str], list[str]]:
    """`python`'s own options (-O, -W error; -u is the launcher's) and its program, as python
    parses them: -uO, -Wd, -mjson.tool, -cCODE, -uc CODE, -- (were taken for a script)."""
    flags: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":  # kept: what follows is a script even if named -c
            return flags, words[i:]
        if not w.startswith("-") or w == "-" or w.startswith("--"):
            break
        i += 1
        for j, ch in enumerate(w[1:], start=1):
            rest = [w[j + 1:]] if j + 1 < len(w) else []  # joined to its letter
            if ch in "cm":  # the code or module: the word's rest, else the next word
                return flags, [f"-{ch}", *rest, *words[i:]]
            if f"-{ch}" in _PY_OPTS_WITH_VALUE:  # -W error, -Werror
                flags += [f"-{ch}", *(rest or words[i:i + 1])]
                i += 0 if rest else 1
                break
            if ch != "u":
                flags.append(f"-{ch}")
    return flags, words[i:]


def _check_script(path: str, other: str) -> None:
    """What Python runs as a script: a file (source, or a zip application) or a folder with
    a __main__.py (as `python app/` and torchrun run it)."""
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "__main__.py")):
        return
    what = "is a folder without __main__.py" if os.path.isdir(path) else "not found"
    raise UsageError(f"script {path!r} {what}; pass the path to a Python file (or a folder "
                      f"with a __main__.py), {other}")
