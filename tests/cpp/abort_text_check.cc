// Standalone check of rr::transport::abortText (csrc/transport/frame.cc): a peer's abort
// reason quoted once, relayed chains flattened to the first finder's words with "this rank"
// named, other text left as it is, and arbitrary bytes never read out of bounds.
// Build: g++ -std=c++17 -I csrc csrc/transport/frame.cc csrc/core/types.cc
//        tests/cpp/abort_text_check.cc
// Prints "abort_text_check: N passed, M failed"; exits non-zero when M > 0.
#include <cstdio>
#include <random>
#include <string>

#include "transport/frame.h"

namespace {

int passed = 0;
int failed = 0;

void expect(int label, const std::string& reason, const std::string& want) {
  const std::string got = rr::transport::abortText(label, "h", reason);
  if (got == want) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAIL: abortText(%d, %s)\n  got:  %s\n  want: %s\n", label, reason.c_str(),
                got.c_str(), want.c_str());
  }
}

}  // namespace

int main() {
  // Its own finding: quoted, its "this rank" named.
  expect(3, "rank 4 (h) closed the connection while this rank was waiting",
         "rank 3 (h) failed: rank 4 (h) closed the connection while rank 3 was waiting");
  // Relayed once and twice (as a peer that relayed it says it, and as older versions did).
  expect(2, "rank 3 (h) failed: rank 4 (h) closed while this rank was waiting",
         "rank 2 (h) failed (relayed from rank 3, which found it): rank 4 (h) closed while "
         "rank 3 was waiting");
  expect(1, "rank 2 (h) failed (relayed from rank 3, which found it): rank 4 (h) closed",
         "rank 1 (h) failed (relayed from rank 2, rank 3, which found it): rank 4 (h) closed");
  expect(0, "rank 1 (::1) failed: rank 2 (h) failed: rank 3 (h) failed: x; this rank's y",
         "rank 0 (h) failed (relayed from rank 1, rank 2, rank 3, which found it): x; rank 3's y");
  expect(0, "rank 1 (h) failed (relayed from rank 2, rank 3, which found it): rank 4 (h) "
            "failed (relayed from rank 5, which found it): z",
         "rank 0 (h) failed (relayed from rank 1, rank 2, rank 3, rank 4, rank 5, which found "
         "it): z");
  // Not a relay: left as it is.
  expect(7, "", "rank 7 (h) failed: ");
  expect(7, "rank 2 (h) left after its communicator failed: rank 3 (h) failed: q",
         "rank 7 (h) failed: rank 2 (h) left after its communicator failed: rank 3 (h) failed: q");
  expect(7, "rank 2 (h: x) failed: q", "rank 7 (h) failed: rank 2 (h: x) failed: q");
  expect(7, "rank 2 (h) failed (relayed from rank 3", "rank 7 (h) failed: rank 2 (h) failed "
            "(relayed from rank 3");
  // A ") failed" later in the finder's words is not a relay's (its words were cut off).
  expect(2, "rank 4 (h) closed while this rank was in broadcast (root 1) failed: y",
         "rank 2 (h) failed: rank 4 (h) closed while rank 2 was in broadcast (root 1) failed: y");
  // A goodbye's reason, quoted by the rank it reached: its sender's "this rank" named.
  const std::string said = rr::transport::saidBy("4", "this rank was receiving; this rank's");
  if (said == "rank 4 was receiving; rank 4's") {
    ++passed;
  } else {
    ++failed;
    std::printf("FAIL: saidBy: %s\n", said.c_str());
  }
  // Arbitrary bytes (a peer's payload is not trusted): no crash, the text kept at the end.
  std::mt19937 rng(1);
  const std::string parts[] = {"rank ", "1", " (", "h", ") failed", ": ", " (relayed from rank ",
                               ", rank ", ", which found it): ", "this rank", "x", ")"};
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    for (int n = static_cast<int>(rng() % 12); n > 0; --n) s += parts[rng() % 12];
    const std::string got = rr::transport::abortText(9, "h", s);
    if (got.compare(0, 15, "rank 9 (h) fail") != 0) {
      ++failed;
      std::printf("FAIL: %s -> %s\n", s.c_str(), got.c_str());
      break;
    }
  }
  ++passed;
  std::printf("abort_text_check: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
