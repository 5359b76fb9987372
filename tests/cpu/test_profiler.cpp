// The kernel profiler on the CPU backend: aggregation, sorting and formatting of the report, the scopes that
// label launches, the files it writes (parsed by Python's own json and csv modules, an independent reader),
// and that with no observer attached nothing at all is recorded. The CUPTI timer's parts that need no GPU:
// the loader's search and its failure, the --profile-timer flag, and the matching of kernel records to launches.
#include "test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "counting_observer.h"
#include "profile/cupti_tracer.h"
#include "profile/kernel_profiler.h"
#include "profile/report.h"
#include "rig.h"

using namespace nt;
using test::ScopedEnv;

namespace {

using Key = test::LaunchKey;
using test::CountingObserver;

profile::Launch launch(profile::ProfileData& d, const char* kernel, const char* phase, const char* layer, double dur_us,
                       profile::OpCost cost = {}) {
  profile::Launch l;
  l.kernel = d.intern(kernel), l.phase = d.intern(phase), l.layer = d.intern(layer);
  l.set_bracket(0, dur_us);
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
  CHECK(r.gb_per_s() == test::Approx(8000 / 40e-6 / 1e9));    // bytes over time: 8 kB in 40 us = 0.2 GB/s
  CHECK(r.gflop_per_s() == test::Approx(4e6 / 40e-6 / 1e9));  // 4 MFLOP in 40 us = 100 GFLOP/s
  CHECK(d.kernel_us() == 52);
  CHECK(d.launch_count() == 4);
  CHECK(d.launches().size() == 4);
}

TEST_CASE("rows sort by total time, ties by name, and the trace keeps at most its cap", "[cpu][profile]") {
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
  for (const char* title : {"Phase", "Layer", "Time %", "Total ms", "Calls", "Avg us", "Span us", "Min us", "Max us",
                            "GB/s", "BW %", "GFLOP/s", "Math", "FLOP %"}) {
    const size_t found = header.find(title, at);
    CHECK(found != std::string::npos);
    at = found;
  }
  CHECK(rule.find_first_not_of("-+ ") == std::string::npos);
  CHECK(first.find("gemm_bias_relu") == 0);
  CHECK(first.find("0 linear 784->320 +relu") != std::string::npos);
  CHECK(first.find("83.3") != std::string::npos);   // 12.5 of 15 us
  CHECK(first.find("12.50") != std::string::npos);  // avg us
  CHECK(first.find("80.0") != std::string::npos);   // 1 MB in 12.5 us = 80 GB/s
  CHECK(second.find("sgd_update") == 0);
  CHECK(second.find(" - ") != std::string::npos);                    // no layer
  CHECK(second.find_last_not_of(" |") == second.rfind("2.50") + 3);  // GB/s and GFLOP/s blank
  CHECK(header.size() == first.size());                              // columns line up

  const std::string totals = profile::format_totals(d);
  INFO(totals);
  CHECK(totals.find("kernel time 0.015 ms in 2 launches") != std::string::npos);
  CHECK(totals.find("wall clock 0.020 ms") != std::string::npos);
  CHECK(totals.find("busy 75.0%") != std::string::npos);
  CHECK(totals.find("gaps 0.005 ms") != std::string::npos);
}

TEST_CASE("names are escaped in JSON and quoted in CSV", "[cpu][profile]") {
  profile::ProfileData d;
  d.add(launch(d, "a\"b\\c\nd", "forward", "linear 784->320", 1));
  d.device = "caf\xC3\xA9 \x01";
  for (const std::string& text : {profile::to_json(d), profile::to_trace_json(d)}) {
    INFO(text);
    CHECK(text.find("\"a\\\"b\\\\c\\nd\"") != std::string::npos);
    CHECK(text.find("\"caf\xC3\xA9 \\u0001\"") != std::string::npos);  // UTF-8 as it is, control characters escaped
  }
  const auto json = nlohmann::json::parse(profile::to_json(d));
  CHECK(json["kernels"][0]["kernel"] == "a\"b\\c\nd");
  CHECK(json["kernels"][0]["layer"] == "linear 784->320");
  CHECK(json["device"] == "caf\xC3\xA9 \x01");
  const auto trace = nlohmann::json::parse(profile::to_trace_json(d));
  const auto& events = trace["traceEvents"];
  CHECK(std::count_if(events.begin(), events.end(), [](const auto& e) { return e["name"] == "a\"b\\c\nd"; }) == 1);
  CHECK(profile::csv_field("plain") == "plain");
  CHECK(profile::csv_field("conv:32:3,bn") == "\"conv:32:3,bn\"");
  CHECK(profile::csv_field("say \"hi\"") == "\"say \"\"hi\"\"\"");
}

TEST_CASE("the JSON files keep the table's precision: times to the timer's, bytes and flops as integers",
          "[cpu][profile]") {
  profile::ProfileData d;
  profile::Launch l = launch(d, "gemm", "forward", "0 linear", 12.34567891, {1e6, 3e9});
  l.start_us = 1000.0004, l.span_us = l.exclusive_us + 0.25;  // resident 0.25 us before its predecessor ended
  d.add(l);
  d.wall_us = std::nan("");  // no wall clock: null, as JSON has no NaN
  const auto json = nlohmann::json::parse(profile::to_json(d));
  INFO(json.dump());
  const auto& r = json["kernels"][0];
  CHECK(r["total_ms"] == 0.012346);  // 6 decimals, as "%.6f" wrote it
  CHECK(r["avg_us"] == 12.3457);     // 4 decimals
  CHECK(r["time_pct"] == 100.0);
  CHECK(r["bytes"].is_number_unsigned());
  CHECK(r["bytes"] == 1000000);
  CHECK(r["flops"] == 3000000000u);
  CHECK(r["gb_per_s"] == 81.0);  // 1 MB in 12.3457 us, 3 decimals
  CHECK(json["wall_ms"].is_null());
  const auto trace = nlohmann::json::parse(profile::to_trace_json(d));
  INFO(trace.dump());
  const auto& events = trace["traceEvents"];
  // value(): the metadata events have no "cat", and a const json's operator[] on a missing key is undefined.
  const auto kernel = std::find_if(events.begin(), events.end(),
                                   [](const auto& e) { return e.value("cat", std::string()) == "kernel"; });
  REQUIRE(kernel != events.end());
  CHECK((*kernel)["ts"] == 1000.0);  // 3 decimals: microseconds to the nanosecond; the slice is the span
  CHECK((*kernel)["dur"] == 12.596);
  CHECK((*kernel)["args"]["bytes"] == 1000000);
  CHECK((*kernel)["args"]["exclusive_us"] == 12.346);
  CHECK(r["avg_span_us"] == 12.5957);
  CHECK(trace["otherData"]["launches"] == 1);
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

TEST_CASE("a profiled CPU training step and evaluation: every launch is in the table and the files", "[cpu][profile]") {
  test::Rig rig(small_train(), {});
  data::DeviceBatcher eval_data(rig.ctx, data::subset(test::mnist().test, 0, 100), false, 1);  // 2 batches
  profile::ProfilerOptions options;
  options.pool_pairs = 16;
  options.max_trace_launches = 1000;
  options.device = "cpu (test)";
  profile::KernelProfiler profiler(options);  // host timers
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
    CHECK(ranges["step"] == 3 + 2);       // 3 training steps, 2 evaluation batches
    CHECK(ranges["phase"] == 3 * 5 + 1);  // data, forward, loss, backward, update per step; one eval
    // Per step the first 2 layers forward and backward, and the fused classifier head (the last layer's forward,
    // loss and backward in one range); per evaluation batch the 2 layers and the head.
    CHECK(ranges["layer"] == 3 * 5 + 2 * 3);
    for (const char* ext : {".csv", ".json", ".trace.json"}) std::remove((prefix + ext).c_str());
    std::remove("profile_test_check.py");
  }
}

TEST_CASE("sampling times one step in N, and the report says so", "[cpu][profile]") {
  test::Rig rig(small_train(), {});
  profile::ProfilerOptions options;
  options.sample_every = 4;
  profile::KernelProfiler profiler(options);  // host timers
  CountingObserver counter;
  counter.next = &profiler;
  rig.ctx.set_observer(&counter);
  profiler.start();
  for (int64_t s = 0; s < 8; ++s) rig.trainer.enqueue_train_step(s);  // steps 3 and 7 are timed
  profiler.stop();
  rig.ctx.set_observer(nullptr);
  const auto& d = profiler.data();
  CHECK(d.steps == 8);
  CHECK(d.sampled_steps == 2);
  CHECK(d.sample_every == 4);
  REQUIRE(counter.launches % 8 == 0);
  CHECK(d.launch_count() == counter.launches / 4);  // every step launches the same kernels
  for (const auto& [key, calls] : counter.calls) {
    INFO(std::get<0>(key) << " | " << std::get<1>(key) << " | " << std::get<2>(key));
    CHECK(profiled_calls(d).at(key) * 4 == calls);
  }
  const std::string totals = profile::format_totals(d);
  CHECK(totals.find("sampled: 1 step in 4, 2 of 8 steps timed") != std::string::npos);
  CHECK(profile::to_json(d).find("\"sample_every\": 4") != std::string::npos);
  CHECK_THROWS_WITH(profile::KernelProfiler([] {
                      profile::ProfilerOptions o;
                      o.sample_every = 0;
                      return o;
                    }()),
                    test::Contains("sample_every must be at least 1"));
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
  const auto r =
      test::run_command(test::cli_path() + " profile --device cpu --model mlp --batch 32 --steps 3 --warmup 1 --data " +
                        test::mnist_dir());
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  for (const char* text :
       {"Kernel", "Span us", "GFLOP/s", "gemm_bias_relu", "sgd_update", "eval", "kernel time", "wall clock",
        "train_step 3: 11 kernels | exclusive", "eval_batch 1:", "median train_step (3)"})
    CHECK(r.out.find(text) != std::string::npos);
  CHECK(r.out.find("roofline") == std::string::npos);  // the CPU has no measured ceilings, and says nothing of them
}

// ---- CUPTI: loading, the timer flag, and matching kernel records to launches (no GPU needed) ----------

namespace {

profile::CuptiKernelRecord kernel_record(uint64_t start, uint64_t end, uint32_t stream = 7) {
  return {stream, start, end};
}

// Whether nt_profile was built with CUPTI, which decides what a failed load says. The library's NT_WITH_CUPTI
// is private to it; the tests see NT_WITH_CUDA, and a CUDA build has CUPTI whenever its toolkit has cupti.h
// (CMakeLists.txt: configure says when it has not, and then the loader test below expects the wrong text).
constexpr bool kCuptiBuilt = NT_WITH_CUDA != 0;
// What every load says in a build without CUPTI, whatever was named (profile/cupti_tracer.cpp).
constexpr const char* kNoCupti = "this build of nanotrain has no CUPTI support";

}  // namespace

TEST_CASE("CUPTI's loader reports a missing library cleanly", "[cpu][profile][cupti]") {
  {
    ScopedEnv env("NT_CUPTI_LIBRARY", "/nonexistent");
    const profile::CuptiSearch s = profile::cupti_search();
    CHECK(s.env_library == "/nonexistent");
    const profile::CuptiLibrary lib = profile::load_cupti(s);
    CHECK_FALSE(lib.loaded);
    CHECK(lib.api == nullptr);
    INFO(lib.error);
    // With CUPTI the error names the file that failed; without, it says the build has none.
    CHECK(lib.error.find(kCuptiBuilt ? "NT_CUPTI_LIBRARY=/nonexistent" : kNoCupti) != std::string::npos);
    CHECK(lib.error.find('\n') == std::string::npos);  // one line, for the warning
  }
  {
    ScopedEnv env("NT_CUPTI_LIBRARY", "none");
    const profile::CuptiLibrary lib = profile::load_cupti(profile::cupti_search());
    CHECK_FALSE(lib.loaded);
    INFO(lib.error);
    CHECK(lib.error.find(kCuptiBuilt ? "none" : kNoCupti) != std::string::npos);
    CHECK(lib.error.find('\n') == std::string::npos);
  }
  const std::string missing = "/nonexistent/libcupti.so.13";  // named: GCC 13 takes a temporary for a dangling one
  const profile::CuptiLibrary& explicit_path = profile::cupti_library(missing);
  CHECK_FALSE(explicit_path.loaded);
  CHECK(&profile::cupti_library(missing) == &explicit_path);  // loaded once per path
  // Nothing to open: the tracer declines with the loader's reason instead of throwing.
  std::string why;
  CHECK(profile::CuptiTracer::open(explicit_path, {}, &why) == nullptr);
  CHECK(why == explicit_path.error);
}

TEST_CASE("CUPTI's search order: the named library only, else next to the executable, the loader, the toolkit",
          "[cpu][profile][cupti]") {
  const std::string so = profile::cupti_soname();
  CHECK(so.rfind("libcupti.so.", 0) == 0);
  profile::CuptiSearch s;
  s.exe_dir = "/opt/nt/bin";
  s.toolkit_dir = "/toolkit/lib64";
  const std::vector<std::string> expected{
      "/opt/nt/bin/" + so, "/opt/nt/bin/libcupti.so", "/opt/nt/bin/../lib/" + so,  "/opt/nt/bin/../lib/libcupti.so", so,
      "libcupti.so",       "/toolkit/lib64/" + so,    "/toolkit/lib64/libcupti.so"};
  CHECK(profile::cupti_candidates(s) == expected);
  s.env_library = "/my/libcupti.so";
  CHECK(profile::cupti_candidates(s) == std::vector<std::string>{"/my/libcupti.so"});
  s.env_library = "none";
  CHECK(profile::cupti_candidates(s).empty());
  // With no executable folder or toolkit known, only the loader's search path is left.
  CHECK(profile::cupti_candidates(profile::CuptiSearch{}) == std::vector<std::string>{so, "libcupti.so"});
}

TEST_CASE("the profile timer flag: its values and what they mean on each backend", "[cpu][profile][cupti]") {
  using profile::TimerChoice, profile::Timing;
  CHECK(profile::parse_timer_choice("auto") == TimerChoice::automatic);
  CHECK(profile::parse_timer_choice("cupti") == TimerChoice::cupti);
  CHECK(profile::parse_timer_choice("events") == TimerChoice::events);
  CHECK(profile::parse_timer_choice("stamps") == TimerChoice::stamps);
  for (const char* bad : {"", "Auto", "cuda", "event", "cupti ", "stamp"})
    CHECK_FALSE(profile::parse_timer_choice(bad));
  const auto scene = [](bool on_cuda, int every, bool graphs, bool stamps_possible) {
    return profile::TimingScene{on_cuda, every, graphs, stamps_possible};
  };
  CHECK(profile::timing_for(TimerChoice::automatic, scene(true, 1, false, true)) == Timing::cupti);
  CHECK(profile::timing_for(TimerChoice::cupti, scene(true, 1, false, true)) == Timing::cupti);
  CHECK(profile::timing_for(TimerChoice::events, scene(true, 1, false, true)) == Timing::cuda_events);
  // sampled: CUPTI saves nothing between samples
  CHECK(profile::timing_for(TimerChoice::automatic, scene(true, 32, false, true)) == Timing::cuda_events);
  CHECK(profile::timing_for(TimerChoice::cupti, scene(true, 32, false, true)) == Timing::cupti);
  // replayed graphs: launch stamps where kernels can write them, else CUPTI
  CHECK(profile::timing_for(TimerChoice::automatic, scene(true, 1, true, true)) == Timing::stamps);
  CHECK(profile::timing_for(TimerChoice::automatic, scene(true, 1, true, false)) == Timing::cupti);
  CHECK(profile::timing_for(TimerChoice::cupti, scene(true, 1, true, true)) == Timing::cupti);
  CHECK(profile::timing_for(TimerChoice::stamps, scene(true, 1, true, true)) == Timing::stamps);
  for (auto c : {TimerChoice::automatic, TimerChoice::cupti, TimerChoice::events, TimerChoice::stamps})
    CHECK(profile::timing_for(c, scene(false, 1, true, false)) == Timing::host);  // the CPU: host clocks always
  CHECK(profile::cupti_fallback_for(TimerChoice::automatic));
  CHECK_FALSE(profile::cupti_fallback_for(TimerChoice::cupti));
  CHECK(std::string(profile::timing_name(Timing::cupti)) == "cupti");
  CHECK(std::string(profile::timing_name(Timing::stamps)) == "launch stamps");
}

TEST_CASE("a cupti profiler without CUPTI falls back to events, or refuses when cupti was insisted on",
          "[cpu][profile][cupti]") {
  if (!NT_WITH_CUDA) return;  // no GPU timers in this build at all
  profile::ProfilerOptions o;
  o.timing = profile::Timing::cupti;
  o.cupti_library = "/nonexistent/libcupti.so.13";
  {
    profile::KernelProfiler p(o);  // no GPU touched before start()
    CHECK(p.timing() == profile::Timing::cuda_events);
    CHECK(p.timing_note().find("/nonexistent/libcupti.so.13") != std::string::npos);
    CHECK(p.data().timer == "cuda events");
  }
  o.cupti_fallback = false;
  try {
    profile::KernelProfiler p(o);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("--profile-timer cupti") != std::string::npos);
    CHECK(std::string(e.what()).find("/nonexistent/libcupti.so.13") != std::string::npos);
  }
}

