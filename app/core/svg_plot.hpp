// A small SVG line plot with logarithmic axes (for `flashlab traffic attention --svg`): one
// polyline per series, a point marker per measured value, axis labels, decade ticks, a legend.
// Standalone SVG 1.1, viewable in any browser.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flashlab::app {

/// One line of the plot.
struct SvgSeries {
  std::string name;                                 ///< legend text
  std::vector<std::pair<double, double>> points;    ///< (x, y), both > 0 (log axes)
  bool measured = false;                            ///< dashed with point markers (else a solid model line)
  int colour = 0;                                   ///< palette index: a model and its measurement share one
};

/// The whole plot.
struct SvgPlot {
  std::string title;               ///< top line
  std::string x_label;             ///< under the x axis
  std::string y_label;             ///< beside the y axis
  std::string note;                ///< an extra line under the title (empty: none)
  std::vector<SvgSeries> series;   ///< lines, drawn in order
};

/// The plot as an SVG document. Points with x or y ≤ 0 (or not finite) are left out.
/// @throws std::invalid_argument when no series has a drawable point.
std::string render_svg(const SvgPlot& plot);

}  // namespace flashlab::app
