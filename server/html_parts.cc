// The status page's HTML parts: escaping, numbers, and the SVG line chart (html_parts.h).
#include "server/html_parts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace latchkey {
namespace {

// At most this many points per chart: a long job's history is thinned evenly (the last step
// is always kept), so a page stays small whatever the step count.
constexpr size_t kMaxChartPoints = 400;

}  // namespace

std::string FormatNumber(double v, const char* format) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// Evenly spaced tick values over [lo, hi] at a "nice" step (1, 2 or 5 times a power of ten) of
// at most 6 intervals; `integral`: the step is at least 1 (steps are whole numbers). The axis
// is widened to the outer ticks, so both ends carry a label.
struct Ticks {
  double lo = 0, hi = 1, step = 1;
  int decimals = 0;  // digits after the point that tell neighbouring ticks apart
};
Ticks NiceTicks(double lo, double hi, bool integral) {
  Ticks t;
  if (!(hi > lo)) {
    lo -= integral ? 1.0 : 0.5;
    hi += integral ? 1.0 : 0.5;
  }
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  t.step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  if (integral) t.step = std::max(1.0, std::round(t.step));
  t.lo = std::floor(lo / t.step + 1e-9) * t.step;
  t.hi = std::ceil(hi / t.step - 1e-9) * t.step;
  if (t.hi <= t.lo) t.hi = t.lo + t.step;
  t.decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(t.step) - 1e-9)), 0, 8);
  return t;
}

std::string TickLabel(double v, int decimals) {
  if (std::fabs(v) < 1e-12) v = 0;  // no "-0"
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// A series' point marker at (x, y): circles, squares or diamonds of about 5 px.
std::string Marker(ChartMarker m, double x, double y, const std::string& color) {
  const std::string fill = absl::StrCat("\" fill=\"", color, "\"/>");
  switch (m) {
    case ChartMarker::kSquare:
      return absl::StrCat("<rect class=\"marker\" x=\"", FormatNumber(x - 2.5, "%.1f"), "\" y=\"",
                          FormatNumber(y - 2.5, "%.1f"), "\" width=\"5\" height=\"5", fill);
    case ChartMarker::kDiamond:
      return absl::StrCat("<path class=\"marker\" d=\"M", FormatNumber(x, "%.1f"), " ",
                          FormatNumber(y - 3.5, "%.1f"), "l3.5 3.5l-3.5 3.5l-3.5 -3.5z", fill);
    case ChartMarker::kCircle:
    default:
      return absl::StrCat("<circle cx=\"", FormatNumber(x, "%.1f"), "\" cy=\"",
                          FormatNumber(y, "%.1f"), "\" r=\"2", fill);
  }
}

// A generous width of `text` in `font_px` sans-serif (wider than the widest common glyphs'
// average), so laid-out labels never run into each other.
double TextWidth(absl::string_view text, double font_px) {
  return static_cast<double>(text.size()) * font_px * 0.62;
}

}  // namespace

