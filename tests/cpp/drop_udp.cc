// LD_PRELOAD shim for tests: a firewall that passes TCP only. Every UDP datagram this
// process sends to an IP address is dropped (sendto "succeeds", as a packet lost on the way
// does); TCP and Unix sockets are untouched. Built by tests/test_heartbeats.py.
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/types.h>

extern "C" ssize_t sendto(int fd, const void* buf, size_t len, int flags,
                          const struct sockaddr* to, socklen_t tolen) {
  using Fn = ssize_t (*)(int, const void*, size_t, int, const struct sockaddr*, socklen_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "sendto"));
  int type = 0;
  socklen_t n = sizeof(type);
  if (to != nullptr && (to->sa_family == AF_INET || to->sa_family == AF_INET6) &&
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n) == 0 && type == SOCK_DGRAM)
    return static_cast<ssize_t>(len);
  return real(fd, buf, len, flags, to, tolen);
}
