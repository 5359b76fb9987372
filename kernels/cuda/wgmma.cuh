// Warpgroup MMAs (wgmma, sm_90a): the tensor-core multiply of Hopper, for the channels-last convolution
// (kernels/cuda/conv_channels_last.cu). A warpgroup (4 consecutive warps, 128 threads) multiplies D(64×N) += A(64×k)·
// B(N×k)ᵀ with both operands read by the tensor cores from shared memory, where mma.sync (mma_tf32.cuh, mma_bf16.cuh)
// needs every fragment loaded into registers first: at conv2's warp tiles that was 3 shared-memory wavefronts an MMA,
// more than the MMAs themselves (docs/conv.md, 'Warpgroup MMAs').
//
// Operand layout in shared memory (both operands "K-major": rows of k, as the channels-last kernel copies them), in
// wgmma's 128-byte swizzle: a slab holds kChunks = 8 chunks of 16 bytes of k per row (32 TF32 or 64 BF16 values), one
// 128-byte line a row, rows one after the other; chunk c of row r lies at chunk place c XOR (r % 8) of its line:
//     byte of (row, chunk) = row · 128 + ((chunk ^ (row % 8)) · 16)
// so any 8 consecutive rows' chunk c, and any row's 8 chunks, lie in distinct banks. The tensor cores read it so
// without conflicts; the plain layout of 8-row × 16-byte core matrices one after the other (no swizzle) read the same
// banks for every 8-row group and made the kernel slower than mma.sync (docs/conv.md, 'Warpgroup MMAs'). The pattern
// repeats every 8 rows (1 KB), so each operand must start 1024-byte aligned. One instruction takes k = 32 bytes (8
// TF32, 16 BF16): its descriptor starts 32 bytes further along the line for each k step, and its stride byte offset
// (the next 8-row group) is 1024.
//
// MN-major operands (BF16 only: wgmma transposes 16-bit operands alone), for a GEMM whose k is the slow index of both
// staged operands (the weight gradient: k = pixels, rows of channels): a line is one k of 64 consecutive M (or N)
// values, 128 bytes, in the same swizzle (line k's chunk c at c XOR k % 8); an atom is 8 such lines (1 KB). Atoms
// along k lie the stride byte offset apart (1024 where the lines follow each other), atoms along M or N the leading
// byte offset apart (CUTLASS's canonical form ((8,8,m),(8,k)):((1,8,LBO),(64,SBO)) in elements). One instruction
// takes k = 16, two atoms: its descriptor starts 2 KB further for each k step.
//
// D's layout (PTX ISA, "Register fragment of wgmma D"): warp w of the warpgroup holds rows 16w..16w+15; in it lane l
// (g = l / 4, t = l % 4) holds d[4j + e] at row 16w + g + 8·(e / 2), column 8j + 2t + (e % 2): the m16n8 C fragment of
// mma_tf32.cuh, repeated for each 8 columns j.
//
// Only device code compiled for sm_90a (the architecture-specific target; CMakeLists.txt builds 90a-real) has these
// instructions: NT_WGMMA is 1 there. Elsewhere the kernels that use them compile to a trap, and the host asks
// runs_warpgroup_mma() (kernels/cuda/launch.cu) before it launches one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NT_WGMMA 1
#else
#define NT_WGMMA 0
#endif

namespace nt::kernels::cuda::wgmma {

constexpr int kLineBytes = 128;                  // a row's k in a slab, one swizzle line
constexpr int kChunks = kLineBytes / 16;         // 16-byte chunks of k per row in a slab
constexpr int kGroupBytes = 8 * kLineBytes;      // an 8-row group: the swizzle pattern's period
constexpr int kStepBytes = 32;                   // one instruction's k
constexpr int kSteps = kLineBytes / kStepBytes;  // instructions per slab
constexpr int kRows = 64;                        // A's rows: a warpgroup's M
constexpr int kAlignment = kGroupBytes;          // of an operand's first row
constexpr int kMnValues = kLineBytes / 2;        // an MN-major line: 64 BF16 values of M (or N)
constexpr int kMnStepBytes = 2 * kGroupBytes;    // one instruction's k (16) in an MN-major operand

// Byte offset of (row, chunk) in an operand's slab.
__host__ __device__ constexpr int offset(int row, int chunk) { return row * kLineBytes + ((chunk ^ (row % 8)) * 16); }

// The first kAlignment-aligned byte at or after `bytes` (a kernel's dynamic shared memory, launched with kAlignment
// bytes more than its operands take): where the swizzle's period starts.
__device__ __forceinline__ unsigned char* aligned_to_swizzle(unsigned char* bytes) {
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(bytes));
  return bytes + (kAlignment - at % kAlignment) % kAlignment;
}

