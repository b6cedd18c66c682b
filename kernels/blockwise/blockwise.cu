// CUDA kernels of block-wise codebook quantization and SRAM-quantiles. Per-element results come
// from blockwise_ops.hpp (shared with the CPU twin); this file only organizes the work:
//
//   quantize   : the group pass of common/group_pass.cuh (its flat kernel: 16 consecutive
//                elements per thread staged through shared memory, amax by shuffles and
//                across warps), each element's nearest entry found through a bucket
//                table of the codebook (blockwise_ops.hpp) that each thread block builds in
//                its shared memory from the codebook in the kernel's parameters. Nested: the
//                same pass runs again over the float absmax values (blocks of 256).
//   dequantize : the element-wise map (16-byte stores), the codebook in shared memory, the
//                absmax values through the read-only cache.
//   (SRAM-quantiles: quantiles.cu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../common/cuda_map.cuh"
#include "../common/element_ops.hpp"
#include "../common/group_pass.cuh"
#include "blockwise_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace ops = blockwise_ops;

// The codebook tables with their bucket table (blockwise_ops.hpp) in each thread block's shared
// memory, where the kernels' lookups go (data dependent: shared memory serves them at far more
// lookups per cycle than the L1 cache): the tables first, then the bucket table, 16-byte
// aligned.
constexpr int tables_bytes = (sizeof(ops::tables) + 15) / 16 * 16;
static_assert(ops::bucket_bias % 16 == 0, "the bucket table's base less the bias stays 16-aligned");
constexpr int blob_bytes =
    tables_bytes + (static_cast<int>(sizeof(std::uint32_t) * ops::bucket_count) + 15) / 16 * 16;
static_assert(sizeof(ops::tables) % 4 == 0 && sizeof(ops::tables) <= 3584,
              "the tables travel in the kernels' parameters (4 KiB with the rest)");

// How a kernel finds each element's code: the nearest entry through buckets whose table is
// simple (ops::simple_buckets: one step at most per bucket, nothing below 2^-32 changes the
// index), the nearest entry through any bucket table, or stochastic rounding. A template
// argument, so that each kernel carries no per-element test of it.
enum class search { simple, buckets, stochastic };

// Block-wise quantization as a group rule (common/group_pass.cuh): the stored absmax, and each
// element's code, exactly ops::encode. The division by the block's absmax goes through one
// reciprocal per block (ops::scaled_divisor for simple tables, with no branch per element: its
// folded form, and the scaled one for the few blocks that are slow; ops::block_divisor
// otherwise), the nearest entry through the bucket table.
template <search S> struct codebook_rule {
  using scale_type = float;
  using divisor = std::conditional_t<S == search::simple, ops::scaled_divisor, ops::block_divisor>;
  struct group {
    std::uint32_t amax;
    divisor div;
    bool poisoned;
  };
  std::uint32_t zero_code;
  // Shared-memory address of the bucket table (a multiple of 16) less ops::bucket_bias (a
  // multiple of 16 too): the base of ops::signed_base.
  std::uint32_t bucket_base;
  // 1 and -4 from the kernels' parameters, whose values the compiler does not see, so that the
  // address arithmetic of code() stays multiply-adds.
  std::uint32_t one, minus_4;
  __device__ group begin(std::uint32_t amax_bits) const {
    // An all-zero block keeps x (ops::normalized): dividing by 1 does. A poisoned block (NaN or
    // Inf inside) is uniform (zero_code), so element() sees only blocks with finite elements,
    // whose t = x / a lies in [-1, 1].
    const bool poisoned = ops::poisoned(amax_bits);
    const float a = amax_bits == 0 || poisoned ? 1.0f : __uint_as_float(amax_bits);
    return {amax_bits, divisor::make(a), poisoned};
  }
  // Simple tables: element() returns the step entry plus t's low bits, the code in bits 24-31.
  static constexpr int code_byte = S == search::simple ? 3 : 0;
  __device__ bool uniform(const group& g, std::uint32_t& code) const {
    code = zero_code << (8 * code_byte);
    return g.poisoned;
  }
  __device__ float stored(const group& g) const { return ops::stored_absmax(g.amax); }
  // Simple tables: the blocks whose absmax the folded form of the divisor does not serve are
  // slow (group_pass.cuh), so that element() carries no test of it per element.
  __device__ bool slow(const group& g) const requires(S == search::simple) { return !g.div.folded; }
  __device__ std::uint32_t element(const group& g, float x, std::uint32_t rbits) const {
    if constexpr (S == search::simple)
      return code(g.div.folded_quotient(x));
    else if constexpr (S == search::stochastic)
      return ops::stochastic_index(tables()->value, g.div(x), rbits);
    else
      return code(g.div(x));
  }
  __device__ std::uint32_t slow_element(const group& g, float x, std::uint32_t) const
      requires(S == search::simple) {
    return code(g.div.scaled(x));
  }
  // The nearest entry's code of t through the bucket table, for simple tables the step word
  // (the code in bits 24-31). The sign mask and the sign's base are multiply-adds (with the rule's
  // one and minus_4), so that the element's integer work is split between the integer pipe and
  // the multiply-add pipe.
  __device__ std::uint32_t code(float t) const {
    const std::uint32_t bits = __float_as_uint(t);
    const std::uint32_t mask = ops::sign_mask(bits, one);
    const std::uint32_t at = ops::entry_address(ops::signed_base(bucket_base, mask, minus_4), bits);
    std::uint32_t e;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(e) : "r"(at));
    if constexpr (S == search::simple)
      return ops::step_bucket_word(e, bits, mask);
    else
      return ops::nearest_in_bucket(e, tables()->sum_hi, tables()->sum_lo, t);
  }
  static __device__ const ops::tables* tables() {
    return reinterpret_cast<const ops::tables*>(group_pass::group_shared());
  }
  static constexpr bool stochastic() { return S == search::stochastic; }
};

