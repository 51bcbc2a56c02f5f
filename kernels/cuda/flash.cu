// Fused attention on tensor cores (bf16 or f16 in, f32 accumulation): scores, masked online
// softmax and the product with V in one kernel, without a score matrix in memory.
// Host side and the conditions for choosing it: kernels/src/ops/attention.rs (AttentionPlan).
//
// Layout. Query heads sharing one key/value head form the rows of that key/value head, in
// (query, head-in-group) order: row r is query r / G, head kh·G + r % G (G = Hq / Hkv). A block
// (4 warps) takes 64 rows of one key/value head of one batch entry (grid.y = entry · Hkv + kv
// head) and one range of keys (grid.z, the split); a warp owns 16 rows. The block's queries and one tile of FLASH_BN keys and values are
// staged in shared memory by cp.async (rows padded by 8 elements: conflict-free ldmatrix); the
// next tile's keys load while the current values are used, and its values while the next
// scores are computed. With one split the block writes normalized rows; with several it writes
// unnormalized f32 rows and their (max, sum) and flash_combine merges the splits.
// flash_attention_res_* (RES tiles resident, head dims up to 128): a block's keys fit RES tiles
// (e.g. SigLIP's 256), so every tile's keys and values are staged at once, behind one wait,
// instead of one tile at a time (each tile's wait on memory in the loop above is the kernel's
// latency chain); and the block has 8 warps: warps w and w + 4 own the same 16 rows, w the
// even tiles and w + 4 the odd ones, and w merges w + 4's rows through shared memory at the end.
//
// mma.sync m16n8k16 fragments (g = lane / 4, t = lane % 4): A holds rows g and g+8, columns 2t,
// 2t+1 and 2t+8, 2t+9; B holds k rows 2t, 2t+1 and 2t+8, 2t+9 of column g; C holds rows g and
// g+8, columns 2t and 2t+1. The C fragments of two neighbouring 8-key tiles are exactly the A
// fragment of the probabilities for the 16 keys they cover. Q and K fragments come from
// ldmatrix, V's (k = key, n = column) from ldmatrix.trans.

#define FLASH_BM 64
#define FLASH_BN 64
#define FLASH_THREADS 128


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
    unsigned batch;                     // independent attentions of one shape (grid.y = batch · hkv)
    unsigned long long bq, bk, bv, bo;  // where each next one's tensors start, in elements
    // flash_combine only, may be null: the output's E4M3 codes (laid out as the output, one
    // attention), each e4m3(stored value / code_scale[0]) as quantize_e4m3 makes them.
    unsigned char* codes;
    const float* code_scale;
};

// Whether key j passes the query-independent part of the mask.
__device__ __forceinline__ bool flash_key_ok(const FlashArgs& a, int vl, unsigned j) {
    return ((int)j < vl || j >= a.always_from) && (!a.key_mask || a.key_mask[j]);
}

// The first tile at or after j0 that some row may see (tiles wholly past the valid length and
// before the always-visible keys are skipped), or a value ≥ klimit.
__device__ __forceinline__ unsigned flash_next_tile(const FlashArgs& a, int vl, unsigned j0, unsigned klimit) {
    while (j0 < klimit && (int)j0 >= vl && j0 + FLASH_BN <= a.always_from) j0 += FLASH_BN;
    return j0;
}

// Which of the keys j0 .. j0 + FLASH_BN - 1 pass the query-independent part of the mask (bit i:
// key j0 + i); keys from klimit on do not. Every warp computes it (two loads a lane).
__device__ __forceinline__ unsigned long long flash_tile_keys(const FlashArgs& a, int vl, unsigned j0, unsigned klimit) {
    const unsigned lane = threadIdx.x & 31, j = j0 + lane, j2 = j + 32;
    const unsigned lo = __ballot_sync(0xffffffffu, j < klimit && flash_key_ok(a, vl, j));
    const unsigned hi = __ballot_sync(0xffffffffu, j2 < klimit && flash_key_ok(a, vl, j2));
    return ((unsigned long long)hi << 32) | lo;
}