std::string SvgChart(const std::string& title, const std::vector<ChartSeries>& series,
                     const std::string& y_label) {
  // The title on the first line, the legend on its own line(s) under it, then the plot with
  // the value ticks on its left (the y label turned along them) and the step ticks under it.
  constexpr double kW = 600, kLeft = 86, kRight = 18, kPlotH = 150, kBottom = 42;
  constexpr double kTitleY = 17, kLegendFirstY = 36, kLegendLine = 17;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const ChartSeries& s : series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  }
  // The legend: one entry per series (a line with its marker, then the name), wrapped.
  std::string legend;
  double lx = kLeft, ly = kLegendFirstY;
  for (const ChartSeries& s : series) {
    const double w = 26 + TextWidth(s.name, 12) + 18;
    if (lx > kLeft && lx + w > kW - kRight) {
      lx = kLeft;
      ly += kLegendLine;
    }
    absl::StrAppend(&legend, "<g class=\"legend-entry\"><line x1=\"", lx, "\" y1=\"", ly - 4,
                    "\" x2=\"", lx + 20, "\" y2=\"", ly - 4, "\" stroke=\"", s.color,
                    "\" stroke-width=\"1.5\"", s.dashed ? " stroke-dasharray=\"4 2\"" : "", "/>",
                    Marker(s.marker, lx + 10, ly - 4, s.color), "<text class=\"legend\" x=\"",
                    lx + 26, "\" y=\"", ly, "\" font-size=\"12\" fill=\"", s.color, "\">",
                    HtmlEscape(s.name), "</text></g>");
    lx += w;
  }
  const double top = (series.empty() ? kTitleY : ly) + 14;
  const double bottom = top + kPlotH;
  const double height = bottom + kBottom;
  std::string out = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"", kW, "\" height=\"",
      height, "\" viewBox=\"0 0 ", kW, " ", height, "\"><text class=\"chart-title\" x=\"8\" y=\"",
      kTitleY, "\" font-size=\"13\" font-weight=\"bold\">", HtmlEscape(title), "</text>", legend);
  if (!std::isfinite(x0)) {
    absl::StrAppend(&out, "<text x=\"", kW / 2 - 40, "\" y=\"", (top + bottom) / 2,
                    "\" font-size=\"12\" fill=\"#888\">no data yet</text></svg>");
    return out;
  }
  const Ticks tx = NiceTicks(x0, x1, /*integral=*/true);
  const Ticks ty = NiceTicks(y0, y1, /*integral=*/false);
  const auto px = [&](double x) {
    return kLeft + (x - tx.lo) / (tx.hi - tx.lo) * (kW - kLeft - kRight);
  };
  const auto py = [&](double y) { return top + (ty.hi - y) / (ty.hi - ty.lo) * kPlotH; };
  // Grid, axes, tick marks and their labels.
  std::string grid = "<g stroke=\"#e4e4e4\">", marks = "<g stroke=\"#777\">";
  std::string xlabels =
      "<g class=\"tick-x\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">";
  std::string ylabels = "<g class=\"tick-y\" font-size=\"11\" fill=\"#444\" text-anchor=\"end\">";
  const int nx = static_cast<int>(std::llround((tx.hi - tx.lo) / tx.step));
  for (int i = 0; i <= nx; ++i) {
    const double v = tx.lo + i * tx.step, x = px(v);
    absl::StrAppend(&grid, "<line x1=\"", FormatNumber(x, "%.1f"), "\" y1=\"", top, "\" x2=\"",
                    FormatNumber(x, "%.1f"), "\" y2=\"", bottom, "\"/>");
    absl::StrAppend(&marks, "<line x1=\"", FormatNumber(x, "%.1f"), "\" y1=\"", bottom, "\" x2=\"",
                    FormatNumber(x, "%.1f"), "\" y2=\"", bottom + 4, "\"/>");
    absl::StrAppend(&xlabels, "<text x=\"", FormatNumber(x, "%.1f"), "\" y=\"", bottom + 20, "\">",
                    TickLabel(v, 0), "</text>");
  }
  const int ny = static_cast<int>(std::llround((ty.hi - ty.lo) / ty.step));
  for (int i = 0; i <= ny; ++i) {
    const double v = ty.lo + i * ty.step, y = py(v);
    absl::StrAppend(&grid, "<line x1=\"", kLeft, "\" y1=\"", FormatNumber(y, "%.1f"), "\" x2=\"",
                    kW - kRight, "\" y2=\"", FormatNumber(y, "%.1f"), "\"/>");
    absl::StrAppend(&marks, "<line x1=\"", kLeft - 4, "\" y1=\"", FormatNumber(y, "%.1f"),
                    "\" x2=\"", kLeft, "\" y2=\"", FormatNumber(y, "%.1f"), "\"/>");
    absl::StrAppend(&ylabels, "<text x=\"", kLeft - 7, "\" y=\"", FormatNumber(y + 4, "%.1f"),
                    "\">", TickLabel(v, ty.decimals), "</text>");
  }
  absl::StrAppend(&marks, "<line x1=\"", kLeft, "\" y1=\"", bottom, "\" x2=\"", kW - kRight,
                  "\" y2=\"", bottom, "\"/><line x1=\"", kLeft, "\" y1=\"", top, "\" x2=\"", kLeft,
                  "\" y2=\"", bottom, "\"/></g>");
  absl::StrAppend(&out, grid, "</g>", marks, xlabels, "</g>", ylabels, "</g>",
                  "<text class=\"axis-label\" x=\"", (kLeft + kW - kRight) / 2, "\" y=\"",
                  height - 6,
                  "\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">step</text>");
  if (!y_label.empty()) {
    const double cy = (top + bottom) / 2;
    absl::StrAppend(
        &out, "<text class=\"axis-label\" x=\"14\" y=\"", cy,
        "\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\" transform=\"rotate(-90 14 ", cy,
        ")\">", HtmlEscape(y_label), "</text>");
  }
  for (const ChartSeries& s : series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    const size_t stride = n > kMaxChartPoints ? (n + kMaxChartPoints - 1) / kMaxChartPoints : 1;
    std::string points, dots;
    for (size_t i = 0; i < n; i += stride) {
      const size_t k = (i + stride >= n) ? n - 1 : i;  // keep the last point
      if (!std::isfinite(s.y[k])) continue;
      const double x = px(s.x[k]), y = py(s.y[k]);
      absl::StrAppend(&points, points.empty() ? "" : " ", FormatNumber(x, "%.1f"), ",",
                      FormatNumber(y, "%.1f"));
      dots += Marker(s.marker, x, y, s.color);
    }
    absl::StrAppend(&out, "<polyline class=\"series\" data-series=\"", HtmlEscape(s.name),
                    "\" fill=\"none\" stroke=\"", s.color, "\" stroke-width=\"1.5\"",
                    s.dashed ? " stroke-dasharray=\"4 2\"" : "", " points=\"", points, "\"/>",
                    dots);
  }
  out += "</svg>";
  return out;
}

}  // namespace latchkey
