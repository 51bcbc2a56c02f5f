// Fused attention on tensor cores (bf16 or f16 in, f32 accumulation): scores, masked online
// softmax and the product with V in one kernel, without a score matrix in memory.
// Host side and the conditions for choosing it: kernels/src/ops/attention.rs (AttentionPlan).
//
// Layout. Query heads sharing one key/value head form the rows of that key/value head, in
// (query, head-in-group) order: row r is query r / G, head kh·G + r % G (G = Hq / Hkv). A block
// (4 warps) takes 64 rows of one key/value head (grid.y) and one range of keys (grid.z, the
// split); a warp owns 16 rows and keeps their queries in registers as mma A fragments. Keys are
// walked in tiles of FLASH_BN, K and V staged in shared memory with rows padded by 8 elements
// (conflict-free fragment reads). With one split the block writes normalized rows; with several
// it writes unnormalized f32 rows and their (max, sum) and flash_combine merges the splits.
//
// mma.sync m16n8k16 fragments (g = lane / 4, t = lane % 4): A holds rows g and g+8, columns 2t,
// 2t+1 and 2t+8, 2t+9; B holds k rows 2t, 2t+1 and 2t+8, 2t+9 of column g; C holds rows g and
// g+8, columns 2t and 2t+1. The C fragments of two neighbouring 8-key tiles are exactly the A
// fragment of the probabilities for the 16 keys they cover.

#define FLASH_BM 64
#define FLASH_BN 32
#define FLASH_THREADS 128

// mma.sync and the f32-pair packing for one 16-bit type (`ty`: its PTX name).
template <typename T> struct Mma;
#if __CUDA_ARCH__ >= 800
#define FLASH_MMA(T, ty)                                                                                  \
    template <> struct Mma<T> {                                                                       \
        static __device__ __forceinline__ void run(float c[4], const unsigned a[4], unsigned b0, unsigned b1) { \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ty "." ty ".f32 {%0,%1,%2,%3}, "    \
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                     \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                             \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));             \
        }                                                                                             \
        /* Two f32 as one register: `lo` in the low half (the lower column). */                       \
        static __device__ __forceinline__ unsigned pack(float lo, float hi) {                         \
            unsigned r;                                                                               \
            asm("cvt.rn." ty "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));                      \
            return r;                                                                                 \
        }                                                                                             \
    };
#else
// Before sm_80 there is no such mma: the kernels compile empty and are never chosen.
#define FLASH_MMA(T, ty)                                                                                  \
    template <> struct Mma<T> {                                                                       \
        static __device__ __forceinline__ void run(float*, const unsigned*, unsigned, unsigned) {}    \
        static __device__ __forceinline__ unsigned pack(float, float) { return 0; }                   \
    };
#endif
FLASH_MMA(bf16, "bf16")
FLASH_MMA(f16, "f16")

struct FlashArgs {
    unsigned sq_len, sk_len, hq, hkv, d;
    unsigned long long sq, sk, sv, so;  // row strides, in elements
    const int* valid_len;               // may be null
    const unsigned char* key_mask;      // may be null
    unsigned always_from;
    int causal;
    unsigned causal_offset;
    float scale_log2;                   // scale · log2(e)
    unsigned keys_per_split;            // a multiple of FLASH_BN
};

// Whether key j passes the query-independent part of the mask.
__device__ __forceinline__ bool flash_key_ok(const FlashArgs& a, int vl, unsigned j) {
    return ((int)j < vl || j >= a.always_from) && (!a.key_mask || a.key_mask[j]);
}

template <typename T, int DP>
__device__ void flash_attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                T* __restrict__ out, float* __restrict__ part, float* __restrict__ part_ml,
                                const FlashArgs a) {
    constexpr int DS = DP + 8;  // shared row stride (elements)
    extern __shared__ __align__(16) unsigned char flash_smem[];
    unsigned short* ks = (unsigned short*)flash_smem;
    unsigned short* vs = ks + FLASH_BN * DS;

    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned G = a.hq / a.hkv, kh = blockIdx.y, rows = G * a.sq_len;
    const unsigned r0 = blockIdx.x * FLASH_BM;
    const unsigned split = blockIdx.z;
    const unsigned kbeg = split * a.keys_per_split;
    const unsigned kend = min(a.sk_len, kbeg + a.keys_per_split);
    const int vl = a.valid_len ? *a.valid_len : (int)a.sk_len;

    // This thread's two rows (g and g + 8 of the warp's 16).
    unsigned row[2], qi[2], qh[2];
    bool live[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        row[x] = r0 + warp * 16 + g + 8 * x;
        live[x] = row[x] < rows;
        qi[x] = live[x] ? row[x] / G : 0;
        qh[x] = kh * G + (live[x] ? row[x] % G : 0);
    }
    // The last query of the block: keys after qmax + offset are seen by none of its rows.
    const unsigned qmax = (min(rows, r0 + FLASH_BM) - 1) / G;
    const unsigned klimit = a.causal ? min(kend, qmax + a.causal_offset + 1) : kend;

    // Queries as A fragments (columns past d are zero).
    unsigned qf[DP / 16][4];
#pragma unroll
    for (int s = 0; s < DP / 16; ++s) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const unsigned rr = x & 1, col = s * 16 + 2 * t + 8 * (x >> 1);
            qf[s][x] = (live[rr] && col < a.d)
                           ? *(const unsigned*)(q + (unsigned long long)qi[rr] * a.sq + (unsigned long long)qh[rr] * a.d + col)
                           : 0u;
        }
    }

    // Padding columns of the staged K (and V) rows stay zero.
    for (unsigned idx = threadIdx.x; idx < FLASH_BN * (DP - a.d + 8); idx += FLASH_THREADS) {
        const unsigned rr = idx / (DP - a.d + 8), col = a.d + idx % (DP - a.d + 8);
        ks[rr * DS + col] = 0;
        vs[rr * DS + col] = 0;
    }

    float o[DP / 8][4];
