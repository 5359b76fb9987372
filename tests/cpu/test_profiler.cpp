// The kernel profiler on the CPU backend: aggregation, sorting and formatting of the report, the scopes that
// label launches, the files it writes (parsed by Python's own json and csv modules, an independent reader),
// and that with no observer attached nothing at all is recorded.
#include "test_support.h"

#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "profile/kernel_profiler.h"
#include "profile/report.h"
#include "counting_observer.h"
#include "rig.h"

using namespace nt;

namespace {

using Key = test::LaunchKey;
using test::CountingObserver;

profile::Launch launch(profile::ProfileData& d, const char* kernel, const char* phase, const char* layer, double dur_us,
                       profile::OpCost cost = {}) {
  profile::Launch l;
  l.kernel = d.intern(kernel), l.phase = d.intern(phase), l.layer = d.intern(layer);
  l.dur_us = dur_us;
  l.cost = cost;
  return l;
}

std::map<Key, int64_t> profiled_calls(const profile::ProfileData& d) {
  std::map<Key, int64_t> out;
  for (const auto& r : d.rows()) out[{r.kernel, r.phase, r.layer}] = r.calls;
  return out;
}

data::Dataset small_train() { return data::subset(test::mnist().train, 0, 640); }

}  // namespace

TEST_CASE("launches aggregate per kernel, phase and layer", "[cpu][profile]") {
  profile::ProfileData d;
  d.add(launch(d, "gemm", "forward", "0 linear", 10, {4000, 2e6}));
  d.add(launch(d, "gemm", "forward", "0 linear", 30, {4000, 2e6}));
  d.add(launch(d, "gemm", "forward", "2 linear", 5));   // another layer: another row
  d.add(launch(d, "gemm", "backward", "0 linear", 7));  // another phase: another row
  const auto rows = d.rows();
  REQUIRE(rows.size() == 3);
  const auto& r = rows[0];
  CHECK(r.kernel == "gemm");
  CHECK(r.phase == "forward");
  CHECK(r.layer == "0 linear");
  CHECK(r.calls == 2);
  CHECK(r.total_us == 40);
  CHECK(r.min_us == 10);
  CHECK(r.max_us == 30);
  CHECK(r.avg_us() == 20);
  CHECK(r.gb_per_s() == Approx(8000 / 40e-6 / 1e9));     // bytes over time: 8 kB in 40 us = 0.2 GB/s
  CHECK(r.gflop_per_s() == Approx(4e6 / 40e-6 / 1e9));   // 4 MFLOP in 40 us = 100 GFLOP/s
  CHECK(d.kernel_us() == 52);
  CHECK(d.launch_count() == 4);
  CHECK(d.launches().size() == 4);
}

TEST_CASE("rows sort by total time, ties by name; the trace keeps at most its cap", "[cpu][profile]") {
  profile::ProfileData d(/*max_launches=*/3);
  d.add(launch(d, "b", "update", "", 5));
  d.add(launch(d, "a", "data", "", 5));
  d.add(launch(d, "c", "forward", "", 1));
  d.add(launch(d, "c", "forward", "", 8));
  const auto rows = d.rows();
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].kernel == "c");  // 9 us
  CHECK(rows[1].kernel == "a");  // 5 us, and "a" < "b"
  CHECK(rows[2].kernel == "b");
  CHECK(d.launch_count() == 4);
  CHECK(d.launches().size() == 3);
  CHECK(d.dropped() == 1);
}

TEST_CASE("the table has every column, rows in order, blank rates where the op reports none", "[cpu][profile]") {
  profile::ProfileData d;
  d.add(launch(d, "gemm_bias_relu", "forward", "0 linear 784->320 +relu", 12.5, {1e6, 0}));
  d.add(launch(d, "sgd_update", "update", "", 2.5));
  d.wall_us = 20;
  const std::string table = profile::format_table(d);
  INFO(table);
  std::istringstream in(table);
  std::string header, rule, first, second, extra;
  std::getline(in, header), std::getline(in, rule), std::getline(in, first), std::getline(in, second);
  CHECK(!std::getline(in, extra));
  CHECK(header.find("Kernel") == 0);
  size_t at = 0;
  for (const char* title : {"Phase", "Layer", "Time %", "Total ms", "Calls", "Avg us", "Min us", "Max us", "GB/s", "GFLOP/s"}) {
    const size_t found = header.find(title, at);
    CHECK(found != std::string::npos);
    at = found;
  }
  CHECK(rule.find_first_not_of("-+ ") == std::string::npos);
  CHECK(first.find("gemm_bias_relu") == 0);
  CHECK(first.find("0 linear 784->320 +relu") != std::string::npos);
  CHECK(first.find("83.3") != std::string::npos);    // 12.5 of 15 us
  CHECK(first.find("12.50") != std::string::npos);   // avg us
  CHECK(first.find("80.0") != std::string::npos);    // 1 MB in 12.5 us = 80 GB/s
  CHECK(second.find("sgd_update") == 0);
  CHECK(second.find(" - ") != std::string::npos);    // no layer
  CHECK(second.find_last_not_of(" |") == second.rfind("2.50") + 3);  // GB/s and GFLOP/s blank
  CHECK(header.size() == first.size());              // columns line up

  const std::string totals = profile::format_totals(d);
  INFO(totals);
  CHECK(totals.find("kernel time 0.015 ms in 2 launches") != std::string::npos);
  CHECK(totals.find("wall clock 0.020 ms") != std::string::npos);
  CHECK(totals.find("busy 75.0%") != std::string::npos);
  CHECK(totals.find("gaps 0.005 ms") != std::string::npos);
}