namespace {
std::vector<uint32_t> on_stream(size_t launches, uint32_t stream = 7) {
  return std::vector<uint32_t>(launches, stream);
}
}  // namespace

TEST_CASE("CUPTI records match launches in stream order", "[cpu][profile][cupti]") {
  SECTION("the i-th record by start time is the i-th launch, whatever order the records arrive in") {
    std::vector<profile::CuptiKernelRecord> k{kernel_record(5000, 5900), kernel_record(1000, 2000),
                                              kernel_record(6000, 6100), kernel_record(3000, 4500)};
    const auto m = profile::match_in_stream_order(on_stream(4), k);
    REQUIRE(m.launches.size() == 4);
    CHECK(m.missing == 0);
    CHECK(m.extra == 0);
    CHECK(m.clipped == 0);
    CHECK(m.streams == 1);
    const uint64_t starts[] = {1000, 3000, 5000, 6000}, ends[] = {2000, 4500, 5900, 6100};
    for (size_t i = 0; i < 4; ++i) {
      INFO("launch " << i);
      CHECK(m.launches[i].found);
      CHECK(m.launches[i].start_ns == starts[i]);
      CHECK(m.launches[i].exclusive_start_ns == starts[i]);
      CHECK(m.launches[i].end_ns == ends[i]);
    }
    std::reverse(k.begin(), k.end());
    const auto again = profile::match_in_stream_order(on_stream(4), k);
    for (size_t i = 0; i < 4; ++i) CHECK(again.launches[i].start_ns == m.launches[i].start_ns);
  }

  SECTION(
      "overlap on a stream (programmatic dependent launch): the span is kept, the exclusive time starts at the "
      "predecessor's end") {
    const std::vector<profile::CuptiKernelRecord> k{kernel_record(1000, 2000), kernel_record(1500, 2600),
                                                    kernel_record(2650, 3000), kernel_record(2900, 3100)};
    const auto m = profile::match_in_stream_order(on_stream(4), k);
    CHECK(m.missing == 0);
    CHECK(m.launches[1].start_ns == 1500);  // the span: as the GPU recorded it
    CHECK(m.launches[1].exclusive_start_ns == 2000);
    CHECK(m.launches[1].end_ns == 2600);
    CHECK(m.launches[2].exclusive_start_ns == 2650);  // a gap: untouched
    CHECK(m.launches[3].exclusive_start_ns == 3000);
    CHECK(m.clipped == 2);
    uint64_t exclusive = 0;
    for (const auto& l : m.launches) exclusive += l.end_ns - l.exclusive_start_ns;
    CHECK(exclusive == 1000 + 600 + 350 + 100);  // never more than the stream was busy
  }

  SECTION("two streams: each matched in its own order; overlap across streams is not clipped") {
    // Launches alternate between streams 3 and 4; the kernels of the two streams run at the same time.
    const std::vector<uint32_t> streams{3, 4, 3, 4};
    const std::vector<profile::CuptiKernelRecord> k{kernel_record(2000, 2500, 3), kernel_record(1000, 1900, 4),
                                                    kernel_record(1000, 1800, 3), kernel_record(2000, 2600, 4)};
    const auto m = profile::match_in_stream_order(streams, k);
    CHECK(m.missing == 0);
    CHECK(m.streams == 2);
    CHECK(m.clipped == 0);
    CHECK(m.launches[0].start_ns == 1000);
    CHECK(m.launches[0].end_ns == 1800);
    CHECK(m.launches[1].start_ns == 1000);  // beside launch 0, on the other stream: its exclusive time is its span
    CHECK(m.launches[1].exclusive_start_ns == 1000);
    CHECK(m.launches[2].start_ns == 2000);
    CHECK(m.launches[3].end_ns == 2600);
  }

  SECTION("nothing is guessed: a stream with a missing or extra record matches none of its launches") {
    const auto short_by_one =
        profile::match_in_stream_order(on_stream(3), {kernel_record(1000, 2000), kernel_record(3000, 4000)});
    CHECK(short_by_one.missing == 3);
    CHECK(short_by_one.extra == 0);
    for (const auto& l : short_by_one.launches) CHECK_FALSE(l.found);

    const auto one_extra =
        profile::match_in_stream_order(on_stream(1), {kernel_record(1000, 2000), kernel_record(3000, 4000)});
    CHECK(one_extra.missing == 1);
    CHECK(one_extra.extra == 1);

    // Stream 9 has one launch too few records; stream 7 still matches.
    const auto mixed = profile::match_in_stream_order(
        std::vector<uint32_t>{7, 9, 9}, {kernel_record(1000, 2000), kernel_record(1200, 1800, /*stream=*/9)});
    CHECK(mixed.missing == 2);
    CHECK(mixed.launches[0].found);
    CHECK_FALSE(mixed.launches[1].found);
    CHECK(mixed.streams == 2);
  }

  SECTION("kernels on a stream nobody launched on (another library's) are counted, not matched") {
    const auto m = profile::match_in_stream_order(
        on_stream(1), {kernel_record(1000, 2000), kernel_record(1200, 1800, 11), kernel_record(3000, 3100, 11)});
    CHECK(m.missing == 0);
    CHECK(m.extra == 2);
    CHECK(m.launches[0].end_ns == 2000);
  }

  SECTION("records without timestamps are ignored") {
    const auto m = profile::match_in_stream_order(
        on_stream(1), {kernel_record(1000, 2000), kernel_record(0, 0), kernel_record(900, 800)});
    CHECK(m.invalid == 2);
    CHECK(m.missing == 0);
    CHECK(m.launches[0].start_ns == 1000);
  }

  SECTION("an empty batch") {
    const auto m = profile::match_in_stream_order({}, {});
    CHECK(m.launches.empty());
    CHECK(m.missing == 0);
  }
}

