// CUDA kernels of block-wise codebook quantization and SRAM-quantiles. Per-element results come
// from blockwise_ops.hpp (shared with the CPU twin); this file only organizes the work:
//
//   quantize   : the group pass of common/group_pass.cuh (its flat kernel: 16 consecutive
//                elements per thread staged through shared memory, amax by shuffles and
//                across warps), each element's nearest entry found through a bucket
//                table of the codebook (blockwise_ops.hpp) built on the device per call and
//                copied into each thread block's shared memory. Nested: the same pass runs
//                again over the float absmax values (blocks of 256).
//   dequantize : the element-wise map (16-byte stores), the codebook in shared memory, the
//                absmax values through the read-only cache.
//   (SRAM-quantiles: quantiles.cu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../cast/cast_ops.hpp"
#include "../common/cuda_map.cuh"
#include "../common/group_pass.cuh"
#include "blockwise_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace ops = blockwise_ops;

__global__ void buckets_kernel(const ops::tables* __restrict__ tb,
                               std::uint32_t* __restrict__ buckets) {
  const std::uint32_t u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u < ops::bucket_count)
    buckets[u] = ops::bucket_entry(tb->sum_hi, tb->sum_lo, u);
}

// The codebook tables with their bucket table (blockwise_ops.hpp) as one 16-byte aligned blob in
// device memory, built on the caller's stream for one call; the kernels copy it into shared
// memory (their lookups are data dependent: shared memory serves them at far more lookups per
// cycle than the L1 cache).
constexpr int tables_bytes = (sizeof(ops::tables) + 15) / 16 * 16;
static_assert(ops::bucket_bias % 16 == 0, "the bucket table's base less the bias stays 16-aligned");
constexpr int blob_bytes =
    tables_bytes + (static_cast<int>(sizeof(std::uint32_t) * ops::bucket_count) + 15) / 16 * 16;

class device_codebook {
public:
  device_codebook(const ops::tables& tb, cudaStream_t stream) : mem_(blob_bytes, stream) {
    LOWBIT_CUDA_CHECK(
        cudaMemcpyAsync(mem_.as<ops::tables>(), &tb, sizeof(ops::tables), cudaMemcpyHostToDevice, stream));
    buckets_kernel<<<(ops::bucket_count + 255) / 256, 256, 0, stream>>>(
        mem_.as<ops::tables>(), reinterpret_cast<std::uint32_t*>(mem_.as<unsigned char>() + tables_bytes));
    check_launch("blockwise buckets_kernel");
  }
  const unsigned char* blob() const { return mem_.as<unsigned char>(); }

private:
  scratch mem_;
};

// How a kernel finds each element's code: the nearest entry through buckets whose table is
// simple (ops::simple_buckets: one step at most per bucket, nothing below 2^-32 changes the
// index), the nearest entry through any bucket table, or stochastic rounding. A template
// argument, so that each kernel carries no per-element test of it.
enum class search { simple, buckets, stochastic };

