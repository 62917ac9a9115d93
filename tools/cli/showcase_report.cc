// flowkv showcase's table, markdown and report.html (showcase_report.h).
#include "showcase_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace flowkv::cli {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
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

// A markdown cell: '|' would end it.
std::string cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string ratio(int64_t part, int64_t whole) {
  return std::to_string(part) + "/" + std::to_string(whole);
}

// What the step caches skipped, summed over cases: calls, blocks, sublayers, branches.
std::string skipped_of(const std::vector<const std::vector<StepCacheStats>*>& runs) {
  int64_t cs = 0, cf = 0, bs = 0, br = 0, ss = 0, sc = 0, ub = 0;
  bool any = false;
  for (const auto* stats : runs) {
    for (const StepCacheStats& st : *stats) {
      any = true;
      cs += st.calls_skipped, cf += st.calls_full;
      bs += st.blocks_skipped, br += st.blocks_run;
      ss += st.sublayers_reused, sc += st.sublayers_computed;
      ub += st.branches_skipped;
    }
  }
  if (!any) return "-";
  std::string out;
  auto add = [&](const char* what, int64_t skip, int64_t run) {
    if (skip + run == 0) return;
    out += (out.empty() ? "" : ", ") + std::string(what) + " " + ratio(skip, skip + run);
  };
  add("calls", cs, cf);
  add("blocks", bs, br);
  add("sublayers", ss, sc);
  if (ub > 0) out += (out.empty() ? "" : ", ") + std::string("uncond ") + std::to_string(ub);
  return out.empty() ? "none" : out;
}

std::string decisions_of(const std::vector<StepCacheStats>& stats) {
  std::string out;
  for (const StepCacheStats& st : stats) {
    out += (out.empty() ? "" : "; ") + st.name + " " + st.decisions;
  }
  return out;
}

struct Column {
  std::string head;
  bool left = false;
};

// `shorten`: a refusal's reason cut to fit a terminal's table (report.html has it whole).
std::vector<std::vector<std::string>> table_rows(const ShowcaseResults& r, bool shorten) {
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < r.configs.size(); ++i) {
    const ShowcaseRunConfig& c = r.configs[i];
    if (!c.refused.empty()) {
      const std::string why =
          shorten && c.refused.size() > 48 ? c.refused.substr(0, 45) + "..." : c.refused;
      rows.push_back({c.config.label, std::to_string(c.steps), "-", "-", "-", "-", "-", "-", "-",
                      "refused: " + why, "-"});
      continue;
    }
    const ShowcaseSummary s = summarize(r, i);
    const bool truth = s.truth_cases > 0;
    rows.push_back({c.config.label, std::to_string(c.steps), fixed(s.denoise_seconds, 3),
                    fixed(s.speedup, 2) + "x", fixed(s.steps_seconds, 3),
                    truth ? fixed(s.psnr_truth, 2) : "-", truth ? fixed(s.ssim_truth, 4) : "-",
                    fixed(s.psnr_base, 2), fixed(s.ssim_base, 4), s.skipped, s.exact});
  }
  return rows;
}

const std::vector<Column>& columns() {
  static const std::vector<Column> cols = {
      {"config", true},     {"steps"},         {"denoise s"},         {"speed-up"},
      {"loop s"},           {"PSNR truth"},    {"SSIM truth"},        {"PSNR vs uncached"},
      {"SSIM vs uncached"}, {"skipped", true}, {"= without kv", true}};
  return cols;
}

// The plot's point of a configuration: x speed-up, y mean PSNR against the truth (or against
// uncached when no case has a truth).
struct Point {
  std::string label;
  double x = 0, y = 0;
  bool exact_y = false;  // y is +inf (identical to uncached): drawn at the top
  int kind = 0;          // 0 step cache, 1 uncached, 2 kv
};

