// FP8 E4M3 quantization with a static scale kept in device memory (a new calibration rewrites
// it; a captured graph reads the new value). Host twin: kernels/src/ops/fp8.rs.

// out[i] = e4m3(x[i] / scale[0]), the division correctly rounded as on the host.
template <typename T>
__device__ void quantize_e4m3(const T* __restrict__ x, const float* __restrict__ scale, unsigned char* __restrict__ out,
                              unsigned long long n) {
    const float s = *scale;
    const unsigned long long start = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    // Eight values a thread where every access can be whole (16 bytes in, 8 out).
    if (!(n & 7) && !((size_t)x & 15) && !((size_t)out & 7)) {
        for (unsigned long long g = start; g < n / 8; g += step) {
            float v[8];
            load8(x + g * 8, v);
            store_codes(out + g * 8, v, 8, s);
        }
        return;
    }
    for (unsigned long long i = start; i < n; i += step) out[i] = e4m3_from_f32(to_f32(x[i]) / s);
}

// out[i] = code[i] · scale[0], rounded to T (a check of what a quantized tensor holds).
template <typename T>
__device__ void dequantize_e4m3(const unsigned char* __restrict__ code, const float* __restrict__ scale, T* __restrict__ out,
                                unsigned long long n) {
    const float s = *scale;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = from_f32<T>(e4m3_to_f32(code[i]) * s);
}

#define FP8(T, S)                                                                                       \
    extern "C" __global__ void quantize_e4m3_##S(const T* x, const float* scale, unsigned char* out,     \
                                                 unsigned long long n) {                                \
        quantize_e4m3<T>(x, scale, out, n);                                                             \
    }                                                                                                   \
    extern "C" __global__ void dequantize_e4m3_##S(const unsigned char* code, const float* scale, T* out, \
                                                   unsigned long long n) {                              \
        dequantize_e4m3<T>(code, scale, out, n);                                                        \
    }
FOR_FLOATS(FP8)

// ---- The FP8 linear layer for few rows (M ≤ 64: an action expert's 50 tokens) -----------------
//
// out[m, n] (+)= (Σ_k x[m, k] · w[n, k]) · x_scale · w_scale[n] (+ bias[n]), E4M3 codes in, f32
// sums, out of type T. Memory-bound: the weight is streamed once, 16 bytes per load. The codes
// are widened to f16 (exactly: every E4M3 value is an f16) and multiplied by f16 tensor-core MMAs
// (m16n8k16, f32 accumulate) that take 16 weight rows as A and 8 rows of x as B: Hopper runs
// E4M3 `mma.sync` that way itself (F2FP unpacks before each HMMA), and widening once per weight
// fragment instead of once per MMA keeps the code small.
//
// A block computes 16 output features over the whole of K: its 8 warps take every 8th chunk of
// 64 codes each, then add their sums through shared memory in warp order (the same result on
// every run), scale, add the bias and the output, and store. No scratch in device memory, one
// launch.
//
// The K order inside an MMA is free as long as A and B agree: a lane loads 16 consecutive bytes
// of its weight row and of its x row at k0 + 16·(lane % 4) and feeds them to four MMAs, 4 bytes
// to each. So K is taken in chunks of 64, and rows must be 16-byte aligned.
#define ROWS_WARPS 8
#define ROWS_UNROLL 2

__device__ __forceinline__ void mma_f16(float c[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                        unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 E4M3 codes as 8 pairs of f16 (pair p: bytes 2p and 2p + 1).
__device__ __forceinline__ void widen16(uint4 v, unsigned h[8]) {
#if __CUDA_ARCH__ >= 890
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned short lo = (unsigned short)(w[i] & 0xffffu), hi = (unsigned short)(w[i] >> 16);
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[2 * i]) : "h"(lo));
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[2 * i + 1]) : "h"(hi));
    }
#else
    // The host refuses FP8 GEMMs below sm_89; never reached.
    __trap();