// Stages FLASH_BN rows of keys (or values) from j0 on: DP / 8 chunks of 16 bytes a row; chunks
// past the head dim and keys outside `keys` (see flash_tile_keys) are zeros (a cache row past
// the causal horizon may hold anything, and 0 · NaN would poison the sum).
// NT: the block's threads. Each thread copies one chunk column c of the rows r, r + RP, ...
// (RP = NT / CH rows a pass; the NT % CH threads past a pass's last whole row copy nothing), so
// that its addresses are computed once and advanced by a stride.
template <typename T, int DP, int NT = FLASH_THREADS>
__device__ __forceinline__ void flash_stage(unsigned short* dst, const T* src, unsigned long long stride,
                                            const FlashArgs& a, unsigned kh, unsigned j0,
                                            unsigned long long keys) {
    constexpr int CH = DP / 8, DS = DP + 8, RP = NT / CH, PASSES = (FLASH_BN + RP - 1) / RP;
    const unsigned c = threadIdx.x % CH, r = threadIdx.x / CH;
    // Past a pass's last whole row, or (more threads than a pass's rows) past the tile's rows.
    if (r >= RP || (RP > FLASH_BN && r >= FLASH_BN)) return;
    const bool col = c < a.d / 8;
    const T* p = src + (unsigned long long)(j0 + r) * stride + (unsigned long long)kh * a.d + c * 8;
    unsigned short* d = dst + r * DS + c * 8;
    const unsigned long long kr = keys >> r;
#pragma unroll
    for (int it = 0; it < PASSES; ++it) {
        if (FLASH_BN % RP != 0 && r + it * RP >= FLASH_BN) break;
        const bool ok = col && ((kr >> (it * RP)) & 1);
        cp_async16(d + it * RP * DS, ok ? p + (unsigned long long)(it * RP) * stride : src, ok);
    }
}

// Stages the block's FLASH_BM rows of queries from r0 on (rows past the last and columns past
// the head dim are zeros); G query heads share a key/value head. NT: the block's threads, one
// chunk column each as in flash_stage.
template <typename T, int DP, int NT>
__device__ __forceinline__ void flash_stage_queries(unsigned short* qs, const T* q, const FlashArgs& a, unsigned G,
                                                    unsigned kh, unsigned r0, unsigned rows) {
    constexpr int CH = DP / 8, DS = DP + 8, RP = NT / CH, PASSES = (FLASH_BM + RP - 1) / RP;
    const unsigned c = threadIdx.x % CH, r = threadIdx.x / CH;
    if (r >= RP || (RP > FLASH_BM && r >= FLASH_BM)) return;
    const bool col = c < a.d / 8;
    // A power-of-two group (every model's here) takes a shift and a mask, not a division.
    const bool pow2 = (G & (G - 1)) == 0;
    const unsigned gs = __ffs(G) - 1;
    const T* base = q + (unsigned long long)kh * G * a.d + c * 8;
#pragma unroll
    for (int it = 0; it < PASSES; ++it) {
        const unsigned rr = r + it * RP, row = r0 + rr;
        if (FLASH_BM % RP != 0 && rr >= FLASH_BM) break;
        const bool ok = col && row < rows;
        unsigned qi, h;
        if (pow2) {
            qi = row >> gs;
            h = row & (G - 1);
        } else {
            qi = row / G;
            h = row - qi * G;
        }
        const T* p = ok ? base + (unsigned long long)qi * a.sq + (unsigned long long)h * a.d : q;
        cp_async16(qs + rr * DS + c * 8, p, ok);
    }
}

// One tile's scores s of a warp's two rows (g and g + 8): masked (the tile's key bits, the
// causal horizon, rows past the last), scaled to base 2 and made probabilities against the
// running maximum m, which they may raise (the running sum l and the accumulators o are then
// rescaled by as much); their sum is added to l.
template <int NO>
__device__ __forceinline__ void flash_softmax_tile(float (&s)[FLASH_BN / 8][4], float (&o)[NO][4], float (&m)[2],
                                                   float (&l)[2], const FlashArgs& a, unsigned long long keys,
                                                   const bool (&live)[2], const unsigned (&qi)[2], unsigned j0,
                                                   unsigned t) {
    float mt[2] = {-INFINITY, -INFINITY};
    if (keys == ~0ull && !a.causal && live[0] && live[1]) {
        // Every score visible (most tiles): no per-score mask.
#pragma unroll
        for (int n = 0; n < FLASH_BN / 8; ++n) {
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                s[n][x] *= a.scale_log2;
                mt[x >> 1] = fmaxf(mt[x >> 1], s[n][x]);
            }
        }
    } else {
        // The thread's keys are 2t, 2t + 1 of every 8: their bits, shifted once.
        const unsigned long long kt = keys >> (2 * t);
#pragma unroll
        for (int n = 0; n < FLASH_BN / 8; ++n) {
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const unsigned rr = x >> 1, jj = n * 8 + 2 * t + (x & 1);
                const bool vis = live[rr] && ((kt >> (n * 8 + (x & 1))) & 1) &&
                                 (!a.causal || j0 + jj <= qi[rr] + a.causal_offset);
                s[n][x] = vis ? s[n][x] * a.scale_log2 : -INFINITY;
                mt[rr] = fmaxf(mt[rr], s[n][x]);
            }
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
    for (int n = 0; n < NO; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
    }
}

