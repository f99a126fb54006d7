// PLplot's SVG device, one page with two panels.
#include "plot.hpp"

#include <plplot/plplot.h>

#include <algorithm>
#include <filesystem>

#include "opforge/error.hpp"

namespace opforge::cli {
namespace {
void panel(const std::vector<double>& y, double scale, const char* label, const char* title) {
  std::vector<PLFLT> xs, ys;
  for (size_t i = 0; i < y.size(); i++) {
    xs.push_back(PLFLT(i + 1));
    ys.push_back(PLFLT(y[i] * scale));
  }
  auto [lo, hi] = std::minmax_element(ys.begin(), ys.end());
  PLFLT pad = std::max<PLFLT>((*hi - *lo) * 0.1, 1e-3 * std::max<PLFLT>(1, *hi));
  plcol0(1);
  plenv(0.5, PLFLT(y.size()) + 0.5, *lo - pad, *hi + pad, 0, 0);
  pllab("epoch", label, title);
  plcol0(9);
  plwidth(2);
  plline(PLINT(xs.size()), xs.data(), ys.data());
  plpoin(PLINT(xs.size()), xs.data(), ys.data(), 17);
}
}  // namespace

void draw_training_plot(const std::string& path, const std::vector<double>& losses,
                        const std::vector<double>& accuracies) {
  OPFORGE_CHECK(!losses.empty() && losses.size() == accuracies.size())
      << "plot: one loss and one accuracy per epoch";
  std::string tmp = path + ".tmp";
  plsdev("svg");
  plsfnam(tmp.c_str());
  plscolbg(255, 255, 255);
  plscol0(1, 0, 0, 0);       // axes and labels: black on the white page
  plscol0(9, 31, 119, 180);  // the curves
  plspage(0, 0, 900, 400, 0, 0);
  plssub(2, 1);
  plinit();
  panel(losses, 1, "training loss", "Training loss");
  panel(accuracies, 100, "test accuracy (%)", "Test accuracy");
  plend();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  OPFORGE_CHECK(!ec) << "plot: cannot write " << path << ": " << ec.message();
}

}  // namespace opforge::cli