#endif
}

// A weight's 16 bytes, read once: not kept in L1.
__device__ __forceinline__ uint4 load_weight(const unsigned char* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Warp `warp`'s MMA sums into sums[warp][feature][row]: lane (g, tig) = (lane / 4, lane % 4)
// holds features g and g + 8 of the warp's 16, rows 8t + 2·tig and the one after of each row
// tile t.
template <int TILES>
__device__ __forceinline__ void stash_sums(float (*sums)[16][TILES * 8], unsigned warp, unsigned lane,
                                           const float (*acc)[4]) {
    const unsigned g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) sums[warp][g + (i >> 1) * 8][t * 8 + tig * 2 + (i & 1)] = acc[t][i];
}

// TILES: row tiles of 8 (⌈M / 8⌉), a compile-time count so that the sums stay in registers.
template <typename T, int TILES>
__device__ void linear_e4m3_rows(const unsigned char* __restrict__ x, unsigned long long x_ld,
                                 const float* __restrict__ x_scale, const unsigned char* __restrict__ w,
                                 unsigned long long w_ld, const float* __restrict__ w_scale, T* out,
                                 unsigned long long o_ld, const T* __restrict__ bias, unsigned accumulate, unsigned m,
                                 unsigned k) {
    __shared__ float sums[ROWS_WARPS][16][TILES * 8];
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const unsigned n0 = blockIdx.x * 16;
    const unsigned chunks = k / 64;
    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    const unsigned char* w_lo = w + (unsigned long long)(n0 + g) * w_ld + tig * 16;
    const unsigned char* w_hi = w_lo + 8 * w_ld;
    // The x rows of this lane (8t + g), or null past M (zeros).
    const unsigned char* x_row[TILES];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        const unsigned row = t * 8 + g;
        x_row[t] = row < m ? x + row * x_ld + tig * 16 : nullptr;
    }
#pragma unroll 1
    for (unsigned c = warp; c < chunks; c += ROWS_WARPS * ROWS_UNROLL) {
        // The weight loads of up to ROWS_UNROLL chunks first (in flight together), then the
        // MMAs.
        uint4 lo[ROWS_UNROLL], hi[ROWS_UNROLL];
#pragma unroll
        for (int u = 0; u < ROWS_UNROLL; ++u) {
            const unsigned cu = min(c + u * ROWS_WARPS, chunks - 1);
            lo[u] = load_weight(w_lo + (unsigned long long)cu * 64);
            hi[u] = load_weight(w_hi + (unsigned long long)cu * 64);
        }
#pragma unroll
        for (int u = 0; u < ROWS_UNROLL; ++u) {
            const unsigned cu = c + u * ROWS_WARPS;
            if (cu < chunks) {
                const unsigned long long off = (unsigned long long)cu * 64;
                unsigned a_lo[8], a_hi[8];
                widen16(lo[u], a_lo);
                widen16(hi[u], a_hi);
#pragma unroll
                for (int t = 0; t < TILES; ++t) {
                    unsigned b[8];
                    widen16(x_row[t] ? *(const uint4*)(x_row[t] + off) : make_uint4(0, 0, 0, 0), b);
                    // MMA j: a0/a1 pair 2j of rows g / g + 8, a2/a3 pair 2j + 1; b0/b1 likewise.
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        mma_f16(acc[t], a_lo[2 * j], a_hi[2 * j], a_lo[2 * j + 1], a_hi[2 * j + 1], b[2 * j],
                                b[2 * j + 1]);
                }
            }
        }
    }
    stash_sums<TILES>(sums, warp, lane, acc);
    __syncthreads();
    const float xs = *x_scale;
    for (unsigned e = threadIdx.x; e < 16 * m; e += blockDim.x) {
        const unsigned f = e % 16, row = e / 16, col = n0 + f;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < ROWS_WARPS; ++v) s += sums[v][f][row];
        float y = s * xs * w_scale[col];
        if (bias) y += to_f32(bias[col]);
        T* o = out + row * o_ld + col;
        if (accumulate) y += to_f32(*o);
        *o = from_f32<T>(y);
    }
}

