// The first half of a gated MLP for few rows, on tensor cores (bf16 or f16 in, f32
// accumulation): h = gelu_tanh(x·Wgᵀ) ⊙ (x·Wuᵀ) with w = [Wg ; Wu] ([2F, K], gate rows first),
// x [M, K] with M ≤ 64. Host side and when it is chosen: kernels/src/ops/mlp.rs (GegluLinear).
//
// With so few rows the product is a stream of the weight from memory: a block takes MLP_BF
// output features, i.e. MLP_BF gate rows and the MLP_BF up rows of the same features (one
// 64-row tile of w), and all of x, and walks K in chunks of MLP_BK through a ring of
// MLP_STAGES shared-memory stages filled by cp.async (MLP_STAGES - 1 chunks in flight while
// one is used). Warp w computes rows 16w..16w+15 of x against the whole tile; its accumulators
// hold a feature's gate and up values in the same lanes (tiles n and n + 4), so the GELU and the
// product happen in registers and only h is written. Fragment layouts as in flash.cu.

#define MLP_BM 64
#define MLP_BF 32
#define MLP_BK 128
#define MLP_STAGES 5
#define MLP_THREADS 128
#define MLP_LD (MLP_BK + 8)  // shared row stride (elements): conflict-free ldmatrix

template <typename T>
__device__ void geglu_linear(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ h, unsigned m,
                             unsigned k, unsigned f, unsigned long long sx, unsigned long long sw,
                             unsigned long long sh) {
    extern __shared__ __align__(16) unsigned char mlp_smem[];
    unsigned short* xs = (unsigned short*)mlp_smem;     // [MLP_STAGES][MLP_BM][MLP_LD]
    unsigned short* ws = xs + MLP_STAGES * MLP_BM * MLP_LD;  // [MLP_STAGES][2·MLP_BF][MLP_LD]
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned f0 = blockIdx.x * MLP_BF;
    const unsigned chunks = (k + MLP_BK - 1) / MLP_BK;

    // Chunk c into stage c % MLP_STAGES: x rows past m and columns past k are zeros (nothing is
    // read for them); tile row r < MLP_BF is gate feature f0 + r, row r ≥ MLP_BF up feature
    // f0 + r - MLP_BF (w row f + f0 + r - MLP_BF). 64 rows of 8 16-byte pieces each.
    auto stage = [&](unsigned c) {
        unsigned short* xd = xs + (c % MLP_STAGES) * MLP_BM * MLP_LD;
        unsigned short* wd = ws + (c % MLP_STAGES) * 2 * MLP_BF * MLP_LD;
#pragma unroll
        for (int it = 0; it < MLP_BM * (MLP_BK / 8) / MLP_THREADS; ++it) {
            const unsigned idx = it * MLP_THREADS + threadIdx.x, r = idx / (MLP_BK / 8), p = idx % (MLP_BK / 8);
            const unsigned kk = c * MLP_BK + p * 8;
            const bool okx = r < m && kk < k, okw = kk < k;
            cp_async16(xd + r * MLP_LD + p * 8, okx ? x + r * sx + kk : x, okx);
            const unsigned long long wr = r < MLP_BF ? f0 + r : f + f0 + (r - MLP_BF);
            cp_async16(wd + r * MLP_LD + p * 8, okw ? w + wr * sw + kk : w, okw);
        }
    };
#pragma unroll
    for (unsigned c = 0; c < MLP_STAGES - 1; ++c) {
        if (c < chunks) stage(c);
        cp_async_commit();
    }

    float acc[2 * MLP_BF / 8][4];
#pragma unroll
    for (int n = 0; n < 2 * MLP_BF / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    // Per-lane ldmatrix offsets (elements): A rows of x, B rows of the weight tile.
    const unsigned xa = (warp * 16 + (lane & 15)) * MLP_LD + (lane >> 4) * 8;
    const unsigned wb = ((lane & 7) + ((lane >> 4) << 3)) * MLP_LD + ((lane >> 3) & 1) * 8;

    for (unsigned c = 0; c < chunks; ++c) {
        cp_async_wait<MLP_STAGES - 2>();  // chunk c has landed (for this thread's pieces)
        __syncthreads();                  // for every thread's; and chunk c - 1 is used up
        if (c + MLP_STAGES - 1 < chunks) stage(c + MLP_STAGES - 1);
        cp_async_commit();
        const unsigned xb = smem_addr(xs + (c % MLP_STAGES) * MLP_BM * MLP_LD + xa);
        const unsigned wt = smem_addr(ws + (c % MLP_STAGES) * 2 * MLP_BF * MLP_LD + wb);
#pragma unroll
        for (int kk = 0; kk < MLP_BK / 16; ++kk) {
            unsigned a[4];
            ldmatrix_x4(a, xb + kk * 32);
#pragma unroll
            for (int nb = 0; nb < 2 * MLP_BF / 16; ++nb) {
                unsigned b[4];
                ldmatrix_x4(b, wt + (nb * 16 * MLP_LD + kk * 16) * 2);
                Mma<T>::run(acc[2 * nb], a, b[0], b[1]);
                Mma<T>::run(acc[2 * nb + 1], a, b[2], b[3]);
            }
        }
    }

    // Lane (g, t) holds rows g and g + 8 of the warp's 16, columns 2t and 2t + 1 of each 8-wide
    // tile: tile n < MLP_BF / 8 is gate features f0 + 8n + 2t (+1), tile n + MLP_BF / 8 the same
    // features' up values.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const unsigned row = warp * 16 + g + 8 * rr;
        if (row >= m) continue;
        T* hrow = h + row * sh + f0;
#pragma unroll
        for (int n = 0; n < MLP_BF / 8; ++n) {
            const float* gate = acc[n] + 2 * rr;
            const float* up = acc[n + MLP_BF / 8] + 2 * rr;
            *(unsigned*)(hrow + n * 8 + 2 * t) =
                Mma<T>::pack(gelu_tanh(gate[0]) * up[0], gelu_tanh(gate[1]) * up[1]);
        }
    }
}

