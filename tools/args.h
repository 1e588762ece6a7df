// A small declarative flag parser for the subcommands: each flag is declared once with
// its help text, which is what `--help` prints (and what the README's CLI reference is
// checked against, text for text). A flag bound to a setting (option()) takes its default
// from that setting, i.e. from the options struct it belongs to, and parse() stores the
// value given there: the help, the README and the behaviour cannot disagree.
#pragma once

#include <cstdint>
#include <functional>
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

  // A flag read with has() / str() / i64() / f64(). names: "-m,--model"; value_name empty
  // for a switch; default_text: what applies when the flag is absent (--help shows it).
  void flag(const std::string& names, const std::string& value_name, const std::string& help,
            const std::string& default_text = "");
  // A flag bound to a setting. --help shows the setting's current value as the default,
  // unless default_text describes one decided later (the number of cores, the model's own
  // context); parse() stores the given value in the setting, checked against [lo, hi].
  void option(const std::string& names, const std::string& value_name, const std::string& help, int32_t& target,
              int64_t lo, int64_t hi, const std::string& default_text = "");
  void option(const std::string& names, const std::string& value_name, const std::string& help, int64_t& target,
              int64_t lo, int64_t hi, const std::string& default_text = "");
  void option(const std::string& names, const std::string& value_name, const std::string& help, uint64_t& target,
              const std::string& default_text = "");  // the full unsigned 64-bit range
  void option(const std::string& names, const std::string& value_name, const std::string& help, float& target,
              double lo, double hi, const std::string& default_text = "");
  void option(const std::string& names, const std::string& value_name, const std::string& help, double& target,
              double lo, double hi, const std::string& default_text = "");
  void option(const std::string& names, const std::string& value_name, const std::string& help, std::string& target,
              const std::string& default_text = "");
  // A flag whose value `store` parses into its setting (throwing UsageError for a bad one),
  // for settings of a type of their own; default_text shows the setting's current value.
  void option(const std::string& names, const std::string& value_name, const std::string& help,
              std::function<void(const std::string& value)> store, const std::string& default_text);
  // A switch bound to a setting: parse() sets it to `value` when the switch is given.
  void option(const std::string& names, const std::string& help, bool& target, bool value = true);
  // A repeatable flag bound to a list: parse() appends every value given, in order.
  void option(const std::string& names, const std::string& value_name, const std::string& help,
              std::vector<std::string>& target);
  void positional(const std::string& name, const std::string& help);

  // Returns false if --help was given (help printed to stdout). Throws UsageError.
  bool parse(const std::vector<std::string>& args);
  std::string help() const;

  bool has(const std::string& name) const;  // name: the long form without dashes
  std::string str(const std::string& name, const std::string& dflt = "") const;
  int64_t i64(const std::string& name, int64_t dflt, int64_t lo, int64_t hi) const;
  double f64(const std::string& name, double dflt, double lo, double hi) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  struct Flag {
    std::vector<std::string> names;
    std::string key, value_name, help, default_text;
    std::function<void(const std::string& value)> store;  // bound flags: into their setting
    bool repeatable = false;  // store() gets every value given, not only the last
  };
  Flag& add(const std::string& names, const std::string& value_name, const std::string& help,
            const std::string& default_text);
  const Flag* find(const std::string& arg) const;
  std::string command_, summary_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> positional_help_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> repeated_;  // every value of each flag, in order
  std::vector<std::string> positionals_;
};

// Runs a subcommand body, turning UsageError into exit status 2 with a message.
int run_guarded(const char* command, int (*body)(const std::vector<std::string>&),
                const std::vector<std::string>& args);

}  // namespace step35::cli