#define FP8_ROWS_TILES(T, S, N)                                                                                   \
    extern "C" __global__ void __launch_bounds__(ROWS_WARPS * 32) linear_e4m3_rows##N##_##S(                      \
        const unsigned char* x, unsigned long long x_ld, const float* x_scale, const unsigned char* w,            \
        unsigned long long w_ld, const float* w_scale, T* out, unsigned long long o_ld, const T* bias,           \
        unsigned accumulate, unsigned m, unsigned k) {                                                           \
        linear_e4m3_rows<T, N>(x, x_ld, x_scale, w, w_ld, w_scale, out, o_ld, bias, accumulate, m, k);           \
    }
#define FP8_ROWS(T, S)                                                                                            \
    FP8_ROWS_TILES(T, S, 1) FP8_ROWS_TILES(T, S, 2) FP8_ROWS_TILES(T, S, 3) FP8_ROWS_TILES(T, S, 4)               \
    FP8_ROWS_TILES(T, S, 5) FP8_ROWS_TILES(T, S, 6) FP8_ROWS_TILES(T, S, 7) FP8_ROWS_TILES(T, S, 8)
FOR_FLOATS(FP8_ROWS)

#define PARTS_UNROLL 4

// ---- Split reductions into f32 partial sums ---------------------------------------------------
//
// linear_e4m3_parts<TILES, FT>: part[p, m, n] = (Σ_{k in range p} x[m, k] · w[n, k]) · x_scale ·
// w_scale[n] in f32, the reduction cut into gridDim.y ranges of kc codes (a residual's norm adds
// the parts). A block computes FT·16 output features over one range. Hopper's FP8 mma.sync
// widens its operands to f16 before each MMA, so the rows kernel, which reads x again for
// every 16 features, spends most of its time widening x; here a block widens its range of x
// once, into shared memory (rows padded by 16 bytes, so that the two rows a quarter-warp reads
// lie in different banks), while each warp's first weight loads are in flight, and FT·16
// features share it. Warp w takes feature tile w % FT and every (ROWS_WARPS / FT)-th chunk of
// 64 codes of the range from chunk w / FT on, the weight of its next PARTS_UNROLL chunks in
// flight while the current ones are multiplied; the warps of one tile add their sums through
// shared memory in warp order (the same result on every run).
template <int TILES, int FT>
__device__ void linear_e4m3_parts(const unsigned char* __restrict__ x, unsigned long long x_ld,
                                  const float* __restrict__ x_scale, const unsigned char* __restrict__ w,
                                  unsigned long long w_ld, const float* __restrict__ w_scale,
                                  float* __restrict__ part, unsigned m, unsigned n, unsigned kc) {
    constexpr int SLICES = ROWS_WARPS / FT;
    extern __shared__ __align__(16) unsigned char parts_smem[];
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const unsigned ft = warp % FT, slice = warp / FT;
    const unsigned nb = blockIdx.x * FT * 16;
    const unsigned long long k0 = (unsigned long long)blockIdx.y * kc;
    const unsigned chunks = kc / 64;
    const unsigned xs_ld = kc * 2 + 16;  // bytes a widened x row takes

    const unsigned char* w_lo = w + (unsigned long long)(nb + ft * 16 + g) * w_ld + k0 + tig * 16;
    const unsigned char* w_hi = w_lo + 8 * w_ld;
    uint4 lo[PARTS_UNROLL], hi[PARTS_UNROLL];
    // The weight of chunks c, c + SLICES, … that exist.
    auto load = [&](unsigned c) {
#pragma unroll
        for (int u = 0; u < PARTS_UNROLL; ++u) {
            const unsigned cu = c + u * SLICES;
            if (cu < chunks) {
                lo[u] = load_weight(w_lo + (unsigned long long)cu * 64);
                hi[u] = load_weight(w_hi + (unsigned long long)cu * 64);
            }
        }
    };
    load(slice);

    // The range of x, widened: rows past m are zeros.
    const unsigned pieces = kc / 16;
    for (unsigned e = threadIdx.x; e < TILES * 8 * pieces; e += blockDim.x) {
        const unsigned row = e / pieces, c = e % pieces;
        const uint4 v = row < m ? *(const uint4*)(x + row * x_ld + k0 + c * 16) : make_uint4(0, 0, 0, 0);
        unsigned h[8];
        widen16(v, h);
        uint4* d = (uint4*)(parts_smem + row * xs_ld + c * 32);
        d[0] = make_uint4(h[0], h[1], h[2], h[3]);
        d[1] = make_uint4(h[4], h[5], h[6], h[7]);
    }
    __syncthreads();

    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    // This lane's 16 values of x row g of tile 0 in chunk 0 (as f16: 32 bytes).
    const unsigned char* xl = parts_smem + g * xs_ld + tig * 32;
#pragma unroll 1
    for (unsigned c = slice; c < chunks; c += SLICES * PARTS_UNROLL) {
        uint4 cl[PARTS_UNROLL], ch[PARTS_UNROLL];
#pragma unroll
        for (int u = 0; u < PARTS_UNROLL; ++u) {
            cl[u] = lo[u];
            ch[u] = hi[u];
        }
        load(c + SLICES * PARTS_UNROLL);
#pragma unroll
        for (int u = 0; u < PARTS_UNROLL; ++u) {
            const unsigned cu = c + u * SLICES;
            if (cu < chunks) {
                unsigned a_lo[8], a_hi[8];
                widen16(cl[u], a_lo);
                widen16(ch[u], a_hi);
#pragma unroll
                for (int t = 0; t < TILES; ++t) {
                    const uint4* xp = (const uint4*)(xl + t * 8 * xs_ld + cu * 128);
                    const uint4 b0 = xp[0], b1 = xp[1];
                    const unsigned b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        mma_f16(acc[t], a_lo[2 * j], a_hi[2 * j], a_lo[2 * j + 1], a_hi[2 * j + 1], b[2 * j],
                                b[2 * j + 1]);
                }
            }
        }
    }
    // The sums go where x was (every warp is past its last read of x).
    __syncthreads();
    float(*sums)[16][TILES * 8] = (float(*)[16][TILES * 8])parts_smem;
    stash_sums<TILES>(sums, warp, lane, acc);
    __syncthreads();
    const float xs = *x_scale;
    float* out = part + (unsigned long long)blockIdx.y * m * n;
    for (unsigned e = threadIdx.x; e < FT * 16 * m; e += blockDim.x) {
        const unsigned f = e % (FT * 16), row = e / (FT * 16), col = nb + f;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < SLICES; ++v) s += sums[v * FT + f / 16][f % 16][row];
        out[(unsigned long long)row * n + col] = s * xs * w_scale[col];
    }
}