#define GEGLU_LINEAR(T, S)                                                                               \
    extern "C" __global__ void __launch_bounds__(MLP_THREADS)                                           \
        geglu_linear_##S(const T* x, const T* w, T* h, unsigned m, unsigned k, unsigned f,               \
                         unsigned long long sx, unsigned long long sw, unsigned long long sh) {          \
        geglu_linear<T>(x, w, h, m, k, f, sx, sw, sh);                                                   \
    }
GEGLU_LINEAR(bf16, bf16)
GEGLU_LINEAR(f16, f16)

// ---- The same on Hopper's asynchronous tensor cores (sm_90a) ----------------------------------
//
// geglu_linear_wg: the product taken transposed, as fp8.cu's linear_e4m3_wg does: a block's
// 64 MMA rows (A) are the gate's 32 features f0.. and the up's same 32 (rows f + f0..), its
// N = 64 columns the tokens (rows of x past m arrive as zeros), both K-major in shared memory
// with the 128-byte swizzle, copied by the TMA (two boxes of 32 weight rows and one of 64 rows
// of x a stage of 64 elements of K). K goes through a ring of MLP_WG_STAGES stages: one thread
// issues the first stages' copies, and after the warpgroup's MMAs of a stage are done it
// refills that stage with the chunk MLP_WG_STAGES further on (each stage's mbarrier completes
// once a use; its parity is the use's). The four k16 MMAs of a stage add into one f32 sum.
// Two warpgroups a block, each multiplying 32 of the 64 token rows (m64n32k16), so that one's
// waits overlap the other's MMAs.
// The gate and up values are rounded to T (what a T output of the GEMM holds), meet in shared
// memory, and h = gelu_tanh(gate)·up is rounded to T: what the GEMM into T and geglu compute.
#define MLP_WG_K 64
#define MLP_WG_STAGES 8
#define MLP_WG_LD 68

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d += A · Bᵀ for A 64 × 16 and B 64 × 16 (both K-major, 16-bit).
template <typename T>
__device__ __forceinline__ void wg_mma16(float d[32], unsigned long long a, unsigned long long b);
#define WG_MMA16(T, TY)                                                                                         \
    template <>                                                                                                 \
    __device__ __forceinline__ void wg_mma16<T>(float d[32], unsigned long long a, unsigned long long b) {     \
        asm volatile(                                                                                           \
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                         \
            "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                         \
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                           \
            "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"  \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),          \
              "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),        \
              "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),        \
              "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                             \
            : "l"(a), "l"(b));                                                                                  \
    }
WG_MMA16(bf16, "bf16")
WG_MMA16(f16, "f16")
// The same for B 32 × 16: d is A's 64 rows × B's 32.
template <typename T>
__device__ __forceinline__ void wg_mma16_n32(float d[16], unsigned long long a, unsigned long long b);
#define WG_MMA16_N32(T, TY)                                                                                     \
    template <>                                                                                                 \
    __device__ __forceinline__ void wg_mma16_n32<T>(float d[16], unsigned long long a, unsigned long long b) { \
        asm volatile(                                                                                           \
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                         \
            "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " "                                         \
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"          \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),          \
              "+f"(d[15])                                                                                       \
            : "l"(a), "l"(b));                                                                                  \
    }
