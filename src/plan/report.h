// Text and JSON renderings of predictions, searches and sweeps.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/search.h"
#include "plan/sweep.h"
#include "plan/validation.h"

namespace atl::plan {

std::string human_bytes(double b);
std::string human_seconds(double s);
std::string human_count(double n);

std::string format_prediction(const ModelSpec& m, const Cluster& c, const Layout& l, const Prediction& p);
std::string format_explain(const Prediction& p);
nlohmann::json prediction_json(const ModelSpec& m, const Cluster& c, const Layout& l, const Prediction& p);

std::string format_search(const SearchResult& r, size_t top);
std::string pareto_csv(const std::vector<Candidate>& v);
Plot pareto_plot(const SearchResult& r, const std::string& title);
nlohmann::json search_json(const SearchResult& r, size_t top);

std::string format_sweep(const std::vector<SweepPoint>& pts, const SweepOptions& o);
nlohmann::json sweep_json(const std::vector<SweepPoint>& pts, const SweepOptions& o);

std::string format_validation(const std::vector<ValidationRow>& rows);

}  // namespace atl::plan
