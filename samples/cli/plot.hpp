// The run folder's plot: training loss and test accuracy against epochs, drawn by PLplot.
#pragma once
#include <string>
#include <vector>

namespace opforge::cli {

// Writes an SVG with two panels (loss, accuracy in %) to `path`; an Error if PLplot cannot.
void draw_training_plot(const std::string& path, const std::vector<double>& losses,
                        const std::vector<double>& accuracies);

}  // namespace opforge::cli
