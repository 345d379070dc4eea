// Config: TOML files plus command-line overrides, read through typed getters.
//
// The set of valid keys is exactly the set the program asks for: every getter records its key,
// and finish() rejects whatever the file or the command line set that nobody read, naming the
// key, where it was set (file:line, or the command line) and the nearest valid key.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace atl {

class Config {
 public:
  Config();
  ~Config();
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;

  static Config load(const std::string& path);
  static Config parse(const std::string& text, const std::string& source_name);

  // "section.key=value"; the value is read as TOML (numbers, bools, quoted or bare strings).
  void set_override(const std::string& assignment);

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
  double get_float(const std::string& key, double def, double lo = -1e300, double hi = 1e300);
  bool get_bool(const std::string& key, bool def);
  std::string get_string(const std::string& key, const std::string& def,
                         const std::vector<std::string>& allowed = {});
  std::vector<double> get_float_list(const std::string& key, const std::vector<double>& def);
  std::vector<int64_t> get_int_list(const std::string& key, const std::vector<int64_t>& def);
  // Keys under a section prefix that the file or overrides set (for tables of named entries).
  std::vector<std::string> keys_under(const std::string& prefix) const;
  // Marks a key as known without reading it (for sections read by another component).
  void accept(const std::string& key);

  // Where a key was set: "file.toml:12" or "command line", empty if unset.
  std::string where(const std::string& key) const;
  // Throws on keys that were set but never read.
  void finish() const;
  const std::string& source() const;
  // Every key the file and the command line set, with its value, as canonical TOML (sorted keys):
  // two ranks with the same effective config get the same text (the pre-run gate hashes it).
  // `except` names keys left out ("run.dir": a per-host path that may differ between ranks).
  std::string canonical(const std::vector<std::string>& except = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Levenshtein distance, used to suggest the nearest valid name.
size_t edit_distance(const std::string& a, const std::string& b);
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace atl