TEST_CASE("the report names the timer and counts launches without a CUPTI record", "[cpu][profile][cupti]") {
  profile::ProfileData d;
  d.add(launch(d, "gemm", "forward", "0 linear", 10));
  d.timer = "cupti";
  d.wall_us = 20;
  CHECK(profile::format_totals(d).find("timer cupti") != std::string::npos);
  CHECK(profile::format_totals(d).find("without a CUPTI record") == std::string::npos);
  d.launches_without_record = 3;
  const std::string totals = profile::format_totals(d);
  INFO(totals);
  CHECK(totals.find("3 launches without a CUPTI record") != std::string::npos);
  const std::string json = profile::to_json(d);
  CHECK(json.find("\"timer\": \"cupti\"") != std::string::npos);
  CHECK(json.find("\"launches_without_record\": 3") != std::string::npos);
  d.timer = "launch stamps";  // its untimed launches are eager ones: no record was expected of them
  CHECK(profile::format_totals(d).find("3 launches without a time (launched eagerly") != std::string::npos);
}

namespace {
// `args` (with the test data) is a usage error: exit 2 and at most one line, which names `flag`.
void check_flag_refused(const std::string& args, const char* flag) {
  const auto r = test::run_command(test::cli_path() + " " + args + " --data " + test::mnist_dir());
  INFO(args << ": " << r.out);
  CHECK(r.exit_code == 2);
  CHECK(r.out.find(flag) != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') <= 1);
}
}  // namespace

TEST_CASE("the profile timer flag: bad values are one line naming it, and events and cupti run on the CPU",
          "[cpu][profile][cli][cupti]") {
  for (const char* command : {"profile", "train"})
    check_flag_refused(std::string(command) + " --device cpu --profile-timer nvtx", "--profile-timer");
  // --profile-graphs needs the graphs it profiles
  check_flag_refused("train --device cpu --profile-graphs --no-graphs", "--profile-graphs");
  check_flag_refused("train --device cpu --profile-graphs --debug-sync", "--profile-graphs");
  check_flag_refused("profile --device cpu --profile-graphs --debug-sync", "--profile-graphs");
  const auto r =
      test::run_command(test::cli_path() + " profile --device cpu --model mlp --batch 32 --steps 2 --warmup 0 " +
                        "--profile-timer cupti --data " + test::mnist_dir());
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("timer host") != std::string::npos);  // the CPU is timed by the host clock
}

TEST_CASE(
    "the profile sampling flag: out of range or with --profile-graphs is one line naming it, else a sampled "
    "table",
    "[cpu][profile][cli]") {
  for (const char* flags : {"--profile-every 0", "--profile-every 2000000", "--profile-every 4 --profile-graphs"})
    check_flag_refused(std::string("train --device cpu ") + flags, "--profile-every");
  const auto r = test::run_command(test::cli_path() + " train --device cpu --epochs 1 --batch 64 --train-limit 640 " +
                                   "--profile-every 5 --log-level warn --data " + test::mnist_dir());
  INFO(r.out);
  CHECK(r.exit_code == 0);
  // 10 training steps and 157 evaluation batches of 64 (the last partial): steps 5, 10, ... are timed.
  CHECK(r.out.find("sampled: 1 step in 5, 33 of 167 steps timed") != std::string::npos);
}