WG_MMA16_N32(bf16, "bf16")
WG_MMA16_N32(f16, "f16")
#endif
// The dynamic shared memory of geglu_linear_wg and tma_ring_probe (declared once: a template's
// and a plain function's own declarations of it conflict in linkage).
extern __shared__ unsigned char wg_raw[];
// geglu_linear_wg's threads: two warpgroups, each multiplying 32 of the 64 token rows.
#define MLP_WG_THREADS 256

template <typename T>
__device__ void geglu_linear_wg(const TmaMap& wmap, const TmaMap& xmap, T* __restrict__ h, unsigned long long h_ld,
                                unsigned m, unsigned f, unsigned k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr unsigned A_BYTES = 64 * MLP_WG_K * 2, B_BYTES = 64 * MLP_WG_K * 2, STAGE = A_BYTES + B_BYTES;
    const unsigned base = (smem_addr(wg_raw) + 1023) & ~1023u;
    // The ring, or the 64 × 64 values after the loop (whichever is larger), then the barriers.
    const unsigned data = max(MLP_WG_STAGES * STAGE, 64u * MLP_WG_LD * 4u);
    const unsigned bars = base + data;
    const unsigned chunks = k / MLP_WG_K, f0 = blockIdx.x * 32;
    const unsigned t = threadIdx.x;
    // Chunk c's weight rows, then its tokens, into its stage (thread 0).
    auto issue_w = [&](unsigned c) {
        const unsigned s = c % MLP_WG_STAGES, a = base + s * STAGE, bar = bars + 8 * s;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(STAGE) : "memory");
        tma_load_2d(a, &wmap, c * MLP_WG_K, f0, bar);
        tma_load_2d(a + A_BYTES / 2, &wmap, c * MLP_WG_K, f + f0, bar);
    };
    auto issue_x = [&](unsigned c) {
        const unsigned s = c % MLP_WG_STAGES;
        tma_load_2d(base + s * STAGE + A_BYTES, &xmap, c * MLP_WG_K, 0, bars + 8 * s);
    };
    if (t == 0) {
        mbar_init_ring(bars, MLP_WG_STAGES);
        for (unsigned c = 0; c < chunks && c < MLP_WG_STAGES; ++c) issue_w(c);
    }
    // The weights are on their way; the tokens are the kernel before's output (launched
    // dependent, this kernel may have started while that one still ran).
    pdl_wait();
    if (t == 0)
        for (unsigned c = 0; c < chunks && c < MLP_WG_STAGES; ++c) issue_x(c);
    __syncthreads();

    // This warpgroup's 32 token rows: 4 swizzle atoms (of 8 rows) into a stage's B.
    const unsigned wg = t >> 7, b0 = A_BYTES + wg * 32 * MLP_WG_K * 2;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    // Chunk c's MMAs are issued before chunk c - 1's are waited for (one group in flight
    // while the next stage's barrier is awaited): the same MMAs into the same sum, in order.
    // The last chunk is peeled off the loop and waited for whole: where a read of the sum
    // might meet an MMA in flight, ptxas serializes every MMA.
    auto mma = [&](unsigned c) {
        const unsigned s = c % MLP_WG_STAGES, a = base + s * STAGE;
        mbar_wait(bars + 8 * s, (c / MLP_WG_STAGES) & 1);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) wg_mma16_n32<T>(acc, wg_desc(a + 32 * j), wg_desc(a + b0 + 32 * j));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
#pragma unroll 1
    for (unsigned c = 0; c + 1 < chunks; ++c) {
        mma(c);
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        // Every warp's MMAs of chunk c - 1 have read its stage: refill it.
        __syncthreads();
        if (t == 0 && c >= 1 && c - 1 + MLP_WG_STAGES < chunks) {
            issue_w(c - 1 + MLP_WG_STAGES);
            issue_x(c - 1 + MLP_WG_STAGES);
        }
    }
    mma(chunks - 1);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    __syncthreads();  // every warp's MMAs are done with the ring, which now holds the tile

    const unsigned warp = (t >> 5) & 3, lane = t & 31;
    float* tile = (float*)(wg_raw + (base - smem_addr(wg_raw)));
