#include "serve_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "support.h"

namespace step35::testing {

bool loopback_port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

ServeProcess::ServeProcess(std::vector<std::string> serve_args, int port_first, int port_last,
                           const std::string& log_prefix) {
  start({}, std::move(serve_args), port_first, port_last, log_prefix);
}

ServeProcess::ServeProcess(std::vector<std::string> launcher, std::vector<std::string> serve_args, int port_first,
                           int port_last, const std::string& log_prefix) {
  launched_ = !launcher.empty();
  start(std::move(launcher), std::move(serve_args), port_first, port_last, log_prefix);
}

void ServeProcess::start(std::vector<std::string> launcher, std::vector<std::string> serve_args, int port_first,
                         int port_last, const std::string& log_prefix) {
  // Successive servers of one test binary take successive ports (a port just released may
  // still be in TIME_WAIT); the pid offset keeps parallel test binaries apart.
  static int next = -1;
  if (next < 0) next = port_first + int(getpid() % ((port_last - port_first) * 4 / 5));
  do port_ = next++; while (!loopback_port_free(port_) && next < port_last);

  std::vector<std::string> args = launcher;
  args.insert(args.end(), {step35_binary(), "serve"});
  args.insert(args.end(), serve_args.begin(), serve_args.end());
  args.insert(args.end(), {"--port", std::to_string(port_)});
  log_ = tmp_dir() + "/" + log_prefix + "_" + std::to_string(port_) + ".log";
  pid_ = fork();
  if (pid_ == 0) {
    if (!std::freopen(log_.c_str(), "w", stderr)) _exit(126);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  httplib::Client c("127.0.0.1", port_);
  for (int i = 0; i < 300; ++i) {
    auto r = c.Get("/health");
    if (r && r->status == 200) return;
    if (!alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "server did not become ready (log: " << log_ << ")";
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0 && launched_) terminate();
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool ServeProcess::alive() const {
  if (pid_ <= 0) return false;
  if (waitpid(pid_, nullptr, WNOHANG) == 0) return true;
  pid_ = -1;
  return false;
}

int ServeProcess::terminate() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 400; ++i) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

}  // namespace step35::testing
