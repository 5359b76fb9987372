// The fusion planner (layers/fusion.h): what build_model fuses, recorded in the model's summary.
#include "test_support.h"

#include <algorithm>

#include "layers/builder.h"
#include "layers/fusion.h"

using namespace nt;
using test::Contains;

namespace {
std::vector<std::string> fusions_in(const Model& model) {
  std::vector<std::string> lines;
  const std::string summary = model.summary();
  for (size_t at = summary.find("\n  fused "); at != std::string::npos; at = summary.find("\n  fused ", at + 1))
    lines.push_back(summary.substr(at + 9, summary.find('\n', at + 1) - at - 9));
  return lines;
}
}  // namespace

TEST_CASE(
    "the cnn gets its stem, the conv statistics, the staged input and gradient, a relu mask and the head, each "
    "listed in its summary",
    "[cpu][fusion]") {
  const auto model = layers::build_model("cnn", Shape{1, 28, 28}, 10);
  const auto fusions = fusions_in(*model);
  INFO(model->summary());
  REQUIRE(fusions.size() == 6);
  CHECK_THAT(fusions[0], Contains("stem: 0 conv 1->32"));
  CHECK_THAT(fusions[1], Contains("statistics: 4 conv 32->64"));
  CHECK_THAT(fusions[2], Contains("staged input: 0 conv 1->32") && Contains("-> 4 conv 32->64"));
  CHECK_THAT(fusions[3],
             Contains("staged gradient: 4 conv 32->64") && Contains("<- 5 batchnorm2d 64 +relu +maxpool 2"));
  CHECK_THAT(fusions[4], Contains("relu mask: 9 linear 3136->128 +relu -> 11 linear 128->10"));
  CHECK_THAT(fusions[5], Contains("head: 11 linear 128->10"));
  CHECK(fusions_in(*layers::build_model("cnn", Shape{1, 28, 28}, 10, {.staged_operands = false})).size() == 4);
  // Without a fused stem (sync-bn), conv 4's input has no writer, and conv 0's single channel no 8-channel vector;
  // without a max-pool after the BatchNorm, no gradient link.
  const auto synced = fusions_in(*layers::build_model("cnn", Shape{1, 28, 28}, 10, {.sync_batchnorm = true}));
  CHECK(std::count_if(synced.begin(), synced.end(), [](const std::string& f) { return f.starts_with("staged "); }) ==
        1);
  CHECK(std::count_if(synced.begin(), synced.end(),
                      [](const std::string& f) { return f.starts_with("staged gradient: 4 conv 32->64"); }) == 1);
  const auto unpooled = fusions_in(*layers::build_model("conv:8:3,bn,relu,flatten,linear:10", Shape{1, 8, 8}, 10));
  CHECK(std::none_of(unpooled.begin(), unpooled.end(), [](const std::string& f) { return f.starts_with("staged "); }));
  // stem, conv, batchnorm(+relu+maxpool), flatten, linear+relu, linear: the stem is one layer in place of two
  CHECK(model->layers().size() == 6);
}

TEST_CASE("the mlp masks both ReLUs in the next layer's input gradient, and a model without them fuses nothing",
          "[cpu][fusion]") {
  const auto mlp = layers::build_model("mlp", Shape{1, 28, 28}, 10);
  CHECK(fusions_in(*mlp) ==
        std::vector<std::string>{"relu mask: 0 linear 784->320 +relu -> 2 linear 320->160 +relu",
                                 "relu mask: 2 linear 320->160 +relu -> 4 linear 160->10",
                                 "head: 4 linear 160->10 + softmax cross-entropy, when training with that loss"});
  // Without a BatchNorm there is no stem and no statistics link; a model that ends in ReLU has no head.
  const auto plain = layers::build_model("conv:4:3,relu,flatten,linear:10,relu,linear:10,relu", Shape{1, 8, 8}, 10);
  for (const auto& fusion : fusions_in(*plain)) {
    INFO(fusion);
    CHECK(fusion.find("stem") == std::string::npos);
    CHECK(fusion.find("statistics") == std::string::npos);
    CHECK(fusion.find("head") == std::string::npos);
  }
}
