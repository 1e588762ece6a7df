#include "serve_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "support.h"

namespace step35::testing {

int listening_port(const std::string& log_path) {
  static const std::regex kListening(R"(listening on http://[^\s:/]+:(\d+))");
  std::ifstream in(log_path);
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, kListening)) return std::stoi(m[1].str());
  return 0;
}

std::string new_log_file(const std::string& prefix) {
  static std::atomic<int> made{0};
  const std::string path = tmp_dir() + "/" + prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(made++) + ".log";
  std::ofstream(path, std::ios::trunc);
  return path;
}

ServeProcess::ServeProcess(std::vector<std::string> serve_args, const std::string& log_prefix) {
  start({}, std::move(serve_args), log_prefix);
}

ServeProcess::ServeProcess(std::vector<std::string> launcher, std::vector<std::string> serve_args,
                           const std::string& log_prefix) {
  launched_ = !launcher.empty();
  start(std::move(launcher), std::move(serve_args), log_prefix);
}

void ServeProcess::start(std::vector<std::string> launcher, std::vector<std::string> serve_args,
                         const std::string& log_prefix) {
  // A port of the kernel's choosing: a port chosen here and found free could be taken by
  // another test process's server before this one binds it.
  std::vector<std::string> args = launcher;
  args.insert(args.end(), {step35_binary(), "serve"});
  args.insert(args.end(), serve_args.begin(), serve_args.end());
  args.insert(args.end(), {"--port", "0"});
  log_ = new_log_file(log_prefix);
  pid_ = fork();
  if (pid_ == 0) {
    if (!std::freopen(log_.c_str(), "w", stderr)) _exit(126);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 300; ++i) {
    if (port_ == 0) port_ = listening_port(log_);
    if (port_ != 0) {
      httplib::Client c("127.0.0.1", port_);
      auto r = c.Get("/health");
      if (r && r->status == 200) return;
    }
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
