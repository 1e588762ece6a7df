// A `step35 serve` child process on 127.0.0.1 for the HTTP tests: on a port the kernel
// picks (--port 0, read back from the server's log, so servers of parallel test processes
// never collide), waits until /health says ready, and kills and reaps the child on every path out
// of a test (a failed assertion must not leave a server running).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace step35::testing {

// The port of a `step35 serve` log's "listening on http://HOST:PORT" line (text or JSON
// log), or 0 while the server has not written one.
int listening_port(const std::string& log_path);

// A new, empty log file tmp_dir()/<prefix>_<test pid>_<n>.log for a child's stderr. Made
// empty here, before the child starts: pids recur (pid_max is often 32768) across the test
// runs that share tmp_dir(), and a log an earlier run left under the same name would show
// that run's port to whoever reads it before the child has truncated it.
std::string new_log_file(const std::string& prefix);

class ServeProcess {
 public:
  // Runs `step35 serve <serve_args> --port 0`; stderr goes to
  // tmp_dir()/<log_prefix>_<test pid>_<n>.log.
  ServeProcess(std::vector<std::string> serve_args, const std::string& log_prefix);
  // The same under a launcher (e.g. {"mpirun", "-np", "2"}): runs `launcher... step35 serve
  // ...`; stopped with SIGTERM first (mpirun passes it on to its ranks), SIGKILL after 20 s.
  ServeProcess(std::vector<std::string> launcher, std::vector<std::string> serve_args, const std::string& log_prefix);
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
  void start(std::vector<std::string> launcher, std::vector<std::string> serve_args, const std::string& log_prefix);
  int port_ = 0;
  bool launched_ = false;  // under a launcher: SIGTERM first when done
  std::string log_;
  mutable pid_t pid_ = -1;  // -1 once reaped
};

}  // namespace step35::testing
