// Training behaviour on the CPU backend: the mlp learns MNIST, and a seed fixes the result exactly.
#include "test_support.h"

#include <cstring>

#include "rig.h"

using namespace nt;

TEST_CASE("the mlp reaches 90% test accuracy after one epoch on 5,000 MNIST images", "[cpu][training]") {
  auto train = data::subset(test::mnist().train, 0, 5000);
  // Plain SGD at lr 0.03 needs most of an MNIST epoch to pass 90%; on 5,000 images one epoch is 312
  // steps at batch 16 and lr 0.1 (measured: 91.6% with seed 1).
  test::RigOptions o;
  o.batch = 16;
  o.sgd = {0.1f, 0.f, 0.f};
  test::Rig rig(train, o);
  data::DeviceBatcher test_data(rig.ctx, test::mnist().test, false, 1);
  EpochMetrics m = rig.trainer.run_epoch(1, &test_data);
  INFO("train loss " << m.train_loss << ", test accuracy " << m.test_acc);
  CHECK(std::isfinite(m.train_loss));
  CHECK(m.test_acc >= 0.90);
}

TEST_CASE("the same seed gives bit-identical weights, whatever the thread count", "[cpu][training][determinism]") {
  auto train = data::subset(test::mnist().train, 0, 1000);
  auto run = [&](uint64_t seed, int threads) {
    test::RigOptions o;
    o.seed = seed;
    o.threads = threads;
    o.sgd = {0.03f, 0.9f, 1e-4f};
    test::Rig rig(train, o);
    rig.trainer.train_epoch(1);
    return rig.weights();
  };
  auto a = run(7, 1), b = run(7, 2), c = run(8, 2);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) != 0);
}