#define FP8_PARTS_TILES(FT, N)                                                                                   \
    extern "C" __global__ void __launch_bounds__(ROWS_WARPS * 32) linear_e4m3_parts##FT##r##N(                   \
        const unsigned char* x, unsigned long long x_ld, const float* x_scale, const unsigned char* w,            \
        unsigned long long w_ld, const float* w_scale, float* part, unsigned m, unsigned n, unsigned kc) {        \
        linear_e4m3_parts<N, FT>(x, x_ld, x_scale, w, w_ld, w_scale, part, m, n, kc);                            \
    }
#define FP8_PARTS_FT(FT)                                                                                          \
    FP8_PARTS_TILES(FT, 1) FP8_PARTS_TILES(FT, 2) FP8_PARTS_TILES(FT, 3) FP8_PARTS_TILES(FT, 4)                   \
    FP8_PARTS_TILES(FT, 5) FP8_PARTS_TILES(FT, 6) FP8_PARTS_TILES(FT, 7) FP8_PARTS_TILES(FT, 8)
FP8_PARTS_FT(1)
FP8_PARTS_FT(2)
FP8_PARTS_FT(4)

// ---- The same on Hopper's asynchronous tensor cores (sm_90a) ----------------------------------
//
// linear_e4m3_wg: out = x · wᵀ scaled as above, through `wgmma`, which multiplies E4M3 codes
// as they are (no widening). The product is taken transposed (outᵀ = w · xᵀ): a block's 64
// output features are the MMA's rows (A) and the tokens its N = 64 columns (B), both K-major in
// shared memory; two warpgroups a block, each taking 32 of the tokens (wg_sums).
//
// The tensor memory accelerator (TMA) copies both operands, a stage of 128 codes at a time: a
// box of 128 codes × 64 weight rows and one of 128 codes × 64 rows of x (rows past m are
// outside x's tensor map and arrive as zeros), written with the 128-byte swizzle that the MMA
// descriptors name (8-row atoms of 1024 bytes; a k32 step moves the start 32 bytes). One
// thread issues every stage's copies before the first MMA, each stage completing its own
// mbarrier (a form that copied with cp.async, 16 bytes a thread, into the layout without
// swizzle took 1.3 to 2 times as long on an H100). Hopper's FP8 MMAs keep fewer bits than f32 while they accumulate: with one sum
// over a stage's four k32 MMAs, kernels/tests/fp8.rs saw an element 1.25 times its tolerance
// against the f64 reference; so each k32 MMA starts a sum of its own, and the four are added
// to the f32 total in registers, in order: the same result on every run.
//
// A block takes one range of kc codes (blockIdx.y; kc a multiple of 128, at most 1024).
// Output: PARTS, the scaled sum into part[blockIdx.y, m, n] (f32, a residual's norm adds the
// parts); otherwise out[m, n] of type T (row stride o_ld), with the bias and out's own value
// added where asked.
#define WG_TOKENS 64
#define WG_STAGE 128
#define WG_STAGES 8
// Two warpgroups a block (see wg_sums).
#define WG_THREADS 256
__device__ __forceinline__ unsigned wg_group() { return threadIdx.x >> 7; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (+)= A · Bᵀ for A 64 × 32 codes and B 64 × 32 codes (both K-major): d starts afresh when
// `add` is 0.
__device__ __forceinline__ void wg_mma(float d[32], unsigned long long a, unsigned long long b, unsigned add) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(add));
}