// Block-wise quantization as a group rule (common/group_pass.cuh): the stored absmax, and each
// element's code, exactly ops::encode. The division by the block's absmax goes through one
// reciprocal per block (ops::scaled_divisor for simple tables, with no branch per element;
// ops::block_divisor otherwise), the nearest entry through the bucket table.
template <search S>
struct codebook_rule {
  using scale_type = float;
  using divisor = std::conditional_t<S == search::simple, ops::scaled_divisor, ops::block_divisor>;
  static constexpr int shared_bytes = blob_bytes;
  struct group {
    std::uint32_t amax;
    divisor div;
    bool poisoned;
  };
  const unsigned char* blob;  // device memory; the kernels read the copy in group_shared()
  std::uint32_t zero_code;
  // Shared-memory address of the bucket table (after to_shared; a multiple of 16) less
  // ops::bucket_bias (a multiple of 16 too): the base of ops::bucket_address.
  std::uint32_t bucket_base = 0;
  // 1 and -4 as kernel parameters, whose values the compiler does not see, so that the
  // address arithmetic of element() stays multiply-adds.
  std::uint32_t one = 1, minus_4 = static_cast<std::uint32_t>(-4);
  __device__ codebook_rule to_shared() const {
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    const auto* src = reinterpret_cast<const uint4*>(blob);
    auto* dst = reinterpret_cast<uint4*>(group_pass::group_shared());
    for (int j = tid; j < blob_bytes / 16; j += nt)
      dst[j] = __ldg(src + j);
    codebook_rule r = *this;
    // Through an opaque move: the compiler then keeps the address in a register instead of
    // recomputing the shared window's base for every element.
    const auto at = static_cast<std::uint32_t>(
                        __cvta_generic_to_shared(group_pass::group_shared() + tables_bytes)) -
                    ops::bucket_bias;
    asm volatile("mov.b32 %0, %1;" : "=r"(r.bucket_base) : "r"(at));
    return r;
  }
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
  __device__ std::uint32_t element(const group& g, float x, std::uint32_t rbits) const {
    const auto* tb = reinterpret_cast<const ops::tables*>(group_pass::group_shared());
    const float t = g.div(x);
    if constexpr (S == search::stochastic) {
      return ops::stochastic_index(tb->value, t, rbits);
    } else {
      // ops::bucket_address(bucket_base, bits) and, for simple tables, ops::step_bucket_word,
      // with the sign mask and the sign's offset as integer multiply-adds (the high word of
      // bits * 1; base - 4 * mask), so that the element's integer work is split between the
      // integer pipe and the multiply-add pipe.
      const std::uint32_t bits = __float_as_uint(t);
      std::uint32_t sign_mask, base, e;
      asm("mul.hi.s32 %0, %1, %2;" : "=r"(sign_mask) : "r"(bits), "r"(one));
      asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(base) : "r"(sign_mask), "r"(minus_4), "r"(bucket_base));
      const std::uint32_t m = max(bits & 0x7FFE0000u, ops::bucket_floor);
      asm volatile("ld.shared.u32 %0, [%1];" : "=r"(e) : "r"(base + (m >> 14)));
      if constexpr (S == search::simple)
        return e + ((bits ^ sign_mask) & 0x1FFFFu);  // ops::step_bucket_word
      else
        return ops::nearest_in_bucket(e, tb->sum_hi, tb->sum_lo, t);
    }
  }
  static constexpr bool stochastic() { return S == search::stochastic; }
};

template <class In>
void launch_quantize(const In* x, std::int64_t n, std::int64_t block, std::uint8_t* codes,
                     float* absmax, const ops::tables& tb, std::uint32_t zero_code, bool stochastic,
                     const emu::random_stream& rng, cudaStream_t stream) {
  if (n == 0)
    return;
  const device_codebook cb(tb, stream);
  const matrix_shape flat{1, n, n};
  const auto run = [&](auto rule) {
    launch_groups(x, flat, codes, flat, absmax, 1, block, rule, rng, stream);
  };
  if (stochastic)
    run(codebook_rule<search::stochastic>{cb.blob(), zero_code});
  else if (ops::simple_buckets(tb))
    run(codebook_rule<search::simple>{cb.blob(), zero_code});
  else
    run(codebook_rule<search::buckets>{cb.blob(), zero_code});
}

// Dequantization in the element-wise map: out[i] = cb[codes[i]] * a[i / block], the codebook(s)
// in shared memory, the block's absmax read once per chunk of the map (blocks are at least 64
// elements, a power of two, so a chunk never straddles two).
struct dequant_op {
  static constexpr bool needs_position = false, needs_index = true;
  static constexpr int shared_floats = 512;
  const float* cb;             // cb[0..255], cb2 at cb + 256 (nested)
  const float* absmax;         // plain
  const std::uint8_t* codes2;  // nested: a = cb2[codes2[b]] * absmax2[b / nested_block]
  const float* absmax2;
  int block_log2;
  __device__ dequant_op to_shared(float* table) const {
    for (int j = threadIdx.x; j < shared_floats; j += blockDim.x)
      table[j] = __ldg(cb + j);
    dequant_op o = *this;
    o.cb = table;
    return o;
  }
  struct block_op {  // the elements of one block
    const float* cb;
    float a;
    __device__ float operator()(std::uint8_t c, std::int64_t, std::int64_t, std::uint32_t) const {
      return ops::decode(cb[c], a);
    }
  };
  __device__ block_op at(std::int64_t i0) const {
    const std::int64_t b = i0 >> block_log2;
    const float a = codes2 == nullptr
                        ? __ldg(absmax + b)
                        : ops::decode(cb[256 + __ldg(codes2 + b)], __ldg(absmax2 + b / nested_block));
    return {cb, a};
  }
  __device__ float operator()(std::uint8_t c, std::int64_t i, std::int64_t r, std::uint32_t rb) const {
    return at(i)(c, i, r, rb);
  }
};

} // namespace

void quantize_blockwise(const blockwise_problem& p, const exec& ex) {
  const cudaStream_t stream = stream_of(ex);
  if (p.n == 0)
    return;
  cast_ops::dispatch_input(p.x.type, [&](auto in_tag) {
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
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(cb, p.value, sizeof(float) * 256, cudaMemcpyHostToDevice, stream));
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
