// A registry of named components (models, tasks, optimizers, parallel strategies): each
// implementation registers a name from its own file, and whoever composes them (the trainer) looks
// names up instead of holding an if-chain. An unknown name is an error that lists the valid ones
// and, where one is close, suggests it.
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace atl {

template <typename Entry>
class Registry {
 public:
  // what: the kind of component, for messages ("model", "optimizer", ...).
  explicit Registry(std::string what) : what_(std::move(what)) {}

  // Registering a name twice is a programming error, caught at start-up.
  void add(const std::string& name, Entry e) {
    ATOLL_CHECK(!entries_.count(name), "{} '{}' is registered twice", what_, name);
    entries_.emplace(name, std::move(e));
  }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // key: the config key the name came from (may be empty), named in the error.
  const Entry& get(const std::string& name, const std::string& key = "") const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::string valid;
      for (auto& [n, e] : entries_) valid += (valid.empty() ? "" : ", ") + n;
      std::string near = nearest(name, names());
      bool close = !near.empty() && edit_distance(name, near) <= std::max<size_t>(2, name.size() / 3);
      fail("{}unknown {} '{}'; valid: {}{}", key.empty() ? "" : key + ": ", what_, name, valid,
           close ? " (did you mean '" + near + "'?)" : "");
    }
    return it->second;
  }
  // The entry named by config key `key` (def when unset); an unknown name names the key and where
  // it was set.
  const Entry& lookup(Config& cfg, const std::string& key, const std::string& def, std::string* name = nullptr) const {
    std::string n = cfg.get_string(key, def);
    if (name) *name = n;
    std::string w = cfg.where(key);
    return get(n, w.empty() ? key : key + " (" + w + ")");
  }
  // Sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (auto& [n, e] : entries_) out.push_back(n);
    return out;
  }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::map<std::string, Entry> entries_;
};

}  // namespace atl