// A warp's 16 rows of one tile's scores over DN columns of the head dim: its queries (ldmatrix
// address qa) against the 64 keys staged at kb (both per lane, see below; DS elements a staged
// row).
template <typename T, int DN, int DS>
__device__ __forceinline__ void flash_scores(float (&s)[FLASH_BN / 8][4], unsigned qa, unsigned kb) {
#pragma unroll
    for (int n = 0; n < FLASH_BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int c = 0; c < DN / 16; ++c) {
        unsigned af[4];
        ldmatrix_x4(af, qa + c * 32);
#pragma unroll
        for (int nb = 0; nb < FLASH_BN / 16; ++nb) {
            unsigned bf[4];
            ldmatrix_x4(bf, kb + (nb * 16 * DS + c * 16) * 2);
            Mma<T>::run(s[2 * nb], af, bf[0], bf[1]);
            Mma<T>::run(s[2 * nb + 1], af, bf[2], bf[3]);
        }
    }
}

// o += P · V for one tile, 16 keys at a time: the probabilities s (C fragments of the scores)
// against DN columns of the values staged at vb (per lane, transposed by ldmatrix; DS elements
// a staged row).
template <typename T, int DN, int DS>
__device__ __forceinline__ void flash_pv(float (&o)[DN / 8][4], const float (&s)[FLASH_BN / 8][4], unsigned vb) {
#pragma unroll
    for (int kk = 0; kk < FLASH_BN / 16; ++kk) {
        const unsigned pa[4] = {
            Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]),
            Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]),
            Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
            Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]),
        };
#pragma unroll
        for (int nd = 0; nd < DN / 16; ++nd) {
            unsigned bf[4];
            ldmatrix_x4_trans(bf, vb + (kk * 16 * DS + nd * 16) * 2);
            Mma<T>::run(o[2 * nd], pa, bf[0], bf[1]);
            Mma<T>::run(o[2 * nd + 1], pa, bf[2], bf[3]);
        }
    }
}

// A block's place in the attention and a thread's two rows: the key/value head's rows (G
// query heads a key/value head, rows = G · Sq), the block's first row r0, its split's keys
// [kbeg, klimit) (keys past klimit seen by none of its rows: klimit stops after the block's last
// query under a causal mask), the valid length, and the thread's rows g and g + 8 of warp
// `warp`'s 16: each row, whether it exists and its query.
struct FlashRows {
    unsigned G, rows, r0, kbeg, klimit;
    int vl;
    unsigned row[2], qi[2];
    bool live[2];
};
__device__ __forceinline__ FlashRows flash_rows(const FlashArgs& a, unsigned warp, unsigned g) {
    FlashRows b;
    b.G = a.hq / a.hkv;
    b.rows = b.G * a.sq_len;
    b.r0 = blockIdx.x * FLASH_BM;
    b.kbeg = blockIdx.z * a.keys_per_split;
    const unsigned kend = min(a.sk_len, b.kbeg + a.keys_per_split);
    b.vl = a.valid_len ? *a.valid_len : (int)a.sk_len;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        b.row[x] = b.r0 + warp * 16 + g + 8 * x;
        b.live[x] = b.row[x] < b.rows;
        b.qi[x] = b.live[x] ? b.row[x] / b.G : 0;
    }
    const unsigned qmax = (min(b.rows, b.r0 + FLASH_BM) - 1) / b.G;
    b.klimit = a.causal ? min(kend, qmax + a.causal_offset + 1) : kend;
    return b;
}

