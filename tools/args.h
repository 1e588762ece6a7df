// A small declarative flag parser for the subcommands: each flag is declared once with
// its help text, which is what `--help` prints (and what the README's CLI reference is
// checked against).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace step35::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  // names: "-m,--model"; value_name empty for boolean switches.
  void flag(const std::string& names, const std::string& value_name, const std::string& help,
            const std::string& default_text = "");
  void positional(const std::string& name, const std::string& help);

  // Returns false if --help was given (help printed to stdout). Throws UsageError.
  bool parse(const std::vector<std::string>& args);
  std::string help() const;

  bool has(const std::string& name) const;  // name: the long form without dashes
  std::string str(const std::string& name, const std::string& dflt = "") const;
  // Every value a repeatable flag was given, in order (str() returns the last).
  std::vector<std::string> all(const std::string& name) const;
  int64_t i64(const std::string& name, int64_t dflt, int64_t lo, int64_t hi) const;
  double f64(const std::string& name, double dflt, double lo, double hi) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  struct Flag {
    std::vector<std::string> names;
    std::string key, value_name, help, default_text;
  };
  const Flag* find(const std::string& arg) const;
  std::string command_, summary_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> positional_help_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> repeated_;
  std::vector<std::string> positionals_;
};

// Runs a subcommand body, turning UsageError into exit status 2 with a message.
int run_guarded(const char* command, int (*body)(const std::vector<std::string>&),
                const std::vector<std::string>& args);

}  // namespace step35::cli
