// Where a classifier fails: the confusion matrix of its predictions on a labelled set, per-class precision and
// recall, as a table for the terminal and as JSON (eval --confusion, --json).
//
// A prediction is the argmax of an example's logits as torch.argmax takes it (a NaN ranks above every number, ties
// take the lowest class), the rule the loss kernels count "correct" by, so the matrix's diagonal sums to exactly the
// correct count behind eval's accuracy.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "apps/model_card.h"

namespace nt::app {

// The predicted class of one row of `classes` logits.
int predicted_class(const float* logits, int classes);

class Confusion {
 public:
  // logits: (labels.size(), classes) row-major; every label < classes.
  Confusion(const std::vector<float>& logits, const std::vector<uint8_t>& labels, int classes);

  int classes() const { return classes_; }
  int64_t count(int label, int predicted) const { return counts_[static_cast<size_t>(label * classes_ + predicted)]; }
  const std::vector<int>& predictions() const { return predictions_; }  // per example
  int64_t correct() const;
  double recall(int label) const;         // per-class accuracy: correct / examples of the class (NaN when none)
  double precision(int predicted) const;  // correct / examples predicted as the class (NaN when none)

  // Rows are labels, columns predictions, then each class's examples, recall and precision; class names from
  // the card head the rows.
  std::string table(const ModelCard& card) const;
  nlohmann::json json(const ModelCard& card) const;

 private:
  int classes_;
  std::vector<int64_t> counts_;  // (label, predicted)
  std::vector<int> predictions_;
  std::vector<int64_t> examples_;  // per label
};

}  // namespace nt::app