template <typename T, int DP, int RES>
__device__ void flash_attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                T* __restrict__ out, float* __restrict__ part, float* __restrict__ part_ml,
                                const FlashArgs a) {
    // Batches only for head dims up to 128: at 256 the registers are all taken (the host plans
    // no batch there).
    constexpr bool batched = DP <= 128;
    const unsigned entry = batched ? blockIdx.y / a.hkv : 0;
    if (batched) {
        q += entry * a.bq;
        k += entry * a.bk;
        v += entry * a.bv;
        out += entry * a.bo;
    }
    constexpr int DS = DP + 8;  // shared row stride (elements)
    // Resident, the warps of every 16 rows split the tiles in two shares.
    static_assert(RES % 2 == 0, "the two shares take every other tile");
    constexpr int NT = RES > 0 ? 2 * FLASH_THREADS : FLASH_THREADS;  // threads
    extern __shared__ __align__(16) unsigned char flash_smem[];
    unsigned short* qs = (unsigned short*)flash_smem;
    // Streaming: one tile of keys and one of values. Resident (RES > 0): RES tiles of each.
    constexpr int TILES = RES > 0 ? RES : 1;
    unsigned short* ks = qs + FLASH_BM * DS;
    unsigned short* vs = ks + TILES * FLASH_BN * DS;

    // The warp's 16 rows (of the block's 64) and, resident, which of every two tiles it takes (its share).
    const unsigned lane = threadIdx.x & 31;
    const unsigned warp = RES > 0 ? (threadIdx.x >> 5) & 3 : threadIdx.x >> 5;
    const unsigned share = RES > 0 ? threadIdx.x >> 7 : 0;
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned kh = batched ? blockIdx.y % a.hkv : blockIdx.y, split = blockIdx.z;
    const FlashRows b = flash_rows(a, warp, g);
    const unsigned G = b.G, rows = b.rows, r0 = b.r0, kbeg = b.kbeg, klimit = b.klimit;
    const int vl = b.vl;
    const unsigned(&row)[2] = b.row;
    const unsigned(&qi)[2] = b.qi;
    const bool(&live)[2] = b.live;

    // The block's queries (in the first tile's cp.async group: streaming, with its keys).
    flash_stage_queries<T, DP, NT>(qs, q, a, G, kh, r0, rows);
    unsigned j0 = flash_next_tile(a, vl, kbeg, klimit);

    float o[DP / 8][4];
#pragma unroll
    for (int n = 0; n < DP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    // Per-lane ldmatrix addresses (shared, bytes): A rows of Q, B rows of K, B rows of V
    // (transposed).
    const unsigned qa = smem_addr(qs + (warp * 16 + (lane & 15)) * DS + (lane >> 4) * 8);
    const unsigned kb = smem_addr(ks + ((lane & 7) + ((lane >> 4) << 3)) * DS + ((lane >> 3) & 1) * 8);
    const unsigned vb = smem_addr(vs + ((lane & 7) + (((lane >> 3) & 1) << 3)) * DS + (lane >> 4) * 8);

    if constexpr (RES > 0) {
        // Every tile of the block's keys (the host plans at most RES), each in its own slot:
        // slot i's first key js[i] (klimit past the last tile) and its key bits.
        unsigned js[RES];
        unsigned long long tk[RES];
#pragma unroll
        for (int i = 0; i < RES; ++i) {
            js[i] = j0;
            tk[i] = j0 < klimit ? flash_tile_keys(a, vl, j0, klimit) : 0ull;
            if (j0 < klimit) j0 = flash_next_tile(a, vl, j0 + FLASH_BN, klimit);
        }
        constexpr int TILE = FLASH_BN * DS;  // elements
#pragma unroll
        for (int i = 0; i < RES; ++i) {
            if (js[i] < klimit) {
                flash_stage<T, DP, NT>(ks + i * TILE, k, a.sk, a, kh, js[i], tk[i]);
                flash_stage<T, DP, NT>(vs + i * TILE, v, a.sv, a, kh, js[i], tk[i]);
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        // The warp's tiles: slots share, share + 2, ...
#pragma unroll
        for (int r = 0; r < RES / 2; ++r) {
            const unsigned i = 2 * r + share;
            const unsigned jt = share ? js[2 * r + 1] : js[2 * r];
            const unsigned long long tkeys = share ? tk[2 * r + 1] : tk[2 * r];
            if (jt < klimit) {
                float s[FLASH_BN / 8][4];
                flash_scores<T, DP, DS>(s, qa, kb + i * TILE * 2);
                flash_softmax_tile<DP / 8>(s, o, m, l, a, tkeys, live, qi, jt, t);
                flash_pv<T, DP, DS>(o, s, vb + i * TILE * 2);
            }
        }
    } else {
        unsigned long long keys = j0 < klimit ? flash_tile_keys(a, vl, j0, klimit) : 0ull;
        if (j0 < klimit) flash_stage<T, DP>(ks, k, a.sk, a, kh, j0, keys);
        cp_async_commit();
        if (j0 < klimit) flash_stage<T, DP>(vs, v, a.sv, a, kh, j0, keys);
        cp_async_commit();
        while (j0 < klimit) {
            const unsigned jn = flash_next_tile(a, vl, j0 + FLASH_BN, klimit);
            cp_async_wait1();  // the queries and this tile's keys
            __syncthreads();
            float s[FLASH_BN / 8][4];
            flash_scores<T, DP, DS>(s, qa, kb);
            const unsigned long long next_keys = jn < klimit ? flash_tile_keys(a, vl, jn, klimit) : 0ull;
            __syncthreads();  // every warp is done with the keys: the next tile's may come in
            if (jn < klimit) flash_stage<T, DP>(ks, k, a.sk, a, kh, jn, next_keys);
            cp_async_commit();

            flash_softmax_tile<DP / 8>(s, o, m, l, a, keys, live, qi, j0, t);
            cp_async_wait1();  // this tile's values (the next tile's keys may still be in flight)
            __syncthreads();
            flash_pv<T, DP, DS>(o, s, vb);
            __syncthreads();  // every warp is done with the values
            if (jn < klimit) flash_stage<T, DP>(vs, v, a.sv, a, kh, jn, next_keys);
            cp_async_commit();
            j0 = jn;
            keys = next_keys;
        }
    }

#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
    }
    if constexpr (RES > 0) {
        // Share 1's warps hand their unnormalized rows and (max, sum) to share 0's warps of the
        // same rows (through the staged keys' memory, no longer read), which merge them into
        // theirs and go on alone.
        __syncthreads();
        float* xo = (float*)ks;                          // [FLASH_BM][DP]
        float2* xml = (float2*)(xo + FLASH_BM * DP);     // [FLASH_BM]
        if (share) {
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const unsigned r = warp * 16 + g + 8 * rr;
#pragma unroll
                for (int n = 0; n < DP / 8; ++n) *(float2*)(xo + r * DP + n * 8 + 2 * t) = make_float2(o[n][2 * rr], o[n][2 * rr + 1]);
                if (t == 0) xml[r] = make_float2(m[rr], l[rr]);
            }
        }
        __syncthreads();
        if (share) return;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const unsigned r = warp * 16 + g + 8 * rr;
            const float2 e = xml[r];
            const float mx = fmaxf(m[rr], e.x);
            const float w0 = m[rr] == -INFINITY ? 0.f : exp2f(m[rr] - mx);
            const float w1 = e.x == -INFINITY ? 0.f : exp2f(e.x - mx);
            m[rr] = mx;
            l[rr] = l[rr] * w0 + e.y * w1;
#pragma unroll
            for (int n = 0; n < DP / 8; ++n) {
                const float2 x = *(const float2*)(xo + r * DP + n * 8 + 2 * t);
                o[n][2 * rr] = o[n][2 * rr] * w0 + x.x * w1;
                o[n][2 * rr + 1] = o[n][2 * rr + 1] * w0 + x.y * w1;
            }
        }
    }
    if (gridDim.z == 1) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            if (!live[rr]) continue;
            const float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f;
            const unsigned qh = kh * G + row[rr] % G;
            T* orow = out + (unsigned long long)qi[rr] * a.so + (unsigned long long)qh * a.d;
#pragma unroll
            for (int n = 0; n < DP / 8; ++n) {
                const unsigned col = n * 8 + 2 * t;
                if (col < a.d) *(unsigned*)(orow + col) = Mma<T>::pack(o[n][2 * rr] * inv, o[n][2 * rr + 1] * inv);
            }
        }
        return;
    }
    // Partial rows of this split: [split][entry · Hq · Sq + kv head · rows + row][d], and
    // (max, sum) per row.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (!live[rr]) continue;
        const unsigned long long pr = ((unsigned long long)split * a.batch + entry) * a.hq * a.sq_len +
                                      (unsigned long long)kh * rows + row[rr];
        float* prow = part + pr * a.d;