#pragma unroll
    for (int i = 0; i < 16; ++i)
        tile[wg_feature(warp, lane, i) * MLP_WG_LD + wg * 32 + wg_token(lane, i)] = to_f32(from_f32<T>(acc[i]));
    __syncthreads();
    const unsigned c = t & 31;
    for (unsigned r = t >> 5; r < m; r += MLP_WG_THREADS / 32)
        h[r * h_ld + f0 + c] = from_f32<T>(gelu_tanh(tile[c * MLP_WG_LD + r]) * tile[(32 + c) * MLP_WG_LD + r]);
#else
    // The host takes this kernel only on sm_90 (built as sm_90a); never reached.
    __trap();
#endif
}

// tma_ring_probe: geglu_linear_wg's copies without its MMAs, to measure what the TMA ring alone
// streams (frt-kernels-bench). Block b copies weight rows 64b .. 64b + 63 of wmap (boxes of
// `box_rows` rows × 64 values of K), and with `with_x` also the 64 rows of xmap, chunk by chunk
// over `chunks` chunks through `stages` stages, as geglu_linear_wg's ring does; after a stage
// arrives every thread reads one word of it (the stage is then refilled), and those words
// are added into sink[0] so that no copy is idle.
extern "C" __global__ void __launch_bounds__(128)
    tma_ring_probe(const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap xmap, unsigned with_x,
                   unsigned box_rows, unsigned chunks, unsigned stages, unsigned* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr unsigned A_BYTES = 64 * MLP_WG_K * 2, STAGE = 2 * A_BYTES;
    const unsigned base = (smem_addr(wg_raw) + 1023) & ~1023u, bars = base + stages * STAGE;
    const unsigned t = threadIdx.x, r0 = blockIdx.x * 64;
    auto issue = [&](unsigned c) {
        const unsigned s = c % stages, a = base + s * STAGE, bar = bars + 8 * s;
        const unsigned bytes = with_x ? STAGE : A_BYTES;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
        for (unsigned r = 0; r < 64; r += box_rows)
            tma_load_2d(a + r * MLP_WG_K * 2, &wmap, c * MLP_WG_K, r0 + r, bar);
        if (with_x) tma_load_2d(a + A_BYTES, &xmap, c * MLP_WG_K, 0, bar);
    };
    if (t == 0) {
        mbar_init_ring(bars, stages);
        for (unsigned c = 0; c < chunks && c < stages; ++c) issue(c);
    }
    __syncthreads();
    unsigned acc = 0;
#pragma unroll 1
    for (unsigned c = 0; c < chunks; ++c) {
        const unsigned s = c % stages;
        mbar_wait(bars + 8 * s, (c / stages) & 1);
        acc += ((const unsigned*)(wg_raw + (base - smem_addr(wg_raw)) + s * STAGE))[t];
        __syncthreads();
        if (t == 0 && c + stages < chunks) issue(c + stages);
    }
    // Every thread's words (a warp's sum, then one atomic a warp).
    acc = __reduce_add_sync(0xffffffffu, acc);
    if ((t & 31) == 0) atomicAdd(sink, acc);
#else
    __trap();
#endif
}

// grid_barrier_probe: what a barrier of the whole grid costs, for a persistent kernel's phases
// (frt-kernels-bench). Each block runs `rounds` barriers on the counter `sync` (a u64 that
// only grows, a multiple of the grid between launches): the block's threads meet at its
// barrier, then thread 0 reads the counter (before its block arrives it lies in [grid·r,
// grid·r + grid) for this round's r), arrives with a release that needs no reply, and waits
// (acquire) until every block has arrived, i.e. until grid·(r + 1).
extern "C" __global__ void __launch_bounds__(256) grid_barrier_probe(unsigned long long* sync, unsigned rounds) {
    for (unsigned r = 0; r < rounds; ++r) {
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long now;
            asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(now) : "l"(sync) : "memory");
            const unsigned long long target = (now / gridDim.x + 1) * gridDim.x;
            asm volatile("red.release.gpu.global.add.u64 [%0], 1;\n" ::"l"(sync) : "memory");
            do {
                asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(now) : "l"(sync) : "memory");
            } while (now < target);
        }
        __syncthreads();
    }
}

#define GEGLU_LINEAR_WG(T, S)                                                                               \
    extern "C" __global__ void __launch_bounds__(MLP_WG_THREADS)                                            \
        geglu_linear_wg_##S(const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap xmap, T* h,  \
                            unsigned long long h_ld, unsigned m, unsigned f, unsigned k) {                   \
        geglu_linear_wg<T>(wmap, xmap, h, h_ld, m, f, k);                                                   \
    }
GEGLU_LINEAR_WG(bf16, bf16)
GEGLU_LINEAR_WG(f16, f16)
