// The measured ceilings of the current GPU (kernels/ceilings.h, profile/ceilings.h): the rates that a profile's
// GB/s and GFLOP/s are shown as a share of. Each is the median of kRepetitions timed runs (CUDA events around each
// one, nothing else between them on the stream) after warm-up runs, which also lift the clocks from idle.
//
// copy   cudaMemcpyAsync, device to device, of one buffer of up to 512 MiB (a quarter of the free memory on a small
//        GPU; at least kMinCopyBytes), far larger than any L2, so every byte comes from and goes to DRAM.
//        Rate = (bytes read + bytes written) / time = 2·size / time: the same count as an op's OpCost::bytes, so a
//        kernel that streams its inputs and outputs once compares with it directly. It is what the driver's own
//        copy reaches, not the data sheet's bandwidth: DRAM delivers some 80-90% of that at best, and a roofline
//        against the data sheet would call a perfect kernel slow.
//
// fp32   ceiling_fp32_fma: every thread runs kFmaChains independent chains a ← fma(a, b, c), kFmaIterations steps
//        each, in a loop unrolled 32 steps deep (the loop's own counter and branch are ~1% of its instructions).
//        Independent chains hide the FMA latency (4 cycles), and kBlock-thread blocks fill every SM to the occupancy
//        the registers allow, several waves of them, so the FMA pipes never wait: the rate is the issue rate of
//        FFMA, 2 flops each. That is the fp32 peak the engine's FMA kernels (GEMM, convolutions without --tf32) can
//        approach; none of them can pass it.
//        Honesty: b and c are arguments (1 and 2^-10), so the compiler cannot fold or shorten the chains, and with
//        b = 1 the chain is a_n = a_0 + n·c, exact in fp32 for these values (a_0 = 1 + k/1024, k < 512, so every a_n
//        is a multiple of 2^-10 below 8, where the ulp is 2^-21). Each thread writes the fp32 sum of its chains,
//        and the host recomputes that sum with the same fp32 operations (std::fma, then the sum in the same
//        order) for each of the 64 start patterns: every thread's result must match bit for bit, so a loop that
//        ran fewer steps, or not at all, is an error, not a fast number.
//
// tf32   ceiling_tf32_mma: per warp, kMmaAccumulators independent accumulators D ← A·B + D, each one
//        mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (2·16·8·8 = 2048 flops), kMmaIterations steps each,
//        operands in registers, no memory traffic in the loop. It is the very instruction and helper
//        (kernels/cuda/mma_tf32.cuh, mma_16x8x8) that the engine's TF32 convolutions issue, so the ceiling is the
//        rate those kernels could reach. It is not the GPU's tensor-core peak: on sm_90 (H100) the peak needs
//        wgmma (warpgroup MMA fed from shared memory), which the engine does not use; mma.sync reaches a fraction
//        of it there. On sm_80..89 mma.sync is the tensor cores' native path.
// bf16   ceiling_bf16_mma: the same with mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (2·16·8·16 = 4096
//        flops), the instruction a BF16 path of the engine would use.
//        Honesty, both: the operands are small dyadic values ((4 + ((r + k) mod 4)) / 64 in A, (4 + ((3k + c) mod
//        4)) / 64 in B), exact in TF32 and BF16, whose products and sums are exact in fp32 for kMmaIterations steps
//        (every accumulator stays below 512 and a multiple of 2^-12); accumulator i starts at i, so no two are equal.
//        Each thread writes the fp32 sum of its accumulators and the host recomputes it from the fragment layouts
//        of the PTX ISA ("Matrix Fragments for mma.m16n8k8" / "mma.m16n8k16"): bit for bit, for every lane.
//        Both need sm_80 code: a device that runs older code (a compute_75 build, a T4) gets 0 for them, and their
//        kernels are compiled as empty stubs for such passes, never launched.
//
// Each loop's grid is sized by a first timed run of one wave (resident blocks per SM × SMs): the timed runs use as
// many waves as make one run about kTargetMs long (at most kMaxWaves), long enough that launch overhead and the
// last wave's tail are below a percent. Programmatic dependent launch is off for these launches, so each timed
// interval holds its kernel alone. What is not measured: a DRAM read or write alone (copy mixes them 1:1), L2 or
// shared-memory bandwidth, fp16, fp64, and the clocks are whatever the GPU chose under this load (boost, power
// limit): the ceiling of this GPU as it runs, not as specified.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <utility>
#include <vector>

#include "kernels/ceilings.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_tf32.cuh"
#include "kernels/runtime.h"