#pragma unroll
        for (int n = 0; n < DP / 8; ++n) {
            const unsigned col = n * 8 + 2 * t;
            if (col < a.d) *(float2*)(prow + col) = make_float2(o[n][2 * rr], o[n][2 * rr + 1]);
        }
        if (t == 0) *(float2*)(part_ml + 2 * pr) = make_float2(m[rr], l[rr]);
    }
}

// flash_attention_halves_d256_S (head dim 256, streaming): 8 warps a block, warps w and w + 4
// owning the same 16 rows, w the head dim's first half and w + 4 its second. Each computes its
// half's share of the 16 × 64 scores of a tile; the two shares meet in shared memory and both
// warps add them (lo + hi, the same sum in both), so both take the same probabilities; each
// then multiplies them with its half of the values. Half the accumulators (64 registers) and
// half the MMAs a warp of the one-warp-per-16-rows form, with two warps on each scheduler.
#define FLASH_HALVES_THREADS 256
template <typename T>
__device__ void flash_attention_halves(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                       T* __restrict__ out, float* __restrict__ part, float* __restrict__ part_ml,
                                       const FlashArgs a) {
    constexpr int DP = 256, DH = DP / 2, DS = DP + 8, NT = FLASH_HALVES_THREADS;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    unsigned short* qs = (unsigned short*)flash_smem;
    unsigned short* ks = qs + FLASH_BM * DS;
    unsigned short* vs = ks + FLASH_BN * DS;
    // Each warp's share of its tile's scores, in fragment order: [warp][n][x][lane].
    float* xs = (float*)(vs + FLASH_BN * DS);

    const unsigned lane = threadIdx.x & 31, w8 = threadIdx.x >> 5, warp = w8 & 3, half = w8 >> 2;
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned kh = blockIdx.y, split = blockIdx.z;
    const FlashRows b = flash_rows(a, warp, g);
    const unsigned G = b.G, rows = b.rows, r0 = b.r0, kbeg = b.kbeg, klimit = b.klimit;
    const int vl = b.vl;
    const unsigned(&row)[2] = b.row;
    const unsigned(&qi)[2] = b.qi;
    const bool(&live)[2] = b.live;

    flash_stage_queries<T, DP, NT>(qs, q, a, G, kh, r0, rows);
    unsigned j0 = flash_next_tile(a, vl, kbeg, klimit);
    unsigned long long keys = j0 < klimit ? flash_tile_keys(a, vl, j0, klimit) : 0ull;
    if (j0 < klimit) flash_stage<T, DP, NT>(ks, k, a.sk, a, kh, j0, keys);
    cp_async_commit();
    if (j0 < klimit) flash_stage<T, DP, NT>(vs, v, a.sv, a, kh, j0, keys);
    cp_async_commit();

    float o[DH / 8][4];
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    const unsigned col0 = half * DH;
    const unsigned qa = smem_addr(qs + (warp * 16 + (lane & 15)) * DS + col0 + (lane >> 4) * 8);
    const unsigned kb = smem_addr(ks + ((lane & 7) + ((lane >> 4) << 3)) * DS + col0 + ((lane >> 3) & 1) * 8);
    const unsigned vb = smem_addr(vs + ((lane & 7) + (((lane >> 3) & 1) << 3)) * DS + col0 + (lane >> 4) * 8);
    float* mine = xs + w8 * (FLASH_BN / 8) * 4 * 32 + lane;
    const float* other = xs + (w8 ^ 4) * (FLASH_BN / 8) * 4 * 32 + lane;

    while (j0 < klimit) {
        const unsigned jn = flash_next_tile(a, vl, j0 + FLASH_BN, klimit);
        cp_async_wait1();  // the queries and this tile's keys
        __syncthreads();
        float s[FLASH_BN / 8][4];
        flash_scores<T, DH, DS>(s, qa, kb);
#pragma unroll
        for (int n = 0; n < FLASH_BN / 8; ++n)
#pragma unroll
            for (int x = 0; x < 4; ++x) mine[(n * 4 + x) * 32] = s[n][x];
        const unsigned long long next_keys = jn < klimit ? flash_tile_keys(a, vl, jn, klimit) : 0ull;
        // Every warp is done with the keys (the next tile's may come in), and the shares of
        // the scores are written.
        __syncthreads();
        if (jn < klimit) flash_stage<T, DP, NT>(ks, k, a.sk, a, kh, jn, next_keys);
        cp_async_commit();
        // The first half's share plus the second's, in both warps.
#pragma unroll
        for (int n = 0; n < FLASH_BN / 8; ++n)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const float y = other[(n * 4 + x) * 32];
                s[n][x] = half == 0 ? s[n][x] + y : y + s[n][x];
            }

        flash_softmax_tile<DH / 8>(s, o, m, l, a, keys, live, qi, j0, t);
        cp_async_wait1();  // this tile's values
        __syncthreads();
        flash_pv<T, DH, DS>(o, s, vb);
        __syncthreads();  // every warp is done with the values
        if (jn < klimit) flash_stage<T, DP, NT>(vs, v, a.sv, a, kh, jn, next_keys);
        cp_async_commit();
        j0 = jn;
        keys = next_keys;
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
            const unsigned qh = kh * G + row[rr] % G;
            T* orow = out + (unsigned long long)qi[rr] * a.so + (unsigned long long)qh * a.d + col0;
#pragma unroll
            for (int n = 0; n < DH / 8; ++n) {
                const unsigned col = n * 8 + 2 * t;
                if (col0 + col < a.d) *(unsigned*)(orow + col) = Mma<T>::pack(o[n][2 * rr] * inv, o[n][2 * rr + 1] * inv);
            }
        }
        return;
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        if (!live[rr]) continue;
        const unsigned long long pr = (unsigned long long)split * a.hq * a.sq_len + (unsigned long long)kh * rows + row[rr];
        float* prow = part + pr * a.d + col0;
