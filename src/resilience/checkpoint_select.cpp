#include "resilience/checkpoint_select.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fileio.h"
#include "resilience/checkpoint.h"

namespace atl {
namespace fs = std::filesystem;

namespace {

// "step_00000042" -> 42; -1 for anything else (including step_N.tmp and step_N.old).
int64_t parse_step(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    int64_t s = parse_step(e.path().filename().string());
    if (s >= 0 && e.is_directory(ec)) out.push_back({s, e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.step < b.step; });
  return out;
}

std::string checkpoint_problem(const std::string& path) {
  try {
    CheckpointStore::verify(path);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return fmt::format("checkpoint '{}' cannot be read: {}", path, e.what());
  }
  // The checksums only say the bytes are the ones written; a tool that rewrote state.json and
  // its manifest entry, or a bug, can still leave a state the trainer cannot use.
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(read_file((fs::path(path) / "state.json").string()));
  } catch (const std::exception& e) {
    return fmt::format("checkpoint '{}': state.json is not valid JSON although its checksum matches ({})", path,
                       e.what());
  }
  if (!st.is_object()) return fmt::format("checkpoint '{}': state.json is not a JSON object", path);
  auto need = [&](const char* key, bool ok) {
    return ok ? std::string() : fmt::format("checkpoint '{}': state.json lacks a valid '{}'", path, key);
  };
  for (auto m : {need("step", st.contains("step") && st["step"].is_number_integer() && st["step"].get<int64_t>() >= 0),
                 need("sample_rng", st.contains("sample_rng") && st["sample_rng"].is_array()),
                 need("train_data", st.contains("train_data") && st["train_data"].is_object())})
    if (!m.empty()) return m;
  int64_t dir_step = parse_step(fs::path(path).filename().string());
  if (dir_step >= 0 && st["step"].get<int64_t>() != dir_step)
    return fmt::format("checkpoint '{}': state.json says step {}, the directory step {}", path,
                       st["step"].get<int64_t>(), dir_step);
  return "";
}

ResumeChoice choose_resume_checkpoint(const std::string& dir) {
  ResumeChoice r;
  std::error_code ec;
  fs::path lp = fs::path(dir) / "latest";
  if (fs::is_regular_file(lp, ec)) {
    try {
      r.latest_hint = trim(read_file(lp.string()));
    } catch (const std::exception&) {
    }
  }
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::string why = checkpoint_problem(it->path);
    if (why.empty()) {
      r.chosen = *it;
      break;
    }
    r.rejected.push_back(fs::path(it->path).filename().string() + ": " + why);
  }
  return r;
}

std::vector<CheckpointEntry> retention_victims(const std::vector<CheckpointEntry>& all, int keep,
                                               const std::set<int64_t>& protect) {
  std::vector<CheckpointEntry> victims;
  if (keep <= 0) return victims;
  size_t excess = all.size() > size_t(keep) ? all.size() - size_t(keep) : 0;
  for (auto& e : all) {  // lowest step first
    if (victims.size() == excess) break;
    if (!protect.count(e.step)) victims.push_back(e);
  }
  return victims;
}

std::vector<std::string> clean_stale_checkpoint_temps(const std::string& dir, std::vector<std::string>* kept) {
  static const std::set<std::string> ours = {"model.safetensors", "optimizer.safetensors", "state.json",
                                             "manifest.json"};
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    size_t dot = n.rfind('.');
    if (dot == std::string::npos || parse_step(n.substr(0, dot)) < 0) continue;
    std::string ext = n.substr(dot);
    if ((ext != ".tmp" && ext != ".old") || !e.is_directory(ec)) continue;
    bool only_ours = true;
    for (auto& f : fs::directory_iterator(e.path(), ec)) {
      std::string fn = f.path().filename().string();
      if (fn.size() > 4 && fn.compare(fn.size() - 4, 4, ".tmp") == 0) fn.resize(fn.size() - 4);
      if (!f.is_regular_file(ec) || !ours.count(fn)) only_ours = false;
    }
    if (only_ours) {
      fs::remove_all(e.path(), ec);
      if (!ec) removed.push_back(e.path().string());
    } else if (kept) {
      kept->push_back(e.path().string());
    }
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::string optimizer_of_state(const std::vector<std::string>& names) {
  std::vector<std::string> groups;
  bool plain = false;
  for (auto& n : names) {
    if (n == "step") plain = true;
    size_t dot = n.find('.');
    if (dot != std::string::npos && n.compare(dot, std::string::npos, ".step") == 0) {
      std::string g = n.substr(0, dot);
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
  }
  if (groups.empty()) return plain ? "adamw" : "";
  // Grouped optimizers name the hidden matrices' optimizer first, AdamW last ("muon+adamw").
  std::stable_partition(groups.begin(), groups.end(), [](const std::string& g) { return g != "adamw"; });
  std::string out;
  for (auto& g : groups) out += (out.empty() ? "" : "+") + g;
  return out;
}

}  // namespace atl