std::string svg_plot(const ShowcaseResults& r) {
  bool truth = false;
  for (size_t i = 0; i < r.configs.size(); ++i) {
    if (r.configs[i].refused.empty() && summarize(r, i).truth_cases > 0) truth = true;
  }
  std::vector<Point> pts;
  for (size_t i = 0; i < r.configs.size(); ++i) {
    const ShowcaseRunConfig& c = r.configs[i];
    if (!c.refused.empty()) continue;
    const ShowcaseSummary s = summarize(r, i);
    Point p;
    p.label = c.config.label;
    p.x = s.speedup;
    p.y = truth ? s.psnr_truth : s.psnr_base;
    p.exact_y = std::isinf(p.y);
    p.kind = (!c.config.kv && c.config.step_caches.empty())  ? 1
             : (c.config.kv && c.config.step_caches.empty()) ? 2
                                                             : 0;
    if (std::isfinite(p.x) && !std::isnan(p.y)) pts.push_back(p);
  }
  if (pts.empty()) return "<p>(nothing to plot)</p>";
  double x0 = 1, x1 = 1, y0 = kNaN, y1 = kNaN;
  for (const Point& p : pts) {
    x0 = std::min(x0, p.x), x1 = std::max(x1, p.x);
    if (!p.exact_y) y0 = std::isnan(y0) ? p.y : std::min(y0, p.y);
    if (!p.exact_y) y1 = std::isnan(y1) ? p.y : std::max(y1, p.y);
  }
  if (std::isnan(y0)) y0 = 0, y1 = 1;
  const double xpad = std::max(0.05, (x1 - x0) * 0.08), ypad = std::max(0.5, (y1 - y0) * 0.1);
  x0 -= xpad, x1 += xpad, y0 -= ypad, y1 += ypad;
  const bool any_exact =
      std::any_of(pts.begin(), pts.end(), [](const Point& p) { return p.exact_y; });
  const double ytop = any_exact ? y1 + ypad * 2 : y1;  // a band above for "identical"
  constexpr int W = 720, H = 440, L = 64, R = 170, T = 20, B = 48;
  auto sx = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto sy = [&](double y) { return T + (ytop - y) / (ytop - y0) * (H - T - B); };
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n"
                "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" "
                "stroke=\"#888\"/>\n",
                W, H, W, H, L, T, W - L - R, H - T - B);
  s += buf;
  // Ticks: 5 on each axis.
  for (int i = 0; i <= 4; ++i) {
    const double xv = x0 + (x1 - x0) * i / 4, yv = y0 + (y1 - y0) * i / 4;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.2fx</text>\n"
                  "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n",
                  sx(xv), T, sx(xv), H - B, sx(xv), H - B + 14, xv, L, sy(yv), W - R, sy(yv), L - 4,
                  sy(yv) + 4, yv);
    s += buf;
  }
  if (any_exact) {
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">exact</text>\n",
                  L - 4, sy(ytop - ypad) + 4);
    s += buf;
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">speed-up of the denoise stage "
                "vs uncached</text>\n<text transform=\"translate(14 %d) rotate(-90)\" "
                "text-anchor=\"middle\">%s</text>\n",
                L + (W - L - R) / 2, H - 10, T + (H - T - B) / 2,
                truth ? "mean PSNR vs ground truth (dB)" : "mean PSNR vs uncached (dB)");
  s += buf;
  // Labels go right of their point, moved down past labels already placed that they would
  // overlap (about 6.5 px per character at 11 px).
  std::vector<std::array<double, 4>> placed;  // x0, y0, x1, y1
  for (const Point& p : pts) {
    const double px = sx(p.x), py = p.exact_y ? sy(ytop - ypad) : sy(p.y);
    double ly = py + 4;
    const double lw = 6.5 * static_cast<double>(p.label.size());
    for (bool moved = true; moved;) {
      moved = false;
      for (const auto& b : placed) {
        if (px + 7 < b[2] && px + 7 + lw > b[0] && ly - 10 < b[3] && ly + 2 > b[1]) {
          ly = b[3] + 11, moved = true;
        }
      }
    }
    placed.push_back({px + 7, ly - 10, px + 7 + lw, ly + 2});
    if (ly > py + 4) {  // moved: a leader from the point to its label
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" "
                    "stroke-width=\"0.6\"/>",
                    px, py, px + 6, ly - 4);
      s += buf;
    }
    const char* colour = p.kind == 1 ? "#000" : p.kind == 2 ? "#d62728" : "#1f77b4";
    if (p.kind == 0) {
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>", px,
                    py, colour);
    } else {
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" fill=\"%s\"/>", px - 4.5,
                    py - 4.5, colour);
    }
    s += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", px + 7, ly, colour);
    s += buf + escaped(p.label) + "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace

std::string fixed(double v, int digits) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

ShowcaseSummary summarize(const ShowcaseResults& r, size_t config) {
  ShowcaseSummary s;
  const ShowcaseRunConfig& c = r.configs[config];
  double base_seconds = 0, pt = 0, st = 0, pb = 0, sb = 0;
  int n = 0;
  int64_t diff = 0;
  bool exact_known = false;
  std::vector<const std::vector<StepCacheStats>*> stats;
  for (const ShowcaseCaseResult& cr : r.cases) {
    const ShowcaseRun& run = cr.runs[config];
    if (!run.ran) continue;
    ++n;
    s.denoise_seconds += run.denoise_seconds;
    s.steps_seconds += run.steps_seconds;
    if (c.baseline >= 0) base_seconds += cr.runs[static_cast<size_t>(c.baseline)].denoise_seconds;
    if (!cr.c.truth.empty()) pt += run.psnr_truth, st += run.ssim_truth, ++s.truth_cases;
    pb += run.psnr_base, sb += run.ssim_base;
    if (run.exact_diff >= 0) exact_known = true, diff += run.exact_diff;
    stats.push_back(&run.stats);
  }
  s.speedup = s.denoise_seconds > 0 ? base_seconds / s.denoise_seconds : kNaN;
  s.psnr_truth = s.truth_cases ? pt / s.truth_cases : kNaN;
  s.ssim_truth = s.truth_cases ? st / s.truth_cases : kNaN;
  s.psnr_base = n ? pb / n : kNaN;
  s.ssim_base = n ? sb / n : kNaN;
  s.skipped = skipped_of(stats);
  s.exact = !exact_known ? "-" : diff == 0 ? "identical" : std::to_string(diff) + " values differ";
  return s;
}