#pragma unroll
        for (int n = 0; n < DH / 8; ++n) {
            const unsigned col = n * 8 + 2 * t;
            if (col0 + col < a.d) *(float2*)(prow + col) = make_float2(o[n][2 * rr], o[n][2 * rr + 1]);
        }
        if (half == 0 && t == 0) *(float2*)(part_ml + 2 * pr) = make_float2(m[rr], l[rr]);
    }
}

// flash_combine for up to N splits: the values of every split are loaded into registers
// first, then merged with the same arithmetic as flash_combine's loop.
// The 4 merged values of a thread, rounded to T into orow, and their codes into crow when
// given (from the stored values, as quantize_e4m3 computes them).
template <typename T>
__device__ __forceinline__ void flash_combine_store(const float acc[4], float inv, T* __restrict__ orow,
                                                    unsigned char* __restrict__ crow, const float* code_scale) {
    T r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        r[i] = from_f32<T>(acc[i] * inv);
        orow[i] = r[i];
    }
    if (crow) {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = to_f32(r[i]);
        store_codes(crow, v, 4, *code_scale);
    }
}

template <typename T, int N>
__device__ __forceinline__ void flash_combine_regs(const float* __restrict__ part, const float2* __restrict__ ml,
                                                   T* __restrict__ orow, unsigned char* __restrict__ crow,
                                                   const float* code_scale, unsigned total, unsigned pr, unsigned d,
                                                   unsigned c, unsigned splits) {
    float2 e[N];
    float4 p[N];
#pragma unroll
    for (unsigned s = 0; s < N; ++s) {
        if (s < splits) {
            const unsigned long long sr = (unsigned long long)s * total + pr;
            e[s] = ml[sr];
            p[s] = *(const float4*)(part + sr * d + c);
        }
    }
    float mx = -INFINITY;
#pragma unroll
    for (unsigned s = 0; s < N; ++s)
        if (s < splits) mx = fmaxf(mx, e[s].x);
    float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (unsigned s = 0; s < N; ++s) {
        if (s < splits) {
            const float w = e[s].x == -INFINITY ? 0.f : exp2f(e[s].x - mx);
            sum += e[s].y * w;
            acc[0] += w * p[s].x;
            acc[1] += w * p[s].y;
            acc[2] += w * p[s].z;
            acc[3] += w * p[s].w;
        }
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    flash_combine_store<T>(acc, inv, orow, crow, code_scale);
}

// Merges the splits: one thread per row and 4 columns (d / 4 threads a row). Split s weighs
// 2^(m_s - M); the sum of the weighted (max, sum) pairs normalizes. The loads of successive
// splits do not depend on each other, so they are in flight together.
// N > 0: at most N splits, through flash_combine_regs (one kernel per N, so that each has only
// the registers it needs).
template <typename T, int N>
__device__ void flash_combine(const float* __restrict__ part, const float* __restrict__ part_ml, T* __restrict__ out,
                              const FlashArgs a, unsigned splits) {
    // Rows and threads fit 32 bits (the host checks batch · Hq · Sq · d < 2^32).
    const unsigned total = a.batch * a.hq * a.sq_len;
    const unsigned tpr = a.d / 4;
    const unsigned gid = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned pr = gid / tpr;
    if (pr >= total) return;
    const unsigned c = (gid % tpr) * 4;
    const unsigned G = a.hq / a.hkv, rows = G * a.sq_len;
    const unsigned entry = pr / (a.hq * a.sq_len), er = pr % (a.hq * a.sq_len);
    const unsigned kh = er / rows, r = er % rows;
    const unsigned qi = r / G, qh = kh * G + r % G;
    const float2* ml = (const float2*)part_ml;
    const unsigned long long oi = entry * a.bo + (unsigned long long)qi * a.so + (unsigned long long)qh * a.d + c;
    T* orow = out + oi;
    unsigned char* crow = a.codes ? a.codes + oi : nullptr;
    if (N > 0)
        return flash_combine_regs<T, (N > 0 ? N : 1)>(part, ml, orow, crow, a.code_scale, total, pr, a.d, c, splits);
    float mx = -INFINITY;
#pragma unroll 8
    for (unsigned s = 0; s < splits; ++s) mx = fmaxf(mx, ml[(unsigned long long)s * total + pr].x);
    float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (unsigned s = 0; s < splits; ++s) {
        const unsigned long long sr = (unsigned long long)s * total + pr;
        const float2 e = ml[sr];
        const float4 p = *(const float4*)(part + sr * a.d + c);
        const float w = e.x == -INFINITY ? 0.f : exp2f(e.x - mx);
        sum += e.y * w;
        acc[0] += w * p.x;
        acc[1] += w * p.y;
        acc[2] += w * p.z;
        acc[3] += w * p.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    flash_combine_store<T>(acc, inv, orow, crow, a.code_scale);
}

#define FLASH_ATTENTION(T, S, DP)                                                                        \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS) flash_attention_d##DP##_##S(             \
        const T* q, const T* k, const T* v, T* out, float* part, float* part_ml, const FlashArgs a) {    \
        if (gridDim.z > 1) pdl_trigger();                                                                \
        flash_attention<T, DP, 0>(q, k, v, out, part, part_ml, a);                                      \
    }
// flash_attention_res_dDP_S: FLASH_RES tiles resident (head dims up to 128).
#define FLASH_RES 4
#define FLASH_ATTENTION_RES(T, S, DP)                                                                    \
    extern "C" __global__ void __launch_bounds__(2 * FLASH_THREADS) flash_attention_res_d##DP##_##S(     \
        const T* q, const T* k, const T* v, T* out, float* part, float* part_ml, const FlashArgs a) {    \
        if (gridDim.z > 1) pdl_trigger();                                                                \
        flash_attention<T, DP, FLASH_RES>(q, k, v, out, part, part_ml, a);                              \
    }
