// The status page's HTML parts, without the coordinator: escaping, numbers and a self-contained
// SVG line chart (status_page.h builds its pages from them).
#ifndef LATCHKEY_SERVER_HTML_PARTS_H_
#define LATCHKEY_SERVER_HTML_PARTS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace latchkey {

// &, <, >, " and ' as entities.
std::string HtmlEscape(absl::string_view text);

// `v` printed with `format` (printf), or "-" when it is not finite.
std::string FormatNumber(double v, const char* format = "%.4f");

// How a series marks its points (the legend shows the same marker).
enum class ChartMarker { kCircle, kSquare, kDiamond };

// One chart series: y per x (x = step), drawn as a polyline with a marker per point.
struct ChartSeries {
  std::string name;
  std::string color;  // CSS color
  std::vector<double> x;
  std::vector<double> y;
  ChartMarker marker = ChartMarker::kCircle;
  bool dashed = false;  // a dashed line (a second kind of series on the same chart)
};
// A self-contained <svg> line chart: the title, under it a legend (one entry per series, wrapped
// to the width), the plot with ticks at "nice" values labelled on both axes (step on x, value on
// y, `y_label` along the y axis), a light grid; "no data yet" when no series has a point.
// Text boxes never overlap: the title, the legend lines and the plot each have their own band.
// A series of more than 400 points is thinned evenly (its last point kept), so the chart stays
// small whatever the step count.
std::string SvgChart(const std::string& title, const std::vector<ChartSeries>& series,
                     const std::string& y_label = "");

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_HTML_PARTS_H_