std::string showcase_table(const ShowcaseResults& r, bool markdown) {
  const std::vector<Column>& cols = columns();
  const std::vector<std::vector<std::string>> rows = table_rows(r, !markdown);
  std::string out;
  if (markdown) {
    for (const Column& c : cols) out += "| " + c.head + " ";
    out += "|\n";
    for (const Column& c : cols) out += c.left ? "|---" : "|---:";
    out += "|\n";
    for (const auto& row : rows) {
      for (const std::string& v : row) out += "| " + cell(v) + " ";
      out += "|\n";
    }
    return out;
  }
  std::vector<size_t> width(cols.size());
  for (size_t i = 0; i < cols.size(); ++i) width[i] = cols[i].head.size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  auto line = [&](const std::vector<std::string>& v) {
    std::string l;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string pad(width[i] - std::min(width[i], v[i].size()), ' ');
      l += (i ? "  " : "") + (cols[i].left ? v[i] + pad : pad + v[i]);
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    return l + "\n";
  };
  std::vector<std::string> head;
  for (const Column& c : cols) head.push_back(c.head);
  out += line(head);
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string showcase_html(const ShowcaseResults& r) {
  std::string h =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>flowkv showcase</title>\n"
      "<style>\n"
      "body{font-family:sans-serif;margin:1.5em;color:#222}\n"
      "table{border-collapse:collapse;font-size:13px}\n"
      "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}\n"
      "td.l,th.l{text-align:left}\n"
      ".row{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}\n"
      "figure{margin:0;font-size:11px;width:140px}\n"
      "figure img{width:128px;height:128px;object-fit:contain;image-rendering:pixelated;"
      "image-rendering:crisp-edges;border:1px solid #bbb;background:#eee}\n"
      "figure.in img{border-color:#2a7}\n"
      "figcaption{word-break:break-all}\n"
      ".bad{color:#c00;font-weight:bold}\n"
      "</style></head><body>\n<h1>flowkv showcase</h1>\n";
  h += "<p>model <code>" + escaped(r.model) + "</code>, cases <code>" + escaped(r.cases_path) +
       "</code>, sweep <code>" + escaped(r.sweep) + "</code>, " + std::to_string(r.cases.size()) +
       " cases; times: each configuration's fastest of " + std::to_string(r.runs) +
       " round(s) after a warm-up, every configuration once per round. Speed-up: the uncached "
       "run's denoise stage time (at the same "
       "step count) over this one's, summed over cases; the stage loads the transformer and runs "
       "the steps, &ldquo;loop s&rdquo; is the steps alone. PSNR / SSIM: against the ground truth "
       "(cases that have one) and against the uncached run (inf: bit-identical). "
       "&ldquo;= without kv&rdquo;: the run with the exact cache against the same step caches "
       "without it, which it must equal.</p>\n";
  h += "<h2>Speed and quality</h2>\n<table>\n<tr>";
  for (const Column& c : columns()) {
    h += std::string("<th") + (c.left ? " class=\"l\"" : "") + ">" + escaped(c.head) + "</th>";
  }
  h += "</tr>\n";
  for (const auto& row : table_rows(r, false)) {
    h += "<tr>";
    for (size_t i = 0; i < row.size(); ++i) {
      const bool bad =
          columns()[i].head == "= without kv" && row[i].find("differ") != std::string::npos;
      h += std::string("<td") + (columns()[i].left ? " class=\"l\"" : "") + ">" +
           (bad ? "<span class=\"bad\">" : "") + escaped(row[i]) + (bad ? "</span>" : "") + "</td>";
    }
    h += "</tr>\n";
  }
  h += "</table>\n<h2>Speed versus quality</h2>\n" + svg_plot(r);
  h +=
      "<p>Black square: uncached; red square: the exact cache (kv) alone; blue: step caches.</p>\n";
  h += "<h2>Cases</h2>\n";
  for (const ShowcaseCaseResult& cr : r.cases) {
    h += "<h3>" + escaped(cr.c.name) + " <small>(" + escaped(cr.c.task) + ")</small></h3>\n";
    h += "<p>&ldquo;" + escaped(cr.c.prompt) + "&rdquo;</p>\n<div class=\"row\">\n";
    for (size_t i = 0; i < cr.reference_files.size(); ++i) {
      h += "<figure class=\"in\"><img src=\"" + escaped(cr.reference_files[i]) +
           "\" alt=\"reference\"><figcaption>reference " + std::to_string(i + 1) +
           "</figcaption></figure>\n";
    }
    if (!cr.truth_file.empty()) {
      h += "<figure class=\"in\"><img src=\"" + escaped(cr.truth_file) +
           "\" alt=\"truth\"><figcaption>ground truth</figcaption></figure>\n";
    }
    for (size_t i = 0; i < r.configs.size(); ++i) {
      const ShowcaseRun& run = cr.runs[i];
      if (!run.ran) continue;
      std::string cap = "<b>" + escaped(r.configs[i].config.label) + "</b><br>" +
                        fixed(run.denoise_seconds, 3) + " s";
      if (!cr.c.truth.empty()) {
        cap += "<br>truth " + fixed(run.psnr_truth, 1) + " dB, " + fixed(run.ssim_truth, 3);
      }
      cap += "<br>uncached " + fixed(run.psnr_base, 1) + " dB, " + fixed(run.ssim_base, 3);
      if (run.exact_diff > 0) {
        cap += "<br><span class=\"bad\">" + std::to_string(run.exact_diff) +
               " values differ without kv</span>";
      }
      const std::string decisions = decisions_of(run.stats);
      h += "<figure><img src=\"" + escaped(run.file) + "\" alt=\"" +
           escaped(r.configs[i].config.label) + "\" title=\"" + escaped(decisions) +
           "\"><figcaption>" + cap + "</figcaption></figure>\n";
    }
    h += "</div>\n";
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace flowkv::cli
