"""Builds and runs tests/cpp/sha256_check.cc, the known-answer test for the handshake's
SHA-256 / HMAC-SHA256 (csrc/core/sha256.cc). Needs only g++, not the built extension."""

from pathlib import Path

import _cpp_check


def test_sha256_known_answers(tmp_path: Path) -> None:
    _cpp_check.run(_cpp_check.build(tmp_path, "sha256_check", ["csrc/core/sha256.cc"],
                                    what="the SHA-256 check"))