TEST_CASE("names are escaped in JSON and quoted in CSV", "[cpu][profile]") {
  CHECK(profile::json_escape("a\"b\\c\nd") == "a\\\"b\\\\c\\u000ad");
  CHECK(profile::json_escape("linear 784->320") == "linear 784->320");
  CHECK(profile::csv_field("plain") == "plain");
  CHECK(profile::csv_field("conv:32:3,bn") == "\"conv:32:3,bn\"");
  CHECK(profile::csv_field("say \"hi\"") == "\"say \"\"hi\"\"\"");
}

TEST_CASE("scopes nest, label what is open, and tell the listener about outermost steps", "[cpu][profile]") {
  struct Listener : profile::StepListener {
    int opened = 0, closed = 0;
    void step_opened() noexcept override { ++opened; }
    void step_closed() noexcept override { ++closed; }
  } listener;
  profile::set_step_listener(&listener);
  CHECK(profile::current_phase().name == nullptr);
  uint64_t first_forward = 0;
  {
    profile::StepScope step("train_step");
    profile::StepScope inner("nested");
    profile::PhaseScope phase("forward");
    first_forward = profile::current_phase().id;
    {
      const std::string label = "0 linear";  // borrowed: lives as long as the scope, like the model's labels
      profile::LayerScope layer(label);
      CHECK(std::string(profile::current_layer().name) == "0 linear");
    }
    CHECK(profile::current_layer().name == nullptr);
    phase.next("backward");
    CHECK(std::string(profile::current_phase().name) == "backward");
    phase.next("forward");
    CHECK(profile::current_phase().id != first_forward);  // a new opening of the same name
    CHECK(std::string(profile::current_step().name) == "nested");
  }
  CHECK(profile::current_phase().name == nullptr);
  CHECK(profile::current_step().name == nullptr);
  CHECK(listener.opened == 1);
  CHECK(listener.closed == 1);
  profile::set_step_listener(nullptr);
}