#define FLASH_ATTENTION_HALVES(T, S)                                                                     \
    extern "C" __global__ void __launch_bounds__(FLASH_HALVES_THREADS) flash_attention_halves_d256_##S(  \
        const T* q, const T* k, const T* v, T* out, float* part, float* part_ml, const FlashArgs a) {    \
        if (gridDim.z > 1) pdl_trigger();                                                                \
        flash_attention_halves<T>(q, k, v, out, part, part_ml, a);                                      \
    }
// flash_combine_S (any number of splits) and flash_combine{4,8,16}_S (at most that many).
#define FLASH_COMBINE(T, S, SUFFIX, N)                                                                   \
    extern "C" __global__ void flash_combine##SUFFIX##_##S(const float* part, const float* part_ml,      \
                                                           T* out, const FlashArgs a, unsigned splits) { \
        pdl_wait();                                                                                      \
        pdl_trigger();                                                                                   \
        flash_combine<T, N>(part, part_ml, out, a, splits);                                              \
    }
#define FLASH_ALL(T, S)                                                                                  \
    FLASH_ATTENTION(T, S, 16) FLASH_ATTENTION(T, S, 32) FLASH_ATTENTION(T, S, 64)                       \
    FLASH_ATTENTION(T, S, 80) FLASH_ATTENTION(T, S, 128) FLASH_ATTENTION(T, S, 256)                     \
    FLASH_ATTENTION_RES(T, S, 16) FLASH_ATTENTION_RES(T, S, 32) FLASH_ATTENTION_RES(T, S, 64)           \
    FLASH_ATTENTION_RES(T, S, 80) FLASH_ATTENTION_RES(T, S, 128) FLASH_ATTENTION_HALVES(T, S)           \
    FLASH_COMBINE(T, S, , 0) FLASH_COMBINE(T, S, 4, 4) FLASH_COMBINE(T, S, 8, 8)                      \
    FLASH_COMBINE(T, S, 16, 16)
FLASH_ALL(bf16, bf16)
FLASH_ALL(f16, f16)