// The same for B 32 × 32 codes: d is A's 64 rows × B's 32.
__device__ __forceinline__ void wg_mma_n32(float d[16], unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 0, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b));
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The main loop of the `wgmma` kernels: `acc` = the block's 64 weight rows (A) · 32 of its 64
// token rows (B)ᵀ over one range of K from k0, in the fragment layout below: the block's two
// warpgroups (wg_group()) take token rows 0-31 and 32-63 of every stage. Each serializes its
// own MMAs (an FP8 sum is added to acc in registers after every stage, see above), and the two
// overlap each other's. A is one box of 64 weight rows from row r0 or, with HALVES, two boxes
// of 32 rows, from r0 and r1 (the second at A's row 32). Shared memory from `base`
// (1024-byte aligned): the stages; their barriers at `bars`.
template <bool HALVES>
__device__ __forceinline__ void wg_sums(const TmaMap& wmap, const TmaMap& xmap, unsigned base, unsigned bars,
                                        unsigned stages, int k0, int r0, int r1, float acc[16]) {
    constexpr unsigned A_BYTES = 64 * WG_STAGE, B_BYTES = WG_TOKENS * WG_STAGE;
    if (threadIdx.x == 0) {
        mbar_init_ring(bars, stages);
        for (unsigned s = 0; s < stages; ++s) {
            const unsigned a = base + s * (A_BYTES + B_BYTES), bar = bars + 8 * s;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(A_BYTES + B_BYTES)
                         : "memory");
            tma_load_2d(a, &wmap, k0 + s * WG_STAGE, r0, bar);
            // 32 rows of 128 bytes: the second box starts on a swizzle atom (1024 bytes).
            if (HALVES) tma_load_2d(a + A_BYTES / 2, &wmap, k0 + s * WG_STAGE, r1, bar);
        }
    }
    // The weights are copied; the tokens are the kernel before's output (launched dependent,
    // this kernel may have started while that one still ran).
    pdl_wait();
    if (threadIdx.x == 0)
        for (unsigned s = 0; s < stages; ++s)
            tma_load_2d(base + s * (A_BYTES + B_BYTES) + A_BYTES, &xmap, k0 + s * WG_STAGE, 0, bars + 8 * s);
    __syncthreads();

    // This warpgroup's 32 token rows: 4 swizzle atoms (of 8 rows) into the stage's B.
    const unsigned b0 = A_BYTES + wg_group() * 32 * WG_STAGE;
    float d[4][16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = d[0][i] = d[1][i] = d[2][i] = d[3][i] = 0.f;
#pragma unroll 1
    for (unsigned s = 0; s < stages; ++s) {
        const unsigned a = base + s * (A_BYTES + B_BYTES);
        mbar_wait(bars + 8 * s, 0);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) wg_mma_n32(d[j], wg_desc(a + 32 * j), wg_desc(a + b0 + 32 * j));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 16; ++i) acc[i] += d[j][i];
    }
}
#endif

