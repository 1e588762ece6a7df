// Seeing a client leave while its non-streamed request runs. cpp-httplib 0.11 hands a
// handler neither the socket nor a way to ask about it (a streamed response finds out at
// its next write), so the socket is found by its addresses: the one descriptor of this
// process whose local port and peer address and port are the request's.
#pragma once

#include <httplib.h>

#include <functional>
#include <string>

namespace step35::server {

// httplib shows neither a request's socket nor its listening one, so both are found among
// this process's descriptors: the first fd for which is_it(fd) holds, or -1.
int find_own_socket(const std::function<bool(int fd)>& is_it);

// The numeric host and port of the socket's own address (peer = false) or of the address it
// is connected to (peer = true), as httplib reports them; false when it is not an IP socket.
bool socket_address(int fd, bool peer, std::string& host, int& port);

class ClientConnection {
 public:
  // Finds the request's socket; when it cannot be found, gone() is always false.
  explicit ClientConnection(const httplib::Request& req);
  // The peer has closed the connection or reset it (checked without blocking). Only valid
  // while the request's handler runs: the descriptor belongs to the HTTP thread.
  bool gone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace step35::server
