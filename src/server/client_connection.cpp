#include "server/client_connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

namespace step35::server {

namespace {

// The numeric host and port of a socket address, as httplib reports them.
bool host_and_port(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  if (a.ss_family != AF_INET && a.ss_family != AF_INET6) return false;
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

}  // namespace

int find_own_socket(const std::function<bool(int fd)>& is_it) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (is_it(int(fd))) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool socket_address(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return rc == 0 && host_and_port(a, len, host, port);
}

ClientConnection::ClientConnection(const httplib::Request& req) {
  fd_ = find_own_socket([&](int fd) {
    std::string local_host, peer_host;
    int local_port = 0, peer_port = 0;
    return socket_address(fd, false, local_host, local_port) && socket_address(fd, true, peer_host, peer_port) &&
           local_port == req.local_port && peer_port == req.remote_port && peer_host == req.remote_addr;
  });
}

bool ClientConnection::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  // Readable: data the client sent ahead (a pipelined request) or the end of the stream.
  char c;
  return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace step35::server