template <typename T, bool PARTS>
__device__ void linear_e4m3_wg(const TmaMap& wmap, const TmaMap& xmap, const float* __restrict__ x_scale,
                               const float* __restrict__ w_scale, void* out_, unsigned long long o_ld,
                               const T* __restrict__ bias, unsigned accumulate, unsigned m, unsigned n, unsigned kc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char wg_raw[];
    // Stages 1024-byte aligned (the swizzle's atoms), then the stages' barriers.
    const unsigned base = (smem_addr(wg_raw) + 1023) & ~1023u;
    const unsigned stages = kc / WG_STAGE;
    const unsigned n0 = blockIdx.x * 64;
    float acc[16];
    wg_sums<false>(wmap, xmap, base, base + stages * 2 * 64 * WG_STAGE, stages, blockIdx.y * kc, n0, 0, acc);

    const unsigned warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const float xs = *x_scale;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const unsigned row = wg_group() * 32 + wg_token(lane, i);
        const unsigned col = n0 + wg_feature(warp, lane, i);
        if (row < m) {
            float y = acc[i] * xs * w_scale[col];
            if (PARTS) {
                ((float*)out_)[(unsigned long long)blockIdx.y * m * n + (unsigned long long)row * n + col] = y;
            } else {
                T* o = (T*)out_ + row * o_ld + col;
                if (bias) y += to_f32(bias[col]);
                if (accumulate) y += to_f32(*o);
                *o = from_f32<T>(y);
            }
        }
    }
#else
    // The host takes this kernel only on sm_90 (built as sm_90a); never reached.
    __trap();
#endif
}

