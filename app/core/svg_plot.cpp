// The SVG line plot (svg_plot.hpp): log-log axes over the data's decades.
#include "core/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace flashlab::app {

namespace {

constexpr double kWidth = 880, kHeight = 560;
constexpr double kLeft = 96, kRight = 250, kTop = 64, kBottom = 72;  // margins; the legend sits right
constexpr const char* kPalette[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A power of ten as a label: 1e3 → "1k", 1e9 → "1G" (bytes), else 10^k.
std::string decade_label(int k) {
  static const char* si[] = {"1", "10", "100", "1k", "10k", "100k", "1M", "10M", "100M",
                             "1G", "10G", "100G", "1T", "10T", "100T"};
  if (k >= 0 && k < 15) return si[k];
  return "1e" + std::to_string(k);
}

bool drawable(const std::pair<double, double>& p) {
  return std::isfinite(p.first) && std::isfinite(p.second) && p.first > 0 && p.second > 0;
}

struct Axis {
  int lo = 0, hi = 1;  // decades
  double pixel(double v, double from, double to) const {
    return from + (std::log10(v) - lo) / double(hi - lo) * (to - from);
  }
};

}  // namespace

std::string render_svg(const SvgPlot& plot) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const auto& s : plot.series)
    for (const auto& p : s.points)
      if (drawable(p)) {
        xmin = std::min(xmin, p.first), xmax = std::max(xmax, p.first);
        ymin = std::min(ymin, p.second), ymax = std::max(ymax, p.second);
      }
  if (!(xmin <= xmax)) throw std::invalid_argument("nothing to plot: no series has a point with x > 0 and y > 0");
  Axis ax{int(std::floor(std::log10(xmin))), int(std::ceil(std::log10(xmax)))};
  Axis ay{int(std::floor(std::log10(ymin))), int(std::ceil(std::log10(ymax)))};
  if (ax.hi == ax.lo) ++ax.hi;
  if (ay.hi == ay.lo) ++ay.hi;
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;

  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << kWidth << "\" height=\"" << kHeight
     << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
     << "<rect x=\"0\" y=\"0\" width=\"" << kWidth << "\" height=\"" << kHeight << "\" fill=\"white\"/>\n"
     << "<text x=\"" << kWidth / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << escape(plot.title)
     << "</text>\n";
  if (!plot.note.empty())
    os << "<text x=\"" << kWidth / 2 << "\" y=\"44\" text-anchor=\"middle\" fill=\"#555\">" << escape(plot.note)
       << "</text>\n";
  // Grid and ticks, one per decade.
  os << "<g class=\"grid\" stroke=\"#ddd\" stroke-width=\"1\">\n";
  for (int k = ax.lo; k <= ax.hi; ++k) {
    const double x = ax.pixel(std::pow(10.0, k), x0, x1);
    os << "<line x1=\"" << fmt(x) << "\" y1=\"" << fmt(y0) << "\" x2=\"" << fmt(x) << "\" y2=\"" << fmt(y1) << "\"/>\n";
  }
  for (int k = ay.lo; k <= ay.hi; ++k) {
    const double y = ay.pixel(std::pow(10.0, k), y0, y1);
    os << "<line x1=\"" << fmt(x0) << "\" y1=\"" << fmt(y) << "\" x2=\"" << fmt(x1) << "\" y2=\"" << fmt(y) << "\"/>\n";
  }
  os << "</g>\n<g class=\"ticks\">\n";
  for (int k = ax.lo; k <= ax.hi; ++k)
    os << "<text x=\"" << fmt(ax.pixel(std::pow(10.0, k), x0, x1)) << "\" y=\"" << fmt(y0 + 20)
       << "\" text-anchor=\"middle\">" << decade_label(k) << "</text>\n";
  for (int k = ay.lo; k <= ay.hi; ++k)
    os << "<text x=\"" << fmt(x0 - 8) << "\" y=\"" << fmt(ay.pixel(std::pow(10.0, k), y0, y1) + 4)
       << "\" text-anchor=\"end\">" << decade_label(k) << "</text>\n";
  os << "</g>\n";
  os << "<rect x=\"" << fmt(x0) << "\" y=\"" << fmt(y1) << "\" width=\"" << fmt(x1 - x0) << "\" height=\""
     << fmt(y0 - y1) << "\" fill=\"none\" stroke=\"#333\"/>\n";
  os << "<text class=\"x-label\" x=\"" << fmt((x0 + x1) / 2) << "\" y=\"" << fmt(kHeight - 24)
     << "\" text-anchor=\"middle\">" << escape(plot.x_label) << " (log scale)</text>\n";
  os << "<text class=\"y-label\" x=\"22\" y=\"" << fmt((y0 + y1) / 2) << "\" text-anchor=\"middle\" transform=\"rotate(-90 22 "
     << fmt((y0 + y1) / 2) << ")\">" << escape(plot.y_label) << " (log scale)</text>\n";
  // Series and legend.
  double ly = kTop + 8;
  for (const auto& s : plot.series) {
    const char* colour = kPalette[static_cast<std::size_t>(std::max(0, s.colour)) % std::size(kPalette)];
    std::string pts;
    for (const auto& p : s.points)
      if (drawable(p)) {
        if (!pts.empty()) pts += ' ';
        pts += fmt(ax.pixel(p.first, x0, x1));
        pts += ',';
        pts += fmt(ay.pixel(p.second, y0, y1));
      }
    if (pts.empty()) continue;
    os << "<polyline class=\"series\" data-name=\"" << escape(s.name) << "\" fill=\"none\" stroke=\"" << colour
       << "\" stroke-width=\"2\"" << (s.measured ? " stroke-dasharray=\"6 4\"" : "") << " points=\"" << pts << "\"/>\n";
    if (s.measured) {
      for (const auto& p : s.points)
        if (drawable(p))
          os << "<circle class=\"point\" cx=\"" << fmt(ax.pixel(p.first, x0, x1)) << "\" cy=\""
             << fmt(ay.pixel(p.second, y0, y1)) << "\" r=\"4\" fill=\"" << colour << "\"/>\n";
    }
    os << "<line class=\"legend\" x1=\"" << fmt(x1 + 16) << "\" y1=\"" << fmt(ly) << "\" x2=\"" << fmt(x1 + 44)
       << "\" y2=\"" << fmt(ly) << "\" stroke=\"" << colour << "\" stroke-width=\"2\""
       << (s.measured ? " stroke-dasharray=\"6 4\"" : "") << "/>\n"
       << "<text x=\"" << fmt(x1 + 50) << "\" y=\"" << fmt(ly + 4) << "\" font-size=\"11\">" << escape(s.name)
       << "</text>\n";
    ly += 22;
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace flashlab::app