TEST_CASE("a profiled CPU training step and evaluation: every launch is in the table and the files",
          "[cpu][profile]") {
  test::Rig rig(small_train(), {});
  data::DeviceBatcher eval_data(rig.ctx, data::subset(test::mnist().test, 0, 100), false, 1);  // 2 batches
  profile::KernelProfiler profiler({profile::Timing::host, {}, 16, 1000, "cpu (test)"});
  CountingObserver counter;
  counter.next = &profiler;
  rig.ctx.set_observer(&counter);
  profiler.start();
  for (int64_t s = 0; s < 3; ++s) rig.trainer.enqueue_train_step(s);
  rig.trainer.evaluate(eval_data);
  profiler.stop();
  rig.ctx.set_observer(nullptr);
  const auto& d = profiler.data();

  SECTION("the table counts what ran, under the phase and layer it ran in") {
    CHECK(d.launch_count() == counter.launches);
    CHECK(profiled_calls(d) == counter.calls);
    const std::map<std::string, std::string> phase_of{
        {"gather_batch", "data"}, {"softmax_xent", "loss"}, {"sgd_update", "update"}, {"gemm_bias_relu", "forward"}};
    for (const auto& r : d.rows()) {
      INFO(r.kernel << " | " << r.phase << " | " << r.layer);
      CHECK(r.min_us >= 0);
      CHECK(r.max_us >= r.min_us);
      if (r.phase == "eval") continue;
      if (phase_of.count(r.kernel)) CHECK(r.phase == phase_of.at(r.kernel));
      if (r.phase == "forward" || r.phase == "backward") CHECK(!r.layer.empty());
    }
    CHECK(counter.calls.count({"gemm_bias_relu", "forward", "0 linear 784->320 +relu"}) == 1);
    CHECK(counter.calls.count({"gather_batch", "eval", ""}) == 1);
    CHECK(counter.calls.at({"gather_batch", "data", ""}) == 3);
    CHECK(counter.calls.at({"gather_batch", "eval", ""}) == 2);
    CHECK(d.wall_us >= d.kernel_us());  // host timers: ops run inside the window, one at a time
  }

  SECTION("the CSV, JSON and trace files parse and list every launch") {
    const std::string prefix = "profile_test_out";
    profile::write_files(d, prefix);
    // Python's own parsers read the files back; each line: source \t kernel \t phase \t layer \t calls.
    const char* script =
        "import csv, json, sys, collections\n"
        "p = sys.argv[1]\n"
        "for r in json.load(open(p + '.json'))['kernels']:\n"
        "    print('json', r['kernel'], r['phase'], r['layer'], r['calls'], sep='\\t')\n"
        "for r in csv.DictReader(open(p + '.csv', newline='')):\n"
        "    print('csv', r['kernel'], r['phase'], r['layer'], r['calls'], sep='\\t')\n"
        "events = json.load(open(p + '.trace.json'))['traceEvents']\n"
        "count = collections.Counter((e['name'], e['args']['phase'], e['args']['layer'])\n"
        "                            for e in events if e['ph'] == 'X' and e['cat'] == 'kernel')\n"
        "for (k, ph, l), n in count.items():\n"
        "    print('trace', k, ph, l, n, sep='\\t')\n"
        "for cat in ('step', 'phase', 'layer'):\n"
        "    print('ranges', cat, sum(1 for e in events if e.get('cat') == cat), sep='\\t')\n";
    std::FILE* f = std::fopen("profile_test_check.py", "w");
    REQUIRE(f);
    std::fputs(script, f);
    std::fclose(f);
    const auto r = test::run_command("python3 profile_test_check.py " + prefix);
    INFO(r.out);
    REQUIRE(r.exit_code == 0);

    std::map<std::string, std::map<Key, int64_t>> seen;  // source -> key -> calls
    std::map<std::string, int64_t> ranges;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::vector<std::string> f5;
      std::istringstream fields(line);
      for (std::string field; std::getline(fields, field, '\t');) f5.push_back(field);
      if (f5.size() == 3 && f5[0] == "ranges") ranges[f5[1]] = std::stoll(f5[2]);
      if (f5.size() == 5) seen[f5[0]][{f5[1], f5[2], f5[3]}] = std::stoll(f5[4]);
    }
    CHECK(seen["json"] == counter.calls);
    CHECK(seen["csv"] == counter.calls);
    CHECK(seen["trace"] == counter.calls);
    CHECK(ranges["step"] == 3 + 2);         // 3 training steps, 2 evaluation batches
    CHECK(ranges["phase"] == 3 * 5 + 1);    // data, forward, loss, backward, update per step; one eval
    CHECK(ranges["layer"] == 3 * 6 + 2 * 3);  // 3 layers forward and backward per step, 3 per eval batch
    for (const char* ext : {".csv", ".json", ".trace.json"}) std::remove((prefix + ext).c_str());
    std::remove("profile_test_check.py");
  }
}

TEST_CASE("with no observer attached nothing is recorded", "[cpu][profile]") {
  test::Rig rig(small_train(), {});
  profile::KernelProfiler profiler(profile::ProfilerOptions{});  // host timers
  CountingObserver counter;
  profiler.start();  // started, listening to steps, but not attached to the execution handle
  for (int64_t s = 0; s < 2; ++s) rig.trainer.enqueue_train_step(s);
  CHECK(rig.ctx.exec().observer == nullptr);
  CHECK(profiler.data().launch_count() == 0);

  rig.ctx.set_observer(&counter);  // attach, run, detach: only the attached step counts
  rig.trainer.enqueue_train_step(2);
  rig.ctx.set_observer(nullptr);
  const int64_t attached = counter.launches;
  CHECK(attached > 0);
  rig.trainer.enqueue_train_step(3);
  CHECK(counter.launches == attached);
  profiler.stop();
  CHECK(profiler.data().launch_count() == 0);
}

TEST_CASE("profile files go to an existing folder, or the error names --profile-out", "[cpu][profile]") {
  profile::ProfileData d;
  d.add(launch(d, "k", "p", "", 1));
  try {
    profile::write_files(d, "/nonexistent-folder/prof");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("--profile-out") != std::string::npos);
  }
}

TEST_CASE("nanotrain profile prints the table on the CPU", "[cpu][profile][cli]") {
  const auto r = test::run_command(test::cli_path() + " profile --device cpu --model mlp --batch 32 --steps 3 --warmup 1 --data " +
                                   test::mnist_dir());
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  for (const char* text : {"Kernel", "GFLOP/s", "gemm_bias_relu", "sgd_update", "eval", "kernel time", "wall clock"})
    CHECK(r.out.find(text) != std::string::npos);
}
