// A `step35 serve` child process on 127.0.0.1 for the HTTP tests: picks a free port in a
// range, waits until /health says ready, and kills and reaps the child on every path out
// of a test (a failed assertion must not leave a server running).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace step35::testing {

bool loopback_port_free(int port);

class ServeProcess {
 public:
  // Runs `step35 serve <serve_args> --port P` with P the first free port from
  // [port_first, port_last); stderr goes to tmp_dir()/<log_prefix>_<port>.log.
  ServeProcess(std::vector<std::string> serve_args, int port_first, int port_last, const std::string& log_prefix);
  // The same under a launcher (e.g. {"mpirun", "-np", "2"}): runs `launcher... step35 serve
  // ...`; stopped with SIGTERM first (mpirun passes it on to its ranks), SIGKILL after 20 s.
  ServeProcess(std::vector<std::string> launcher, std::vector<std::string> serve_args, int port_first, int port_last,
               const std::string& log_prefix);
  ~ServeProcess();
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  // Where the child's stderr goes.
  const std::string& log_path() const { return log_; }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  // True while the child has not exited.
  bool alive() const;
  // SIGTERM, then the exit status once it exits (-1 if it was killed by a signal or did not
  // exit within 20 s).
  int terminate();

 private:
  void start(std::vector<std::string> launcher, std::vector<std::string> serve_args, int port_first, int port_last,
             const std::string& log_prefix);
  int port_ = 0;
  bool launched_ = false;  // under a launcher: SIGTERM first when done
  std::string log_;
  mutable pid_t pid_ = -1;  // -1 once reaped
};

}  // namespace step35::testing