namespace nt::kernels::cuda {

int running_code_arch();  // kernels/cuda/probe.cu

namespace {

constexpr int kRepetitions = 11;  // timed runs of each loop; the median is the ceiling
constexpr int kWarmups = 3;       // untimed runs first, at the timed size
constexpr double kTargetMs = 5;   // the length of one timed run
constexpr int kMaxWaves = 64;
constexpr int kBlock = 256;

constexpr size_t kMaxCopyBytes = size_t{512} << 20;
constexpr size_t kMinCopyBytes = size_t{32} << 20;

constexpr int kFmaChains = 8;
constexpr int kFmaUnroll = 32;
constexpr int kFmaIterations = 4096;  // a multiple of kFmaUnroll
constexpr int kFmaPatterns = 64;      // start values differ by thread index mod 64
constexpr float kFmaB = 1.0f;
constexpr float kFmaC = 1.0f / 1024;

constexpr int kMmaAccumulators = 8;
constexpr int kMmaIterations = 2048;  // keeps every accumulator exact (see above)

// ---- CUDA kernels ----------------------------------------------------------------------------------

// Chain j of a thread whose index is `pattern` mod 64 starts at 1 + (8·pattern + j)/1024: exact, in [1, 1.5).
__host__ __device__ inline float fma_start(int pattern, int chain) {
  return 1.0f + static_cast<float>(pattern * kFmaChains + chain) / 1024;
}

// out: (grid·block) floats, = the sum of each thread's chains.
__global__ void __launch_bounds__(kBlock)
    ceiling_fp32_fma_kernel(float* out, float b, float c, int iterations, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int tid = static_cast<int>(blockIdx.x) * kBlock + static_cast<int>(threadIdx.x);
  float a[kFmaChains];
#pragma unroll
  for (int j = 0; j < kFmaChains; ++j) a[j] = fma_start(tid % kFmaPatterns, j);
  for (int i = 0; i < iterations; i += kFmaUnroll) {
#pragma unroll
    for (int u = 0; u < kFmaUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kFmaChains; ++j) a[j] = fmaf(a[j], b, c);
  }
  float sum = 0;
#pragma unroll
  for (int j = 0; j < kFmaChains; ++j) sum += a[j];
  out[tid] = sum;
}

// The operands of the MMA loops: A (16×K) and B (K×8), small dyadic values exact in TF32 and BF16.
__host__ __device__ inline float mma_a(int row, int k) { return static_cast<float>(4 + (row + k) % 4) / 64; }
__host__ __device__ inline float mma_b(int k, int col) { return static_cast<float>(4 + (3 * k + col) % 4) / 64; }

// Accumulator element e (c0..c3) of lane `lane` lies at row g + 8·(e / 2), column 2t + e % 2 of the 16×8 tile
// (g = lane / 4, t = lane % 4), for both shapes.
__host__ __device__ inline int acc_row(int lane, int e) { return lane / 4 + (e >= 2 ? 8 : 0); }
__host__ __device__ inline int acc_col(int lane, int e) { return 2 * (lane % 4) + (e & 1); }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Two bf16 in one register, `lo` in the low half (the lower column or row index). Exact: the values have at most
// 3 significant bits, so dropping the low 16 bits of the fp32 pattern loses nothing.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

// d += a·b on one 16×8×16 tile (bf16 operands, fp32 accumulators).
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The timed loop of both MMA kernels: kMmaAccumulators independent accumulators (accumulator i starts at i), each
// multiplied `iterations` times by the same fragments, then every element summed into this thread's out.
template <class Mma>
__device__ __forceinline__ void mma_loop(const uint32_t (&a)[4], const uint32_t (&b)[2], int iterations, float* out,
                                         Mma mma) {
  float acc[kMmaAccumulators][4];
#pragma unroll
  for (int i = 0; i < kMmaAccumulators; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = static_cast<float>(i);
#pragma unroll 4
  for (int it = 0; it < iterations; ++it)
#pragma unroll
    for (int i = 0; i < kMmaAccumulators; ++i) mma(acc[i], a, b);
  float sum = 0;
#pragma unroll
  for (int i = 0; i < kMmaAccumulators; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) sum += acc[i][e];
  out[blockIdx.x * kBlock + threadIdx.x] = sum;
}
#endif

// out: (grid·block) floats, = the sum of each thread's accumulator elements, accumulator by accumulator.
__global__ void __launch_bounds__(kBlock) ceiling_tf32_mma_kernel(float* out, int iterations, StampRing stamps) {
  begin_dependent_kernel(stamps);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  // Fragments of mma.m16n8k8 (kernels/cuda/mma_tf32.cuh): a0 A[g][t], a1 A[g+8][t], a2 A[g][t+4], a3 A[g+8][t+4];
  // b0 B[t][g], b1 B[t+4][g].
  const uint32_t a[4] = {mma_tf32::to_tf32(mma_a(g, t)), mma_tf32::to_tf32(mma_a(g + 8, t)),
                         mma_tf32::to_tf32(mma_a(g, t + 4)), mma_tf32::to_tf32(mma_a(g + 8, t + 4))};
  const uint32_t b[2] = {mma_tf32::to_tf32(mma_b(t, g)), mma_tf32::to_tf32(mma_b(t + 4, g))};
  mma_loop(a, b, iterations, out,
           [](float(&d)[4], const uint32_t(&x)[4], const uint32_t(&y)[2]) { mma_tf32::mma_16x8x8(d, x, y); });
#else
  (void)out, (void)iterations;  // a pass for code older than sm_80: never launched (mma_loops_run)
#endif
}

__global__ void __launch_bounds__(kBlock) ceiling_bf16_mma_kernel(float* out, int iterations, StampRing stamps) {
  begin_dependent_kernel(stamps);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  // Fragments of mma.m16n8k16 (.bf16), two elements a register, the first in the low half:
  // a0,a1 A[g][2t..2t+1]  a2,a3 A[g+8][2t..2t+1]  a4,a5 A[g][2t+8..2t+9]  a6,a7 A[g+8][2t+8..2t+9];
  // b0,b1 B[2t..2t+1][g]  b2,b3 B[2t+8..2t+9][g].
  const uint32_t a[4] = {
      pack_bf16(mma_a(g, 2 * t), mma_a(g, 2 * t + 1)), pack_bf16(mma_a(g + 8, 2 * t), mma_a(g + 8, 2 * t + 1)),
      pack_bf16(mma_a(g, 2 * t + 8), mma_a(g, 2 * t + 9)), pack_bf16(mma_a(g + 8, 2 * t + 8), mma_a(g + 8, 2 * t + 9))};
  const uint32_t b[2] = {pack_bf16(mma_b(2 * t, g), mma_b(2 * t + 1, g)),
                         pack_bf16(mma_b(2 * t + 8, g), mma_b(2 * t + 9, g))};
  mma_loop(a, b, iterations, out,
           [](float(&d)[4], const uint32_t(&x)[4], const uint32_t(&y)[2]) { mma_bf16_16x8x16(d, x, y); });
#else
  (void)out, (void)iterations;
#endif
}

// ---- host references ---------------------------------------------------------------------------------

// What ceiling_fp32_fma_kernel writes for a thread whose index is `pattern` mod 64, by the same fp32 operations.
float fma_expected(int pattern, int iterations) {
  float a[kFmaChains];
  for (int j = 0; j < kFmaChains; ++j) a[j] = fma_start(pattern, j);
  for (int i = 0; i < iterations; ++i)
    for (float& v : a) v = std::fma(v, kFmaB, kFmaC);
  float sum = 0;
  for (float v : a) sum += v;
  return sum;
}

// What an MMA loop of depth K (8: TF32, 16: BF16) writes for lane `lane`: accumulator i's element e is
// i + iterations·(A·B)[row][col], exact; then the kernel's fp32 sum, in its order.
float mma_expected(int lane, int K, int iterations) {
  float sum = 0;
  for (int i = 0; i < kMmaAccumulators; ++i)
    for (int e = 0; e < 4; ++e) {
      double dot = 0;
      for (int k = 0; k < K; ++k) dot += double(mma_a(acc_row(lane, e), k)) * mma_b(k, acc_col(lane, e));
      sum += static_cast<float>(i + iterations * dot);
    }
  return sum;
}

// Every thread's result against the expectation of its pattern (index mod patterns.size()).
void check_results(const char* kernel, const std::vector<float>& got, const std::vector<float>& patterns) {
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = patterns[i % patterns.size()];
    if (std::memcmp(&got[i], &want, sizeof want) != 0)
      throw InternalError(cat(kernel, ": thread ", i, " wrote ", got[i], ", expected ", want,
                              ": the loop did not run as written, so its rate would be false"));
  }
}

// ---- timing ------------------------------------------------------------------------------------------

class Events {
 public:
  explicit Events(int pairs) : start_(pairs), stop_(pairs) {
    for (auto* list : {&start_, &stop_})
      for (auto& e : *list) NT_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (auto* list : {&start_, &stop_})
      for (auto e : *list)
        if (e) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t start(int i) const { return start_[static_cast<size_t>(i)]; }
  cudaEvent_t stop(int i) const { return stop_[static_cast<size_t>(i)]; }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

// Milliseconds of each of `runs` runs of `enqueue`, each between two events and nothing else on the stream.
template <class Enqueue>
std::vector<double> time_runs(const Exec& exec, int runs, Enqueue&& enqueue) {
  Events events(runs);
  for (int r = 0; r < runs; ++r) {
    NT_CUDA_CHECK(cudaEventRecord(events.start(r), stream_of(exec)));
    enqueue();
    NT_CUDA_CHECK(cudaEventRecord(events.stop(r), stream_of(exec)));
  }
  NT_CUDA_CHECK(cudaStreamSynchronize(stream_of(exec)));
  std::vector<double> ms(static_cast<size_t>(runs));
  for (int r = 0; r < runs; ++r) {
    float t = 0;
    NT_CUDA_CHECK(cudaEventElapsedTime(&t, events.start(r), events.stop(r)));
    ms[static_cast<size_t>(r)] = t;
  }
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A device buffer for the length of a measurement.
struct DeviceBytes {
  explicit DeviceBytes(size_t bytes) : ptr(device_alloc(Backend::cuda, bytes)) {}
  ~DeviceBytes() { device_free(Backend::cuda, ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* ptr;
};

// ---- the loops ---------------------------------------------------------------------------------------

struct Rate {
  double per_s = 0;   // GB/s or GFLOP/s
  std::string notes;  // the sizes, for Ceilings::method
};

Rate measure_copy(const Exec& exec) {
  size_t free_bytes = 0, total = 0;
  NT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  const size_t bytes = std::min(kMaxCopyBytes, free_bytes / 4 / (size_t{1} << 20) * (size_t{1} << 20));
  if (bytes < kMinCopyBytes)
    throw Error(cat("measuring the copy ceiling needs 2 x ", kMinCopyBytes >> 20, " MiB of free GPU memory; ",
                    free_bytes >> 20, " MiB are free (see nvidia-smi for what holds the rest)"));
  DeviceBytes src(bytes), dst(bytes);
  NT_CUDA_CHECK(cudaMemsetAsync(src.ptr, 0x3c, bytes, stream_of(exec)));  // pages touched, the same as any data
  NT_CUDA_CHECK(cudaMemsetAsync(dst.ptr, 0, bytes, stream_of(exec)));
  auto copy = [&] {
    NT_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, stream_of(exec)));
  };
  time_runs(exec, kWarmups, copy);
  const double ms = median(time_runs(exec, kRepetitions, copy));
  return {2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9,
          cat("copy: cudaMemcpyAsync device to device of ", bytes >> 20, " MiB, (read + written) bytes / time")};
}

// Runs one loop kernel, `launch_waves(waves)` enqueuing it over that many waves, sized and timed as the top of this
// file says; returns the median milliseconds and the waves used.
template <class LaunchWaves>
std::pair<double, int> time_loop(const Exec& exec, LaunchWaves&& launch_waves) {
  launch_waves(1);  // loads the module, lifts the clocks
  const double one_wave_ms = median(time_runs(exec, 3, [&] { launch_waves(1); }));
  const int waves = std::clamp(static_cast<int>(std::ceil(kTargetMs / std::max(one_wave_ms, 1e-3))), 1, kMaxWaves);
  time_runs(exec, kWarmups, [&] { launch_waves(waves); });
  return {median(time_runs(exec, kRepetitions, [&] { launch_waves(waves); })), waves};
}

// Resident blocks of `kernel` per SM times the SMs: one wave.
template <class Kernel>
int blocks_per_wave(Kernel kernel) {
  int per_sm = 0;
  NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlock, 0));
  NT_CHECK(per_sm > 0, "a ceiling kernel of ", kBlock, " threads does not fit on an SM");
  return per_sm * multiprocessor_count();
}

std::vector<float> download(const Exec& exec, const float* src, size_t n) {
  std::vector<float> host(n);
  NT_CUDA_CHECK(cudaMemcpyAsync(host.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_of(exec)));
  NT_CUDA_CHECK(cudaStreamSynchronize(stream_of(exec)));
  return host;
}

Rate measure_fp32(const Exec& exec) {
  const int wave = blocks_per_wave(ceiling_fp32_fma_kernel);
  DeviceBytes out(size_t{kMaxWaves} * wave * kBlock * sizeof(float));
  auto* y = static_cast<float*>(out.ptr);
  int last_grid = 0;
  auto run = [&](int waves) {
    const int grid = waves * wave;
    const double threads = double(grid) * kBlock;
    launch(exec, "ceiling_fp32_fma", profile::OpCost{threads * 4, threads * kFmaChains * kFmaIterations * 2.0},
           ceiling_fp32_fma_kernel, dim3(grid), dim3(kBlock), 0, y, kFmaB, kFmaC, kFmaIterations);
    last_grid = grid;
  };
  const auto [ms, waves] = time_loop(exec, run);
  std::vector<float> patterns(kFmaPatterns);
  for (int p = 0; p < kFmaPatterns; ++p) patterns[static_cast<size_t>(p)] = fma_expected(p, kFmaIterations);
  check_results("ceiling_fp32_fma", download(exec, y, size_t(last_grid) * kBlock), patterns);
  const double flops = double(last_grid) * kBlock * kFmaChains * kFmaIterations * 2.0;
  return {flops / (ms * 1e-3) / 1e9, cat("fp32: ", last_grid, " blocks (", waves, " waves) x ", kBlock, " threads x ",
                                         kFmaChains, " FFMA chains x ", kFmaIterations, " steps")};
}

// kDepth: the MMA's K (8: TF32 m16n8k8, 16: BF16 m16n8k16).
template <int kDepth>
Rate measure_mma(const Exec& exec, void (*kernel)(float*, int, StampRing), const char* name, const char* label,
                 const char* instruction) {
  const int wave = blocks_per_wave(kernel);
  DeviceBytes out(size_t{kMaxWaves} * wave * kBlock * sizeof(float));
  auto* y = static_cast<float*>(out.ptr);
  constexpr double kFlopsPerMma = 2.0 * 16 * 8 * kDepth;
  const double mmas_per_warp = double(kMmaAccumulators) * kMmaIterations;
  int last_grid = 0;
  auto run = [&](int waves) {
    const int grid = waves * wave;
    const double threads = double(grid) * kBlock;
    const profile::OpCost cost{.bytes = threads * 4,
                               .flops = threads / 32 * mmas_per_warp * kFlopsPerMma,
                               .math = kDepth == 8 ? profile::Math::tf32 : profile::Math::bf16};
    launch(exec, name, cost, kernel, dim3(grid), dim3(kBlock), 0, y, kMmaIterations);
    last_grid = grid;
  };
  const auto [ms, waves] = time_loop(exec, run);
  std::vector<float> lanes(32);
  for (int l = 0; l < 32; ++l) lanes[static_cast<size_t>(l)] = mma_expected(l, kDepth, kMmaIterations);
  check_results(name, download(exec, y, size_t(last_grid) * kBlock), lanes);
  const double flops = double(last_grid) * kBlock / 32 * mmas_per_warp * kFlopsPerMma;
  return {flops / (ms * 1e-3) / 1e9,
          cat(label, ": ", instruction, ", ", last_grid, " blocks (", waves, " waves) x ", kBlock / 32, " warps x ",
              kMmaAccumulators, " accumulators x ", kMmaIterations, " steps")};
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

profile::Ceilings measure_ceilings(const Exec& exec) {
  int device = 0;
  NT_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  NT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  // Each timed interval holds its kernel alone: no launch overlaps the one before it.
  Exec e = exec;
  e.programmatic_launch = false;

  profile::Ceilings c;
  c.uuid = cuda_device_uuid(device);
  c.device = prop.name;
  c.measured_at = utc_now_iso8601();
  std::string method;
  const Rate fp32 = measure_fp32(e);  // first: the longest warm-up, which lifts the clocks for the others
  c.fp32_gflop_per_s = fp32.per_s;
  method = fp32.notes;
  if (running_code_arch() >= 80) {
    const Rate tf32 =
        measure_mma<8>(e, ceiling_tf32_mma_kernel, "ceiling_tf32_mma", "tf32", "mma.sync m16n8k8 TF32 (mma_tf32.cuh)");
    const Rate bf16 = measure_mma<16>(e, ceiling_bf16_mma_kernel, "ceiling_bf16_mma", "bf16", "mma.sync m16n8k16 BF16");
    c.tf32_gflop_per_s = tf32.per_s;
    c.bf16_gflop_per_s = bf16.per_s;
    method += "; " + tf32.notes + "; " + bf16.notes;
  } else {
    method += cat("; tf32, bf16: not measured (compute_", running_code_arch(), " code, mma.sync needs sm_80)");
  }
  const Rate copy = measure_copy(e);
  c.copy_gb_per_s = copy.per_s;
  method = cat(copy.notes, "; ", method, "; each the median of ", kRepetitions, " runs timed by CUDA events after ",
               kWarmups, " warm-up runs (kernels/cuda/ceilings.cu)");
  c.method = method;
  return c;
}

}  // namespace nt::kernels::cuda