// linear_e4m3_wg_geglu: Gemma's MLP input in one launch, the FP8 gate+up projection and the
// GEGLU after it. w holds the gate's f rows, then the up's f rows (w_scale likewise); a block
// takes 32 features: the gate's rows f0.. and the up's rows f + f0.. as the two halves of its
// 64 A rows, over the whole of K (kc codes). Each product is scaled and rounded to T (what the
// gate+up GEMM's T output holds), the 64 × 64 values meet in shared memory, and each of the
// block's 32 features and m tokens becomes h = gelu_tanh(gate)·up rounded to T, written as the
// E4M3 code of h / code_scale[0] into codes[m, f]: the codes linear_e4m3 into T and
// geglu_e4m3 give, bit for bit, where the GEMM is this same main loop.
#define WG_TILE_LD 68
template <typename T>
__device__ void linear_e4m3_wg_geglu(const TmaMap& wmap, const TmaMap& xmap, const float* __restrict__ x_scale,
                                     const float* __restrict__ w_scale, unsigned char* __restrict__ codes,
                                     const float* __restrict__ code_scale, unsigned m, unsigned f, unsigned kc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char wg_raw[];
    const unsigned base = (smem_addr(wg_raw) + 1023) & ~1023u;
    const unsigned stages = kc / WG_STAGE;
    // The stages, or the 64 × 64 values after them (whichever is larger), then the barriers.
    const unsigned data = max(stages * 2 * 64 * WG_STAGE, 64u * WG_TILE_LD * 4u);
    const unsigned f0 = blockIdx.x * 32;
    float acc[16];
    wg_sums<true>(wmap, xmap, base, base + data, stages, 0, f0, f + f0, acc);

    const unsigned warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    // Every warp's MMAs have read their stages: the values take their place.
    __syncthreads();
    float* tile = (float*)(wg_raw + (base - smem_addr(wg_raw)));
    const float xs = *x_scale;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const unsigned a = wg_feature(warp, lane, i);
        const unsigned row = a < 32 ? f0 + a : f + f0 + a - 32;
        tile[a * WG_TILE_LD + wg_group() * 32 + wg_token(lane, i)] = to_f32(from_f32<T>(acc[i] * xs * w_scale[row]));
    }
    __syncthreads();
    const float cs = *code_scale;
    const unsigned c = threadIdx.x & 31;
    for (unsigned r = threadIdx.x >> 5; r < m; r += WG_THREADS / 32) {
        const float h = to_f32(from_f32<T>(gelu_tanh(tile[c * WG_TILE_LD + r]) * tile[(32 + c) * WG_TILE_LD + r]));
        codes[(unsigned long long)r * f + f0 + c] = e4m3_from_f32(h / cs);
    }
#else
    __trap();
#endif
}

#define FP8_WG(T, S)                                                                                             \
    extern "C" __global__ void __launch_bounds__(WG_THREADS) linear_e4m3_wg_##S(                                       \
        const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap xmap, const float* x_scale,          \
        const float* w_scale, T* out, unsigned long long o_ld, const T* bias, unsigned accumulate, unsigned m,   \
        unsigned n, unsigned kc) {                                                                               \
        linear_e4m3_wg<T, false>(wmap, xmap, x_scale, w_scale, out, o_ld, bias, accumulate, m, n, kc);            \
    }
FOR_FLOATS(FP8_WG)
#define FP8_WG_GEGLU(T, S)                                                                                       \
    extern "C" __global__ void __launch_bounds__(WG_THREADS) linear_e4m3_wg_geglu_##S(                                 \
        const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap xmap, const float* x_scale,          \
        const float* w_scale, unsigned char* codes, const float* code_scale, unsigned m, unsigned f,             \
        unsigned kc) {                                                                                           \
        pdl_trigger();                                                                                           \
        linear_e4m3_wg_geglu<T>(wmap, xmap, x_scale, w_scale, codes, code_scale, m, f, kc);                      \
    }
FOR_FLOATS(FP8_WG_GEGLU)
// The parts form takes the rows form's parameters (o_ld, bias and accumulate unused).
extern "C" __global__ void __launch_bounds__(WG_THREADS)
    linear_e4m3_wg_parts(const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap xmap,
                         const float* x_scale, const float* w_scale, float* part, unsigned long long, const float*,
                         unsigned, unsigned m, unsigned n, unsigned kc) {
    linear_e4m3_wg<float, true>(wmap, xmap, x_scale, w_scale, part, 0, nullptr, 0, m, n, kc);
}