// The kernels' parameter (a group rule with shared tables, common/group_pass.cuh): the codebook's
// tables travel in it, read in place (__grid_constant__), so that a call is one kernel launch
// with nothing to copy or allocate first. to_shared() copies them into the thread block's shared
// memory, builds the bucket table there (ops::bucket_entry, about four entries per thread of a
// flat-kernel block, while its first tiles stream in), and returns the rule above.
template <search S> struct codebook_params {
  using scale_type = float;
  static constexpr int shared_bytes = blob_bytes;
  static constexpr int code_byte = codebook_rule<S>::code_byte;
  ops::tables tb;
  std::uint32_t zero_code;
  std::uint32_t one = 1, minus_4 = static_cast<std::uint32_t>(-4);
  __device__ codebook_rule<S> to_shared() const {
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    unsigned char* const smem = group_pass::group_shared();
    const auto* src = reinterpret_cast<const std::uint32_t*>(&tb);
    auto* dst = reinterpret_cast<std::uint32_t*>(smem);
    for (int j = tid; j < static_cast<int>(sizeof(ops::tables) / 4); j += nt)
      dst[j] = src[j];
    if constexpr (S != search::stochastic) { // (stochastic rounding searches the entries)
      __syncthreads();
      const auto* t = reinterpret_cast<const ops::tables*>(smem);
      auto* buckets = reinterpret_cast<std::uint32_t*>(smem + tables_bytes);
      for (int u = tid; u < static_cast<int>(ops::bucket_count); u += nt)
        buckets[u] = ops::bucket_entry(t->sum_hi, t->sum_lo, static_cast<std::uint32_t>(u));
    }
    // The base through an opaque move: the compiler then keeps it in a register instead of
    // recomputing the shared window's base for every element.
    const std::uint32_t base = kept(shared_address(smem + tables_bytes) - ops::bucket_bias);
    return {zero_code, base, one, minus_4};
  }
};

template <class In>
void launch_quantize(const In* x, std::int64_t n, std::int64_t block, std::uint8_t* codes,
                     float* absmax, const ops::tables& tb, std::uint32_t zero_code, bool stochastic,
                     const emu::random_stream& rng, cudaStream_t stream) {
  if (n == 0)
    return;
  const matrix_shape flat{1, n, n};
  const auto run = [&](auto params) {
    params.tb = tb;
    params.zero_code = zero_code;
    launch_groups(x, flat, codes, flat, absmax, 1, block, params, rng, stream);
  };
  if (stochastic)
    run(codebook_params<search::stochastic>{});
  else if (ops::simple_buckets(tb))
    run(codebook_params<search::simple>{});
  else
    run(codebook_params<search::buckets>{});
}

