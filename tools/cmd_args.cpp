#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "args.h"

namespace step35::cli {

namespace {

int64_t to_integer(const std::string& name, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    throw UsageError("--" + name + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got '" + v + "'");
  return x;
}

double to_number(const std::string& name, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x) || x < lo || x > hi) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "--%s expects a number in [%g, %g], got '%s'", name.c_str(), lo, hi, v.c_str());
    throw UsageError(buf);
  }
  return x;
}

uint64_t to_unsigned(const std::string& name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || v[0] == '+' || *end != '\0' || errno == ERANGE)
    throw UsageError("--" + name + " expects an integer in [0, 18446744073709551615], got '" + v + "'");
  return uint64_t(x);
}

// A setting's value as --help shows it: integers as they are, numbers in %g form.
std::string shown(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

void ArgParser::flag(const std::string& names, const std::string& value_name, const std::string& help,
                     const std::string& default_text) {
  add(names, value_name, help, default_text);
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       int32_t& target, int64_t lo, int64_t hi, const std::string& default_text) {
  Flag& f = add(names, value_name, help, default_text.empty() ? std::to_string(target) : default_text);
  f.store = [&target, key = f.key, lo, hi](const std::string& v) { target = int32_t(to_integer(key, v, lo, hi)); };
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       int64_t& target, int64_t lo, int64_t hi, const std::string& default_text) {
  Flag& f = add(names, value_name, help, default_text.empty() ? std::to_string(target) : default_text);
  f.store = [&target, key = f.key, lo, hi](const std::string& v) { target = to_integer(key, v, lo, hi); };
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       uint64_t& target, const std::string& default_text) {
  Flag& f = add(names, value_name, help, default_text.empty() ? std::to_string(target) : default_text);
  f.store = [&target, key = f.key](const std::string& v) { target = to_unsigned(key, v); };
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       float& target, double lo, double hi, const std::string& default_text) {
  Flag& f = add(names, value_name, help, default_text.empty() ? shown(double(target)) : default_text);
  f.store = [&target, key = f.key, lo, hi](const std::string& v) { target = float(to_number(key, v, lo, hi)); };
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       double& target, double lo, double hi, const std::string& default_text) {
  Flag& f = add(names, value_name, help, default_text.empty() ? shown(target) : default_text);
  f.store = [&target, key = f.key, lo, hi](const std::string& v) { target = to_number(key, v, lo, hi); };
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       std::string& target, const std::string& default_text) {
  Flag& f = add(names, value_name, help, default_text.empty() ? target : default_text);
  f.store = [&target](const std::string& v) { target = v; };
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       std::function<void(const std::string& value)> store, const std::string& default_text) {
  add(names, value_name, help, default_text).store = std::move(store);
}

void ArgParser::option(const std::string& names, const std::string& help, bool& target, bool value) {
  Flag& f = add(names, "", help, "");
  f.store = [&target, value](const std::string&) { target = value; };
}

void ArgParser::option(const std::string& names, const std::string& value_name, const std::string& help,
                       std::vector<std::string>& target) {
  Flag& f = add(names, value_name, help, "");
  f.repeatable = true;
  f.store = [&target](const std::string& v) { target.push_back(v); };
}

ArgParser::Flag& ArgParser::add(const std::string& names, const std::string& value_name, const std::string& help,
                                const std::string& default_text) {
  Flag f;
  size_t start = 0;
  while (start <= names.size()) {
    size_t comma = names.find(',', start);
    if (comma == std::string::npos) comma = names.size();
    f.names.push_back(names.substr(start, comma - start));
    start = comma + 1;
  }
  const std::string& last = f.names.back();
  f.key = last.substr(last.find_first_not_of('-'));
  f.value_name = value_name;
  f.help = help;
  f.default_text = default_text;
  flags_.push_back(f);
  return flags_.back();
}

void ArgParser::positional(const std::string& name, const std::string& help) {
  positional_help_.push_back({name, help});
}

const ArgParser::Flag* ArgParser::find(const std::string& arg) const {
  for (const auto& f : flags_)
    for (const auto& n : f.names)
      if (n == arg) return &f;
  return nullptr;
}

bool ArgParser::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    std::string inline_value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      inline_value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      has_inline = true;
    }
    if (arg.size() > 1 && arg[0] == '-' && !(arg.size() > 1 && (std::isdigit(arg[1]) || arg[1] == '.'))) {
      const Flag* f = find(arg);
      if (!f) throw UsageError("unknown option '" + arg + "' (see --help)");
      if (f->value_name.empty()) {
        if (has_inline) throw UsageError(std::string("option '").append(arg).append("' takes no value"));
        values_[f->key].assign(1, '1');  // (not = "1": GCC 12 -Wrestrict false positive)
      } else if (has_inline) {
        values_[f->key] = inline_value;
        repeated_[f->key].push_back(inline_value);
      } else {
        if (i + 1 >= args.size()) throw UsageError("option '" + arg + "' needs a value " + f->value_name);
        values_[f->key] = args[++i];
        repeated_[f->key].push_back(args[i]);
      }
    } else {
      if (positionals_.size() >= positional_help_.size())
        throw UsageError("unexpected argument '" + arg + "' (see --help)");
      positionals_.push_back(arg);
    }
  }
  for (const Flag& f : flags_) {
    if (!f.store || !values_.count(f.key)) continue;
    if (f.repeatable)
      for (const std::string& v : repeated_.at(f.key)) f.store(v);
    else
      f.store(values_.at(f.key));
  }
  return true;
}

std::string ArgParser::help() const {
  std::string s = "usage: step35 " + command_ + " [options]";
  for (const auto& p : positional_help_) s += " " + p.first;
  s += "\n\n" + summary_ + "\n\n";
  for (const auto& p : positional_help_) s += "  " + p.first + "\n      " + p.second + "\n";
  s += "options:\n";
  for (const auto& f : flags_) {
    std::string line = "  ";
    for (size_t i = 0; i < f.names.size(); ++i) line += (i ? ", " : "") + f.names[i];
    if (!f.value_name.empty()) line += " " + f.value_name;
    s += line + "\n      " + f.help;
    if (!f.default_text.empty()) s += " (default: " + f.default_text + ")";
    s += "\n";
  }
  s += "  -h, --help\n      show this help\n";
  return s;
}

bool ArgParser::has(const std::string& name) const { return values_.count(name) != 0; }

std::string ArgParser::str(const std::string& name, const std::string& dflt) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : it->second;
}

int64_t ArgParser::i64(const std::string& name, int64_t dflt, int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : to_integer(name, it->second, lo, hi);
}

double ArgParser::f64(const std::string& name, double dflt, double lo, double hi) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : to_number(name, it->second, lo, hi);
}

int run_guarded(const char* command, int (*body)(const std::vector<std::string>&),
                const std::vector<std::string>& args) {
  try {
    return body(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "step35 %s: %s\n", command, e.what());
    return 2;
  }
}

}  // namespace step35::cli
