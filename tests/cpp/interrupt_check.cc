// Standalone check that the TCP set-up waits (connectTo, acceptOne, the handshake's
// readFull) run the interrupt hook (core/interrupt.h) while they wait, so that Ctrl-C stops
// a rank whose peer died or stopped during init or group creation -- not after
// RINGREDUCE_CONNECT_TIMEOUT (120 s). The hook here "raises" 0.3 s after it is armed, as a
// Ctrl-C would; each wait has a 10 s deadline and must stop within 2 s.
// Build: g++ -std=c++17 -pthread -I csrc csrc/core/interrupt.cc csrc/core/log.cc
//        csrc/transport/tcp/socket.cc tests/cpp/interrupt_check.cc
// Prints "interrupt_check: N passed, M failed"; exits non-zero when M > 0.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "core/interrupt.h"
#include "transport/tcp/socket.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace rr::transport::tcp;

int passed = 0;
int failed = 0;
Clock::time_point armedAt;
std::atomic<bool> armed{false};

bool fakeCtrlC(std::string* what) {
  if (!armed.load() || Clock::now() - armedAt < std::chrono::milliseconds(300)) return false;
  *what = "KeyboardInterrupt";
  return true;
}

void check(bool ok, const std::string& what) {
  ok ? ++passed : ++failed;
  if (!ok) std::printf("FAIL: %s\n", what.c_str());
}

// Run `wait`; it must throw rr::Interrupted within 2 s (its own deadline is 10 s).
void expectInterrupted(const char* name, const std::function<void()>& wait) {
  armedAt = Clock::now();
  armed = true;
  std::string got = "returned";
  try {
    wait();
  } catch (const rr::Interrupted&) {
    got = "interrupted";
  } catch (const std::exception& e) {
    got = std::string("threw: ") + e.what();
  }
  armed = false;
  const double s = std::chrono::duration<double>(Clock::now() - armedAt).count();
  check(got == "interrupted" && s < 2.0,
        std::string(name) + ": " + got + " after " + std::to_string(s) + " s");
}

}  // namespace

int main() {
  rr::setInterruptCheck(fakeCtrlC);
  int port = 0;
  Fd listener = listenOn("127.0.0.1", 0, &port);
  setNonBlocking(listener.get());
  std::string from;
  expectInterrupted("acceptOne with nobody dialling",
                    [&] { acceptOne(listener.get(), rr::Deadline::after(10), &from); });

  int closedPort = 0;
  { Fd gone = listenOn("127.0.0.1", 0, &closedPort); }  // nothing listens there any more
  expectInterrupted("connectTo a port that refuses (retrying)", [&] {
    connectTo(Endpoint{"127.0.0.1", closedPort}, rr::Deadline::after(10), "check");
  });

  int sv[2];
  check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0, "socketpair");
  char buf[8];
  std::string err;
  expectInterrupted("readFull(interruptible) from a silent peer", [&] {
    readFull(sv[0], buf, sizeof buf, rr::Deadline::after(10), &err, true);
  });
  // Failure paths (an abort's reason, a goodbye) read without the hook: they must not throw.
  armedAt = Clock::now() - std::chrono::seconds(1);
  armed = true;
  bool threw = false, ok = true;
  try {
    ok = readFull(sv[0], buf, sizeof buf, rr::Deadline::after(0.3), &err);
  } catch (...) {
    threw = true;
  }
  armed = false;
  check(!threw && !ok && err == "timed out", "readFull without the hook times out quietly");
  ::close(sv[0]);
  ::close(sv[1]);
  std::printf("interrupt_check: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