// Dequantization in the element-wise map: out[i] = cb[codes[i]] * a[i / block], the codebook(s)
// in shared memory, the block's absmax read once per chunk of the map (blocks are at least 64
// elements, a power of two, so a chunk never straddles two).
struct dequant_op {
  static constexpr bool needs_position = false, needs_index = true;
  static constexpr int shared_floats = 512;
  const float* cb;            // cb[0..255], cb2 at cb + 256 (nested)
  const float* absmax;        // plain
  const std::uint8_t* codes2; // nested: a = cb2[codes2[b]] * absmax2[b / nested_block]
  const float* absmax2;
  int block_log2;
  __device__ dequant_op to_shared(float* table) const {
    for (int j = threadIdx.x; j < shared_floats; j += blockDim.x)
      table[j] = __ldg(cb + j);
    dequant_op o = *this;
    o.cb = table;
    return o;
  }
  struct block_op { // the elements of one block
    const float* cb;
    float a;
    __device__ float operator()(std::uint8_t c, std::int64_t, std::int64_t, std::uint32_t) const {
      return ops::decode(cb[c], a);
    }
  };
  __device__ block_op at(std::int64_t i0) const {
    const std::int64_t b = i0 >> block_log2;
    const float a = codes2 == nullptr ? __ldg(absmax + b)
                                      : ops::decode(cb[256 + __ldg(codes2 + b)],
                                                    __ldg(absmax2 + b / nested_block));
    return {cb, a};
  }
  __device__ float operator()(std::uint8_t c, std::int64_t i, std::int64_t r,
                              std::uint32_t rb) const {
    return at(i)(c, i, r, rb);
  }
};

} // namespace

void quantize_blockwise(const blockwise_problem& p, const exec& ex) {
  const cudaStream_t stream = stream_of(ex);
  if (p.n == 0)
    return;
  element_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>) {
      const In* x = p.x.ptr<const In>();
      std::uint8_t* codes = p.codes.ptr<std::uint8_t>();
      if (!p.nested) {
        launch_quantize(x, p.n, p.block, codes, p.absmax.ptr<float>(), p.tb, p.zero_code,
                        p.stochastic, p.rng, stream);
        return;
      }
      scratch a(sizeof(float) * static_cast<std::size_t>(p.blocks), stream);
      launch_quantize(x, p.n, p.block, codes, a.as<float>(), p.tb, p.zero_code, p.stochastic, p.rng,
                      stream);
      launch_quantize(a.as<const float>(), p.blocks, nested_block, p.codes2.ptr<std::uint8_t>(),
                      p.absmax2.ptr<float>(), p.tb2, p.zero_code2, false, emu::random_stream{},
                      stream);
    }
  });
}

void dequantize_blockwise(const blockwise_dequant_problem& p, const exec& ex) {
  if (p.n == 0)
    return;
  const cudaStream_t stream = stream_of(ex);
  scratch cbs(sizeof(float) * 512, stream);
  float* cb = cbs.as<float>();
  LOWBIT_CUDA_CHECK(
      cudaMemcpyAsync(cb, p.value, sizeof(float) * 256, cudaMemcpyHostToDevice, stream));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(cb + 256, p.nested ? p.value2 : p.value, sizeof(float) * 256,
                                    cudaMemcpyHostToDevice, stream));
  int block_log2 = 0;
  while ((std::int64_t{1} << block_log2) < p.block)
    ++block_log2;
  const dequant_op op{cb, p.nested ? nullptr : p.absmax.ptr<const float>(),
                      p.nested ? p.codes2.ptr<const std::uint8_t>() : nullptr,
                      p.nested ? p.absmax2.ptr<const float>() : nullptr, block_log2};
  launch_map(p.codes.ptr<const std::uint8_t>(), p.n, p.out.ptr<float>(), p.n, 1, p.n, op, false, {},
             stream);
}

} // namespace lowbit::kernels::cuda
