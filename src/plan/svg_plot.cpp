// SVG rendering of simple plots: linear or log axes with "nice" ticks (1-2-5 steps), a legend,
// and an optional secondary y axis.
#include "plan/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fstream>

#include "core/error.h"

namespace atl::plan {

namespace {
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double map(double v, double a, double b) const {
    double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return a + t * (b - a);
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log) {
      for (double d = std::pow(10, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10)
        for (double m : {1.0, 2.0, 5.0})
          if (d * m >= lo * 0.9999 && d * m <= hi * 1.0001) t.push_back(d * m);
      return t;
    }
    double span = hi - lo, raw = span / 6, mag = std::pow(10, std::floor(std::log10(raw)));
    double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-6; v += step) t.push_back(v);
    return t;
  }
};
Axis fit(std::vector<double> v, bool log) {
  Axis a;
  a.log = log;
  v.erase(std::remove_if(v.begin(), v.end(), [&](double x) { return !std::isfinite(x) || (log && x <= 0); }), v.end());
  if (v.empty()) return a;
  auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  a.lo = *mn, a.hi = *mx;
  if (log) {
    if (a.hi <= a.lo) a.hi = a.lo * 10;
    a.lo /= 1.2, a.hi *= 1.2;
  } else {
    double pad = (a.hi - a.lo) * 0.05;
    if (pad == 0) pad = std::fabs(a.hi) * 0.1 + 1;
    a.lo -= pad, a.hi += pad;
    if (*mn >= 0 && a.lo < 0) a.lo = 0;
  }
  return a;
}
std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}
std::string num(double v) { return fmt::format("{:.3g}", v); }
}  // namespace

std::string render_svg(const Plot& p) {
  const double L = 80, R = p.width - 80, T = 50, B = p.height - 60;
  std::vector<double> xs, ys, y2s;
  for (auto& s : p.series) {
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    (s.right_axis ? y2s : ys).insert((s.right_axis ? y2s : ys).end(), s.y.begin(), s.y.end());
  }
  Axis ax = fit(xs, p.logx), ay = fit(ys, p.logy), ay2 = fit(y2s, false);
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      p.width, p.height);
  o += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", p.width / 2, esc(p.title));
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", L, T, R - L, B - T);
  for (double t : ax.ticks()) {
    double x = ax.map(t, L, R);
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n", x, T, B, B + 16, num(t));
  }
  for (double t : ay.ticks()) {
    double y = ay.map(t, B, T);
    o += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n", L, y, R, L - 6, y + 4, num(t));
  }
  if (!y2s.empty())
    for (double t : ay2.ticks())
      o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"start\">{}</text>\n", R + 6, ay2.map(t, B, T) + 4, num(t));
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (L + R) / 2, p.height - 18, esc(p.xlabel));
  o += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                   (T + B) / 2, esc(p.ylabel));
  if (!y2s.empty())
    o += fmt::format("<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" transform=\"rotate(90 {0} {1})\">{2}</text>\n",
                     p.width - 14, (T + B) / 2, esc(p.y2label));
  for (auto& [x, label] : p.vlines) {
    if (ax.log && x <= 0) continue;
    double px = ax.map(x, L, R);
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#d62728\" stroke-dasharray=\"5,4\"/>"
                     "<text x=\"{3:.1f}\" y=\"{4}\" fill=\"#d62728\">{5}</text>\n", px, T, B, px + 4, T + 14, esc(label));
  }
  int legend = 0;
  for (auto& s : p.series) {
    const Axis& yy = s.right_axis ? ay2 : ay;
    std::string pts;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (ax.log && s.x[i] <= 0) || (yy.log && s.y[i] <= 0)) continue;
      double x = ax.map(s.x[i], L, R), y = yy.map(s.y[i], B, T);
      pts += fmt::format("{:.1f},{:.1f} ", x, y);
      if (s.points)
        o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\" fill-opacity=\"0.7\"/>\n", x, y,
                         s.point_radius, s.color);
    }
    if (s.line && !pts.empty())
      o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts, s.color);
    if (!s.name.empty()) {
      double ly = T + 16 + 16 * legend++;
      o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                       L + 10, ly - 10, s.color, L + 28, ly, esc(s.name));
    }
  }
  o += "</svg>\n";
  return o;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  ATOLL_CHECK(f.good(), "cannot write '{}'", path);
  f << text;
  ATOLL_CHECK(f.good(), "writing '{}' failed", path);
}

}  // namespace atl::plan
