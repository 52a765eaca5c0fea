"""Builds and runs tests/cpp/abort_text_check.cc: how a peer's abort is quoted -- relayed
chains ("rank 2 failed: rank 3 failed: rank 4 closed ...", a hop per relay, 9 at 32 ranks)
flattened to the first finder's words with the ranks they came through. Needs only g++."""

from pathlib import Path

import _cpp_check


def test_relayed_aborts_quote_the_finder_once(tmp_path: Path) -> None:
    _cpp_check.run(_cpp_check.build(tmp_path, "abort_text_check",
                                    ["csrc/transport/frame.cc", "csrc/core/types.cc"],
                                    what="the abort text check"))
