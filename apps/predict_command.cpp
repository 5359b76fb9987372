// nanotrain predict: classify one's own images with a saved model.
//
//   nanotrain predict --load M.safetensors IMAGE... [--top K] [--json] [--resize] [--invert]
//
// IMAGE is a PNG, PGM or PPM file (data/image.h), or an IDX image file, raw or gzip, whose every image is
// classified. Each image is brought to the model's input as training saw it: converted to the model's channel
// count (grayscale replicated to RGB; RGB to grayscale by BT.601 luma), inverted with --invert (MNIST is white on
// black; a scan is dark on light), resized with --resize (bilinear) or else refused when its size differs, then
// normalized with the checkpoint's own mean and std by the same gather kernel as training. The model runs through
// Trainer::evaluate, as eval, so an MNIST test image written as PNG gets exactly eval's prediction.
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>

#include "apps/command.h"
#include "apps/inference.h"
#include "apps/model_card.h"
#include "apps/workload.h"
#include "data/idx.h"
#include "data/image.h"
#include "engine/checkpoint.h"
#include "layers/builder.h"

namespace nt::app {

namespace {

namespace fs = std::filesystem;

struct PredictCommand {
  CommonOptions common;
  WorkloadOptions workload;  // --model and --dataset: only for a checkpoint without a card
  std::string load_path;
  std::vector<std::string> images;
  int top = 3;
  bool json = false;
  bool resize = false;
  bool invert = false;
  int batch = 256;
};

void validate_predict(const PredictCommand& p) {
  validate_common(p.common);
  validate_workload(p.workload);
  std::error_code ec;
  if (!fs::is_regular_file(p.load_path, ec)) throw UsageError(cat("--load: no file '", p.load_path, "'"));
  if (p.top < 1 || p.top > 256) throw UsageError(cat("--top: must be in [1, 256], got ", p.top));
  if (p.batch < 1 || p.batch > 65536) throw UsageError(cat("--batch: must be in [1, 65536], got ", p.batch));
  for (const auto& image : p.images)
    if (!fs::is_regular_file(image, ec)) throw UsageError(cat("no image file '", image, "'"));
}

// IDX by its magic (0x0000 08 03/04: unsigned-byte images of rank 3 or 4), or a gzip stream, which only IDX
// files are here; anything else goes to the image reader, which names what it is not.
bool is_idx(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[4] = {};
  in.read(reinterpret_cast<char*>(head), 4);
  if (in.gcount() >= 2 && head[0] == 0x1f && head[1] == 0x8b) return true;
  return in.gcount() == 4 && head[0] == 0 && head[1] == 0 && head[2] == 0x08 && (head[3] == 3 || head[3] == 4);
}

struct Example {
  std::string name;  // "digit.png", or "t10k-images-idx3-ubyte[12]"
  data::Image image;
};

std::vector<Example> read_examples(const std::vector<std::string>& paths) {
  std::vector<Example> examples;
  for (const auto& path : paths) {
    if (!is_idx(path)) {
      examples.push_back({path, data::read_image(path)});
      continue;
    }
    const data::IdxImages idx = data::read_idx_images(path);
    const auto size = static_cast<size_t>(idx.channels) * idx.rows * idx.cols;
    for (int64_t i = 0; i < idx.count; ++i) {
      data::Image image{idx.channels, idx.rows, idx.cols, std::vector<uint8_t>(static_cast<size_t>(size))};
      // IDX stores channels last (rank 4); the model takes planes.
      const uint8_t* src = idx.pixels.data() + static_cast<size_t>(i) * size;
      const auto plane = static_cast<size_t>(idx.rows) * idx.cols;
      for (size_t p = 0; p < plane; ++p)
        for (size_t c = 0; c < static_cast<size_t>(idx.channels); ++c)
          image.pixels[c * plane + p] = src[p * static_cast<size_t>(idx.channels) + c];
      examples.push_back({cat(path, "[", i, "]"), std::move(image)});
    }
  }
  return examples;
}

// The examples as the model takes them, in one data set of its normalization (labels are unknown: 0).
data::Dataset model_input(std::vector<Example>& examples, const ModelCard& card, const PredictCommand& p) {
  const int channels = static_cast<int>(card.input_shape[0]), rows = static_cast<int>(card.input_shape[1]),
            cols = static_cast<int>(card.input_shape[2]);
  data::Dataset set;
  set.name = "predict";
  set.count = static_cast<int64_t>(examples.size());
  set.channels = channels, set.rows = rows, set.cols = cols;
  set.classes = card.classes;
  set.mean = card.mean, set.std = card.std;
  set.labels.assign(examples.size(), 0);
  for (auto& e : examples) {
    if (e.image.channels != channels && e.image.channels != 1 && e.image.channels != 3)
      throw Error(cat("image '", e.name, "' has ", e.image.channels, " channels; the model takes ", channels));
    if (e.image.channels != channels && channels != 1 && channels != 3)
      throw Error(cat("image '", e.name, "' has ", e.image.channels, " channels; the model takes ", channels,
                      ", which no image converts to"));
    data::Image image = data::to_channels(e.image, channels);
    if (image.rows != rows || image.cols != cols) {
      if (!p.resize)
        throw Error(cat("image '", e.name, "' is ", image.cols, "x", image.rows,
                        " (width x height) but the model takes ", cols, "x", rows, "; --resize scales it (bilinear)"));
      image = data::resize_bilinear(image, rows, cols);
    }
    if (p.invert) data::invert(image);
    set.images.insert(set.images.end(), image.pixels.begin(), image.pixels.end());
  }
  return set;
}

// Softmax probabilities of one row of logits, in double (the classes' order).
std::vector<double> probabilities(const float* logits, int classes) {
  double top = -INFINITY;
  for (int c = 0; c < classes; ++c) top = std::max(top, static_cast<double>(logits[c]));
  std::vector<double> p(static_cast<size_t>(classes));
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += p[static_cast<size_t>(c)] = std::exp(static_cast<double>(logits[c]) - top);
  for (double& v : p) v /= sum;
  return p;
}

int run_predict(const PredictCommand& p) {
  validate_predict(p);
  setup_logging(p.common);
  Context ctx(p.common.context());

  std::optional<ModelCard> card = read_model_card(p.load_path);
  std::unique_ptr<Model> model;
  if (card && !p.workload.model_given) {
    model = layers::build_model(card->model_spec, card->input_shape, card->classes);
  } else if (p.workload.model_given) {  // an older checkpoint (or an override): the data set gives the rest
    Workload w = load_workload(p.workload.with_card(card ? &*card : nullptr), 1);
    card = ModelCard::of(w.model_given_as, w.split.train);
    model = std::move(w.model);
  } else {
    throw UsageError(cat("--load: '", p.load_path, "' has no model card in its metadata (written before cards): ",
                         "give --model and --dataset it was trained with"));
  }
  model->init_params(ctx, 0);
  load_safetensors(p.load_path, *model, ctx.exec());
  require_finite_checkpoint(ctx, *model, "--load", p.load_path);

  std::vector<Example> examples = read_examples(p.images);
  const data::Dataset input = model_input(examples, *card, p);
  log_device(ctx);
  const Inference run = run_inference(ctx, *model, input, p.batch, p.common, /*want_logits=*/true);

  const int classes = card->classes, top = std::min(p.top, classes);
  for (size_t i = 0; i < examples.size(); ++i) {
    const float* logits = run.logits.data() + i * static_cast<size_t>(classes);
    const std::vector<double> prob = probabilities(logits, classes);
    // The best first, ranked as eval's argmax ranks (NaN above any number, ties to the lower class): the first is
    // eval's prediction.
    std::vector<int> order(static_cast<size_t>(classes));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const bool a_nan = std::isnan(logits[a]), b_nan = std::isnan(logits[b]);
      return a_nan != b_nan ? a_nan : (!a_nan && logits[a] > logits[b]);
    });
    if (p.json) {
      nlohmann::json ranked = nlohmann::json::array();
      for (int k = 0; k < top; ++k) {
        const int c = order[static_cast<size_t>(k)];
        ranked.push_back({{"class", c}, {"name", card->class_name(c)}, {"probability", prob[static_cast<size_t>(c)]}});
      }
      std::printf("%s\n", nlohmann::json{{"image", examples[i].name}, {"top", std::move(ranked)}}.dump().c_str());
    } else {
      std::string line = examples[i].name + ":";
      for (int k = 0; k < top; ++k) {
        const int c = order[static_cast<size_t>(k)];
        char probability[32];
        std::snprintf(probability, sizeof probability, " (%.4f)", prob[static_cast<size_t>(c)]);
        line += cat(k ? "," : "", " ", card->class_name(c), probability);
      }
      std::printf("%s\n", line.c_str());
    }
  }
  return 0;
}

}  // namespace

Command register_predict(CLI::App& app) {
  auto predict = std::make_shared<PredictCommand>();
  auto* cmd = app.add_subcommand("predict", "Classify images (PNG, PGM, PPM, IDX) with a saved model");
  add_common_options(*cmd, predict->common);
  add_workload_options(*cmd, predict->workload, "The model's spec (default: the checkpoint's own)");
  cmd->add_option("--load", predict->load_path, "The model (from train --save)")->required()->check(non_empty_path());
  cmd->add_option("images", predict->images, "PNG, PGM or PPM files, or IDX image files (each of their images)")
      ->required();
  cmd->add_option("--top", predict->top, "Show the K most likely classes")->capture_default_str();
  cmd->add_flag("--json", predict->json, "One JSON object per image instead of a line of text");
  cmd->add_flag("--resize", predict->resize, "Scale images of another size to the model's (bilinear)");
  cmd->add_flag("--invert", predict->invert, "Invert the pixels (for dark digits on a light background)");
  cmd->add_option("--batch", predict->batch, "Images per forward pass")->capture_default_str();
  return {cmd, [predict] { return run_predict(*predict); }};
}

}  // namespace nt::app