#pragma unroll
    for (int n = 0; n < DP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    const unsigned chunks = a.d / 8;  // 16-byte pieces per row
    for (unsigned j0 = kbeg; j0 < klimit; j0 += FLASH_BN) {
        // A tile no row can see (past the valid length and before the always-visible keys).
        if ((int)j0 >= vl && j0 + FLASH_BN <= a.always_from) continue;
        __syncthreads();
        for (unsigned idx = threadIdx.x; idx < FLASH_BN * chunks; idx += FLASH_THREADS) {
            const unsigned rr = idx / chunks, c = (idx % chunks) * 8, j = j0 + rr;
            uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
            // Keys no row sees are staged as zeros (a cache row past the causal horizon may hold
            // anything, and 0 · NaN would poison the sum).
            if (j < klimit && flash_key_ok(a, vl, j)) {
                kx = *(const uint4*)(k + (unsigned long long)j * a.sk + (unsigned long long)kh * a.d + c);
                vx = *(const uint4*)(v + (unsigned long long)j * a.sv + (unsigned long long)kh * a.d + c);
            }
            *(uint4*)(ks + rr * DS + c) = kx;
            *(uint4*)(vs + rr * DS + c) = vx;
        }
        __syncthreads();

        float s[FLASH_BN / 8][4];
#pragma unroll
        for (int n = 0; n < FLASH_BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int c = 0; c < DP / 16; ++c) {
#pragma unroll
            for (int n = 0; n < FLASH_BN / 8; ++n) {
                const unsigned short* kr = ks + (n * 8 + g) * DS + c * 16 + 2 * t;
                Mma<T>::run(s[n], qf[c], *(const unsigned*)kr, *(const unsigned*)(kr + 8));
            }
        }
        // Mask, scale (base 2) and the running maximum of each row.
        float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < FLASH_BN / 8; ++n) {
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const unsigned rr = x >> 1, j = j0 + n * 8 + 2 * t + (x & 1);
                const bool vis = live[rr] && j < klimit && flash_key_ok(a, vl, j) &&
                                 (!a.causal || j <= qi[rr] + a.causal_offset);
                s[n][x] = vis ? s[n][x] * a.scale_log2 : -INFINITY;
                mt[rr] = fmaxf(mt[rr], s[n][x]);
            }
        }
        float corr[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            mt[rr] = fmaxf(mt[rr], __shfl_xor_sync(0xffffffffu, mt[rr], 1));
            mt[rr] = fmaxf(mt[rr], __shfl_xor_sync(0xffffffffu, mt[rr], 2));
            const float mn = fmaxf(m[rr], mt[rr]);
            corr[rr] = (mn == -INFINITY) ? 1.f : exp2f(m[rr] - mn);
            m[rr] = mn;
            l[rr] *= corr[rr];
        }
#pragma unroll
        for (int n = 0; n < FLASH_BN / 8; ++n) {
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const unsigned rr = x >> 1;
                s[n][x] = (s[n][x] == -INFINITY) ? 0.f : exp2f(s[n][x] - m[rr]);
                l[rr] += s[n][x];
            }
        }
#pragma unroll
        for (int n = 0; n < DP / 8; ++n) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        // out += P · V, 16 keys at a time.
