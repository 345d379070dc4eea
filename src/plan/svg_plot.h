// A small SVG line/scatter plot writer for the planner's search and sweep outputs, so the plots
// need no plotting library.
#pragma once
#include <string>
#include <vector>

namespace atl::plan {

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::string color = "#1f77b4";
  bool line = true, points = true;
  double point_radius = 3;
  bool right_axis = false;  // plotted against the secondary y axis
};

struct Plot {
  std::string title, xlabel, ylabel, y2label;
  bool logx = false, logy = false;
  std::vector<Series> series;
  std::vector<std::pair<double, std::string>> vlines;  // annotated x positions
  int width = 820, height = 520;
};

std::string render_svg(const Plot& p);
void write_file(const std::string& path, const std::string& text);

}  // namespace atl::plan