// The matrix descriptor of an operand (1024-byte aligned) at its k step's first byte `at`: start address (bits 0–13),
// leading byte offset (bits 16–29), stride byte offset (bits 32–45), all in 16-byte units; base offset 0 (bits
// 49–51); 128-byte swizzle (bits 62–63: 1). K-major (the defaults): the leading offset is unused where k fits one line
// (1), the stride is the next 8-row group. MN-major: leading = the next atom along M or N, stride = the next 8 lines
// of k.
__device__ __forceinline__ uint64_t descriptor(const void* at, uint32_t leading_bytes = 16,
                                               uint32_t stride_bytes = kGroupBytes) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(at));
  return uint64_t((address & 0x3FFFF) >> 4) | (uint64_t((leading_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// Orders this thread's earlier shared-memory writes (st.shared, cp.async once waited for) before later reads by
// the async proxy, which is how wgmma reads its operands. Each writer calls it before the barrier that publishes them.
__device__ __forceinline__ void publish_shared_to_async_proxy() {
#if NT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Before the first wgmma of a batch: the accumulators' registers, as other instructions left them, are ready.
__device__ __forceinline__ void fence() {
#if NT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

// Closes the batch of wgmma issued since the last commit, then waits until at most kInFlight batches are in flight.
template <int kInFlight>
__device__ __forceinline__ void commit_and_wait() {
#if NT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned %0;" ::"n"(kInFlight) : "memory");
#endif
}

// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void hold(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// How an operand lies in shared memory: rows of k (K-major), or lines of M or N (MN-major, BF16 only).
enum class Major { k, mn };

// D(64×N) += A·Bᵀ on operands of Element (float: TF32, k 8; __nv_bfloat16: BF16, k 16), both from shared memory
// (descriptors a, b) and both laid out as kMajor says, fp32 D (N / 2 values a thread); scale-d 1 (accumulate),
// operands not negated.
template <class Element, int N, Major kMajor = Major::k>
struct Mma;

// The instructions the kernels use, one specialization each (N = 32, 48 or 64: 16, 24 or 32 accumulator registers,
// then the two descriptors and the scale-d predicate's register).
#define NT_WGMMA_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define NT_WGMMA_REGS24 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}"
#define NT_WGMMA_REGS32                                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define NT_WGMMA_OUT16                                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define NT_WGMMA_OUT24 \
  NT_WGMMA_OUT16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define NT_WGMMA_OUT32 \
  NT_WGMMA_OUT24, "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#if NT_WGMMA
#define NT_WGMMA_ASM(INSTRUCTION, REGISTERS, DESCRIPTORS, SCALE_D, FLAGS, ...)                                       \
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " SCALE_D ", 0;\n\t" INSTRUCTION " " REGISTERS ", " DESCRIPTORS \
               ", p, " FLAGS ";\n\t}"                                                                                \
               : __VA_ARGS__                                                                                         \
               : "l"(a), "l"(b), "r"(1))
#else
#define NT_WGMMA_ASM(...) __trap()  // no wgmma in this code: the host never launches it here
#endif
#define NT_WGMMA_SPECIALIZATION(ELEMENT, N, MAJOR, ...)                                                  \
  template <>                                                                                            \
  struct Mma<ELEMENT, N, MAJOR> {                                                                        \
    __device__ static void run(float (&d)[N / 2], uint64_t a, uint64_t b) { NT_WGMMA_ASM(__VA_ARGS__); } \
  }

// TF32 (float elements, rounded to TF32 where they were staged): no transpose flags; BF16: both operands K-major
// (transpose 0), or both MN-major (transpose 1).
NT_WGMMA_SPECIALIZATION(float, 32, Major::k, "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32", NT_WGMMA_REGS16,
                        "%16, %17", "%18", "1, 1", NT_WGMMA_OUT16);
NT_WGMMA_SPECIALIZATION(float, 48, Major::k, "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32", NT_WGMMA_REGS24,
                        "%24, %25", "%26", "1, 1", NT_WGMMA_OUT24);
NT_WGMMA_SPECIALIZATION(float, 64, Major::k, "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", NT_WGMMA_REGS32,
                        "%32, %33", "%34", "1, 1", NT_WGMMA_OUT32);
NT_WGMMA_SPECIALIZATION(__nv_bfloat16, 32, Major::k, "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16",
                        NT_WGMMA_REGS16, "%16, %17", "%18", "1, 1, 0, 0", NT_WGMMA_OUT16);
NT_WGMMA_SPECIALIZATION(__nv_bfloat16, 48, Major::k, "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16",
                        NT_WGMMA_REGS24, "%24, %25", "%26", "1, 1, 0, 0", NT_WGMMA_OUT24);
NT_WGMMA_SPECIALIZATION(__nv_bfloat16, 64, Major::k, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                        NT_WGMMA_REGS32, "%32, %33", "%34", "1, 1, 0, 0", NT_WGMMA_OUT32);

NT_WGMMA_SPECIALIZATION(__nv_bfloat16, 32, Major::mn, "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16",
                        NT_WGMMA_REGS16, "%16, %17", "%18", "1, 1, 1, 1", NT_WGMMA_OUT16);
NT_WGMMA_SPECIALIZATION(__nv_bfloat16, 48, Major::mn, "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16",
                        NT_WGMMA_REGS24, "%24, %25", "%26", "1, 1, 1, 1", NT_WGMMA_OUT24);
NT_WGMMA_SPECIALIZATION(__nv_bfloat16, 64, Major::mn, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                        NT_WGMMA_REGS32, "%32, %33", "%34", "1, 1, 1, 1", NT_WGMMA_OUT32);

}  // namespace nt::kernels::cuda::wgmma