#pragma unroll
        for (int kk = 0; kk < FLASH_BN / 16; ++kk) {
            const unsigned pa[4] = {
                Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]),
                Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]),
            };
            const unsigned short* v0 = vs + (kk * 16 + 2 * t) * DS + g;
#pragma unroll
            for (int n = 0; n < DP / 8; ++n) {
                const unsigned short* vp = v0 + n * 8;
                const unsigned b0 = (unsigned)vp[0] | ((unsigned)vp[DS] << 16);
                const unsigned b1 = (unsigned)vp[8 * DS] | ((unsigned)vp[9 * DS] << 16);
                Mma<T>::run(o[n], pa, b0, b1);
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
    }
    if (gridDim.z == 1) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            if (!live[rr]) continue;
            const float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f;
            T* orow = out + (unsigned long long)qi[rr] * a.so + (unsigned long long)qh[rr] * a.d;
#pragma unroll
            for (int n = 0; n < DP / 8; ++n) {
                const unsigned col = n * 8 + 2 * t;
                if (col < a.d) *(unsigned*)(orow + col) = Mma<T>::pack(o[n][2 * rr] * inv, o[n][2 * rr + 1] * inv);
            }
        }
        return;
    }
    // Partial rows of this split: [split][kv head · rows + row][d], and (max, sum) per row.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (!live[rr]) continue;
        const unsigned long long pr = (unsigned long long)split * a.hq * a.sq_len + (unsigned long long)kh * rows + row[rr];
        float* prow = part + pr * a.d;
#pragma unroll
        for (int n = 0; n < DP / 8; ++n) {
            const unsigned col = n * 8 + 2 * t;
            if (col < a.d) *(float2*)(prow + col) = make_float2(o[n][2 * rr], o[n][2 * rr + 1]);
        }
        if (t == 0) *(float2*)(part_ml + 2 * pr) = make_float2(m[rr], l[rr]);
    }
}

// Merges the splits of each row (one warp a row): weights 2^(m_s - M), normalized by the sum.
template <typename T>
__device__ void flash_combine(const float* __restrict__ part, const float* __restrict__ part_ml, T* __restrict__ out,
                              const FlashArgs a, unsigned splits) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long total = (unsigned long long)a.hq * a.sq_len;
    const unsigned long long pr = (unsigned long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (pr >= total) return;
    const unsigned G = a.hq / a.hkv, rows = G * a.sq_len;
    const unsigned kh = (unsigned)(pr / rows), r = (unsigned)(pr % rows);
    const unsigned qi = r / G, qh = kh * G + r % G;
    float mx = -INFINITY;
    for (unsigned s = 0; s < splits; ++s) mx = fmaxf(mx, part_ml[2 * (s * total + pr)]);
    float sum = 0.f;
    for (unsigned s = 0; s < splits; ++s) {
        const float ms = part_ml[2 * (s * total + pr)];
        if (ms != -INFINITY) sum += part_ml[2 * (s * total + pr) + 1] * exp2f(ms - mx);
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* orow = out + (unsigned long long)qi * a.so + (unsigned long long)qh * a.d;
    for (unsigned c = lane; c < a.d; c += 32) {
        float acc = 0.f;
        for (unsigned s = 0; s < splits; ++s) {
            const float ms = part_ml[2 * (s * total + pr)];
            if (ms != -INFINITY) acc += part[(s * total + pr) * a.d + c] * exp2f(ms - mx);
        }
        orow[c] = from_f32<T>(acc * inv);
    }
}

#define FLASH_ATTENTION(T, S, DP)                                                                        \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS) flash_attention_d##DP##_##S(             \
        const T* q, const T* k, const T* v, T* out, float* part, float* part_ml, const FlashArgs a) {    \
        flash_attention<T, DP>(q, k, v, out, part, part_ml, a);                                         \
    }
#define FLASH_ALL(T, S)                                                                                  \
    FLASH_ATTENTION(T, S, 16) FLASH_ATTENTION(T, S, 32) FLASH_ATTENTION(T, S, 64)                       \
    FLASH_ATTENTION(T, S, 80) FLASH_ATTENTION(T, S, 128) FLASH_ATTENTION(T, S, 256)                     \
    extern "C" __global__ void flash_combine_##S(const float* part, const float* part_ml, T* out,        \
                                                 const FlashArgs a, unsigned splits) {                   \
        flash_combine<T>(part, part_ml, out, a, splits);                                                 \
    }
FLASH_ALL(bf16, bf16)
FLASH_ALL(f16, f16)
