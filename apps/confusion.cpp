#include "apps/confusion.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace nt::app {

int predicted_class(const float* logits, int classes) {
  int best = 0;
  for (int c = 1; c < classes; ++c) {
    const bool nan = std::isnan(logits[c]), best_nan = std::isnan(logits[best]);
    if (nan != best_nan ? nan : (!nan && logits[c] > logits[best])) best = c;
  }
  return best;
}

Confusion::Confusion(const std::vector<float>& logits, const std::vector<uint8_t>& labels, int classes)
    : classes_(classes), counts_(static_cast<size_t>(classes) * classes), examples_(static_cast<size_t>(classes)) {
  NT_CHECK(logits.size() == labels.size() * static_cast<size_t>(classes), "logits for ", labels.size(), " examples");
  predictions_.reserve(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    const int label = labels[i];
    NT_CHECK(label < classes, "label ", label, " of ", classes, " classes");
    const int predicted = predicted_class(logits.data() + i * static_cast<size_t>(classes), classes);
    predictions_.push_back(predicted);
    ++counts_[static_cast<size_t>(label * classes + predicted)];
    ++examples_[static_cast<size_t>(label)];
  }
}

int64_t Confusion::correct() const {
  int64_t hits = 0;
  for (int c = 0; c < classes_; ++c) hits += count(c, c);
  return hits;
}

double Confusion::recall(int label) const {
  const int64_t n = examples_[static_cast<size_t>(label)];
  return n ? static_cast<double>(count(label, label)) / static_cast<double>(n)
           : std::numeric_limits<double>::quiet_NaN();
}

double Confusion::precision(int predicted) const {
  int64_t n = 0;
  for (int label = 0; label < classes_; ++label) n += count(label, predicted);
  return n ? static_cast<double>(count(predicted, predicted)) / static_cast<double>(n)
           : std::numeric_limits<double>::quiet_NaN();
}

std::string Confusion::table(const ModelCard& card) const {
  size_t name_width = 5;  // "label"
  for (int c = 0; c < classes_; ++c) name_width = std::max(name_width, card.class_name(c).size());
  int64_t largest = 0;
  for (const int64_t n : counts_) largest = std::max(largest, n);
  const int cell = std::max(3, static_cast<int>(std::to_string(largest).size())) + 1;
  auto percent = [](double v) -> std::string {
    if (std::isnan(v)) return "      -";
    char text[16];
    std::snprintf(text, sizeof text, "%6.2f%%", 100 * v);
    return text;
  };

  std::string out = cat("rows: label, columns: prediction (", classes_, " classes)\n");
  out += std::string(name_width, ' ');
  for (int c = 0; c < classes_; ++c)
    out += cat(std::string(static_cast<size_t>(cell) - std::to_string(c).size(), ' '), c);
  out += "  | examples  recall precision\n";
  for (int label = 0; label < classes_; ++label) {
    const std::string name = card.class_name(label);
    out += name + std::string(name_width - name.size(), ' ');
    for (int p = 0; p < classes_; ++p) {
      const std::string n = std::to_string(count(label, p));
      out += std::string(static_cast<size_t>(cell) - n.size(), ' ') + n;
    }
    char tail[64];
    std::snprintf(tail, sizeof tail, "  | %8lld %s  %s\n",
                  static_cast<long long>(examples_[static_cast<size_t>(label)]), percent(recall(label)).c_str(),
                  percent(precision(label)).c_str());
    out += tail;
  }
  return out;
}

nlohmann::json Confusion::json(const ModelCard& card) const {
  auto number = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  nlohmann::json matrix = nlohmann::json::array(), per_class = nlohmann::json::array();
  for (int label = 0; label < classes_; ++label) {
    nlohmann::json row = nlohmann::json::array();
    for (int p = 0; p < classes_; ++p) row.push_back(count(label, p));
    matrix.push_back(std::move(row));
    per_class.push_back({{"class", label},
                         {"name", card.class_name(label)},
                         {"examples", examples_[static_cast<size_t>(label)]},
                         {"recall", number(recall(label))},
                         {"precision", number(precision(label))}});
  }
  return {{"confusion", std::move(matrix)}, {"classes", std::move(per_class)}, {"predictions", predictions_}};
}

}  // namespace nt::app
