// Fused causal attention in the manner of FlashAttention-2, for q, k, v
// [B, T, C] with H heads of width D = C / H addressed in place (head h is
// channels h*D..(h+1)*D, so row t of head h starts at b*T*C + t*C + h*D).
// No [T, T] matrix exists anywhere: keys and values stream through shared
// memory in tiles of KT, the softmax is online, and the backward recomputes
// the probabilities tile by tile from the per-row log-sum-exp.
//
// Entry points (SUFFIX is the dtype, DR = ceil(D / 32) in {1, 2, 4}; f64
// has DR 1 and 2 only, its tiles would not fit the static 48 KiB):
//   flash_fwd_SUFFIX_DR(T, H, C, D, scale, q, k, v, y, lse)
//       grid (ceil(T / FQ), B * H), block 128. y may be null: only the
//       log-sum-exp (A, [B, H, T]) is written, for a backward that did
//       not keep the forward's.
//   flash_prep_SUFFIX(rows, T, H, C, D, g, y, dsum)
//       dsum[b, h, i] = g_i . y_i (the softmax backward's row term), a warp
//       a row, grid-strided; rows = B * H * T.
//   flash_dq_SUFFIX_DR(T, H, C, D, scale, q, k, v, g, lse, dsum, dq)
//       grid (ceil(T / BQ), B * H), block 128: dq of BQ query rows.
//   flash_dkv_SUFFIX_DR(T, H, C, D, scale, q, k, v, g, lse, dsum, dk, dv)
//       grid (ceil(T / KT), B * H), block 128: dk and dv of KT keys.
// The gradient of q and those of k, v come from two kernels rather than
// one with atomic adds, so every result is computed in one fixed order:
// the same inputs give the same bits on every run.
//
// Within a warp, lane j holds the score of key j of the tile (a dot
// product over D read from shared memory, rows padded to 32 DR + 1 so the
// 32 lanes hit 32 banks), and lane d holds output channels d, d + 32, ...;
// probabilities pass between the two layouts by shuffles. All arithmetic is
// in the accumulation type A (float for f32, f16, bf16; double for f64).

#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * WARP)
#define KT 32  // keys a tile (one a lane)
#define FQ 16  // query rows a forward block (4 a warp)
#define BQ 8   // query rows a backward block or chunk (2 a warp)

// Rows [r0, r0 + n) of one head into s[n][W] (A), zeros past row T.
template <typename T, typename A, int W>
__device__ __forceinline__ void load_rows(A (*s)[W], const T* x, i64 base, i64 r0, int n, i64 t, i64 c, i64 d) {
    for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
        int r = e / (int)d, col = e % (int)d;
        i64 row = r0 + r;
        s[r][col] = row < t ? to_acc(x[base + row * c + col]) : A(0);
    }
}

template <typename A> __device__ __forceinline__ A dot_rows(const A* a, const A* b, i64 d) {
    A s = A(0);
    for (int x = 0; x < (int)d; x++) s += a[x] * b[x];
    return s;
}

template <typename T, int DR>
__device__ __forceinline__ void flash_fwd(i64 t, i64 heads, i64 c, i64 d, double scale_, const T* q, const T* k,
                                          const T* v, T* y, typename Acc<T>::type* lse) {
    typedef typename Acc<T>::type A;
    const int RPW = FQ / ATT_WARPS;
    __shared__ A Qs[FQ][32 * DR];
    __shared__ A Ks[KT][32 * DR + 1];
    __shared__ A Vs[KT][32 * DR + 1];
    const A scale = A(scale_);
    const i64 bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const i64 base = b * t * c + h * d;
    const i64 q0 = (i64)blockIdx.x * FQ;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    load_rows<T, A, 32 * DR>(Qs, q, base, q0, FQ, t, c, d);
    A m[RPW], l[RPW], o[RPW][DR];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        m[rr] = neg_inf<A>();
        l[rr] = A(0);
#pragma unroll
        for (int r = 0; r < DR; r++) o[rr][r] = A(0);
    }
    const i64 kend = q0 + FQ < t ? q0 + FQ : t;  // keys past the block's last query are masked
    for (i64 k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();  // the previous tile is no longer read
        load_rows<T, A, 32 * DR + 1>(Ks, k, base, k0, KT, t, c, d);
        load_rows<T, A, 32 * DR + 1>(Vs, v, base, k0, KT, t, c, d);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int row = w * RPW + rr;
            const i64 i = q0 + row;
            if (i >= t || k0 > i) continue;  // uniform over the warp
            const i64 j = k0 + lane;
            const bool ok = j <= i;
            A s = ok ? dot_rows(Qs[row], Ks[lane], d) * scale : neg_inf<A>();
            const A mt = warp_max(s);
            const A mn = m[rr] > mt ? m[rr] : mt;
            const A p = ok ? t_exp(s - mn) : A(0);
            const A corr = t_exp(m[rr] - mn);  // 0 while m is -inf
            l[rr] = l[rr] * corr + warp_sum(p);
            m[rr] = mn;
            const int nk = (int)(i - k0 + 1 < KT ? i - k0 + 1 : KT);
#pragma unroll
            for (int r = 0; r < DR; r++) o[rr][r] *= corr;
            for (int jj = 0; jj < nk; jj++) {
                const A pj = __shfl_sync(FULL_MASK, p, jj);
#pragma unroll
                for (int r = 0; r < DR; r++)
                    if (lane + 32 * r < d) o[rr][r] += pj * Vs[jj][lane + 32 * r];
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const i64 i = q0 + w * RPW + rr;
        if (i >= t) continue;
        if (y) {
            const A inv = A(1) / l[rr];
#pragma unroll
            for (int r = 0; r < DR; r++)
                if (lane + 32 * r < d) y[base + i * c + lane + 32 * r] = from_acc<T>(o[rr][r] * inv);
        }
        if (lane == 0) lse[bh * t + i] = m[rr] + t_log(l[rr]);
    }
}

// The tensor-core forward of f16 and bf16 (sm_80 and newer): the same
// algorithm, each warp taking 16 query rows of a TQ-row block, both products
// (S = Q K^T and O += P V) as mma.sync m16n8k16 with f32 accumulators, the
// fragments of Q, K and V loaded from shared memory with ldmatrix (V's
// transposed). Tiles hold raw 16-bit values, rows padded by 16 bytes so the
// eight rows of one ldmatrix matrix fall in eight different bank groups;
// columns past d and rows past t are zeros, which add nothing to a product.
// Fragment layouts (PTX ISA, lane = 4 g + q): an accumulator holds rows g
// and g + 8 at columns 2q, 2q + 1 of an 8-column block, so the four lanes
// of a group hold one row and reduce it with two shuffles; P's accumulators
// are rounded to T and repacked as the A operand of P V in registers.
//   flash_fwd_tc_SUFFIX_DR: as flash_fwd_SUFFIX_DR, grid (ceil(T / TQ), B * H).
#define TQ 64  // query rows a tensor-core forward block (16 a warp)

__device__ __forceinline__ unsigned tc_smem(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

__device__ __forceinline__ void tc_ldsm_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_smem(p)));
}

__device__ __forceinline__ void tc_ldsm_x4_trans(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_smem(p)));
}

// d += a b for one 16 x 8 x 16 block (a: A's fragment, b0 b1: B's).
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, tapir_f16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, tapir_bf16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T> __device__ __forceinline__ unsigned tc_pack(float lo, float hi) {
    return pack_half2<T>(lo, hi);
}

// Rows [r0, r0 + N) of one head as raw 16-bit values into s[N][S], zeros
// past row t and column d. When rows start 16-byte aligned (vec: c and d
// multiples of 8, the tensor aligned) a thread moves 8 values at once.
template <typename T, int N, int W, int S>
__device__ __forceinline__ void tc_load(u16 (*s)[S], const T* x, i64 base, i64 r0, i64 t, i64 c, i64 d, bool vec) {
    if (vec) {
        for (int e = threadIdx.x; e < N * (W / 8); e += blockDim.x) {
            const int r = e / (W / 8), col = (e % (W / 8)) * 8;
            const i64 row = r0 + r;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (row < t && col < d) val = *reinterpret_cast<const uint4*>(x + base + row * c + col);
            *reinterpret_cast<uint4*>(&s[r][col]) = val;
        }
    } else {
        for (int e = threadIdx.x; e < N * W; e += blockDim.x) {
            const int r = e / W, col = e % W;
            const i64 row = r0 + r;
            s[r][col] = row < t && col < d ? x[base + row * c + col].x : (u16)0;
        }
    }
}

// acc[N / 8][4] += A (16 x W, fragments a) times the N rows of tile s as B
// (s[n][channel], so B = s^T): 16 x N, the layout of S = Q K^T.
template <typename T, int W, int N, int S>
__device__ __forceinline__ void tc_rows_t(float (&acc)[N / 8][4], const unsigned (&a)[W / 16][4], const u16 (*s)[S],
                                          int lane) {
#pragma unroll
    for (int nb = 0; nb < N / 8; nb++) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < W / 16; ks++) {
#pragma unroll
        for (int nb = 0; nb < N / 8; nb += 2) {
            unsigned f[4];
            tc_ldsm_x4(f, &s[nb * 8 + lane % 8 + 8 * (lane / 16)][ks * 16 + 8 * ((lane / 8) % 2)]);
            tc_mma(acc[nb], a[ks], f[0], f[1], T());
            tc_mma(acc[nb + 1], a[ks], f[2], f[3], T());
        }
    }
}

template <typename T, int DR>
__device__ __forceinline__ void flash_fwd_tc(i64 t, i64 heads, i64 c, i64 d, double scale_, const T* q, const T* k,
                                             const T* v, T* y, float* lse) {
#if __CUDA_ARCH__ >= 800
    const int W = 32 * DR;  // the head's width padded (zeros past d)
    const int S = W + 8;    // a tile row, in 16-bit values
    __shared__ __align__(16) u16 Qs[TQ][S];
    __shared__ __align__(16) u16 Ks[KT][S];
    __shared__ __align__(16) u16 Vs[KT][S];
    const float scale = (float)scale_;
    const i64 bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const i64 base = b * t * c + h * d;
    const i64 q0 = (i64)blockIdx.x * TQ;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, g = lane / 4, tq = lane % 4;
    const bool vec = d % 8 == 0 && c % 8 == 0 && ((u64)q & 15) == 0 && ((u64)k & 15) == 0 && ((u64)v & 15) == 0;
    const i64 r0 = q0 + w * 16;  // the warp's first row
    tc_load<T, TQ, W, S>(Qs, q, base, q0, t, c, d, vec);
    __syncthreads();
    // Q's fragments, kept in registers for every tile: matrix m of an x4
    // is rows 8 (m % 2).., columns 8 (m / 2).. of a 16 x 16 block.
    unsigned qf[W / 16][4];
#pragma unroll
    for (int ks = 0; ks < W / 16; ks++) tc_ldsm_x4(qf[ks], &Qs[w * 16 + lane % 16][ks * 16 + 8 * (lane / 16)]);
    float m[2] = {neg_inf<float>(), neg_inf<float>()}, l[2] = {0.f, 0.f};  // rows g, g + 8; l this lane's part
    float o[W / 8][4];
#pragma unroll
    for (int nd = 0; nd < W / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
    const i64 kend = q0 + TQ < t ? q0 + TQ : t;
    for (i64 k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();  // the previous tile is no longer read
        tc_load<T, KT, W, S>(Ks, k, base, k0, t, c, d, vec);
        tc_load<T, KT, W, S>(Vs, v, base, k0, t, c, d, vec);
        __syncthreads();
        if (r0 >= t || k0 > r0 + 15) continue;  // uniform over the warp: no row of it sees a key of the tile
        float s[KT / 8][4];
        tc_rows_t<T, W, KT, S>(s, qf, Ks, lane);
        float mt[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < KT / 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const i64 j = k0 + nb * 8 + 2 * tq + (e & 1), i = r0 + g + 8 * (e >> 1);
                const float x = j <= i ? s[nb][e] * scale : neg_inf<float>();
                s[nb][e] = x;
                mt[e >> 1] = fmaxf(mt[e >> 1], x);
            }
        }
        float ref[2], corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(FULL_MASK, mt[r], 1));
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(FULL_MASK, mt[r], 2));
            ref[r] = mt[r] == neg_inf<float>() ? 0.f : mt[r];  // a row that sees no key yet stays at zero
            corr[r] = t_exp(m[r] - ref[r]);                       // 0 while m is -inf
            m[r] = mt[r];
            l[r] *= corr[r];
        }
#pragma unroll
        for (int nb = 0; nb < KT / 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = t_exp(s[nb][e] - ref[e >> 1]);
                s[nb][e] = p;
                l[e >> 1] += p;
            }
        }
#pragma unroll
        for (int nd = 0; nd < W / 8; nd++) {
            o[nd][0] *= corr[0];
            o[nd][1] *= corr[0];
            o[nd][2] *= corr[1];
            o[nd][3] *= corr[1];
        }
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            // P's accumulators for keys 16 kk.. as an A fragment.
            const unsigned pa[4] = {tc_pack<T>(s[2 * kk][0], s[2 * kk][1]), tc_pack<T>(s[2 * kk][2], s[2 * kk][3]),
                                    tc_pack<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    tc_pack<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int nd = 0; nd < W / 8; nd += 2) {
                // Keys 16 kk.. and 16 kk + 8.., channels 8 nd.. and 8 (nd + 1).., transposed.
                unsigned vf[4];
                tc_ldsm_x4_trans(vf, &Vs[kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)][nd * 8 + 8 * (lane / 16)]);
                tc_mma(o[nd], pa, vf[0], vf[1], T());
                tc_mma(o[nd + 1], pa, vf[2], vf[3], T());
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 2);
        const i64 i = r0 + g + 8 * r;
        if (i >= t) continue;
        if (y) {
            const float inv = 1.f / l[r];
#pragma unroll
            for (int nd = 0; nd < W / 8; nd++) {
                const i64 col = nd * 8 + 2 * tq;
                if (col < d) y[base + i * c + col] = from_acc<T>(o[nd][2 * r] * inv);
                if (col + 1 < d) y[base + i * c + col + 1] = from_acc<T>(o[nd][2 * r + 1] * inv);
            }
        }
        if (tq == 0) lse[bh * t + i] = m[r] + t_log(l[r]);
    }
#endif
}

template <typename T>
__device__ __forceinline__ void flash_prep(i64 rows, i64 t, i64 heads, i64 c, i64 d, const T* g, const T* y,
                                           typename Acc<T>::type* dsum) {
    typedef typename Acc<T>::type A;
    const int lane = threadIdx.x % WARP;
    const i64 per = blockDim.x / WARP;
    for (i64 r = (i64)blockIdx.x * per + threadIdx.x / WARP; r < rows; r += (i64)gridDim.x * per) {
        const i64 i = r % t, bh = r / t, b = bh / heads, h = bh % heads;
        const i64 at = b * t * c + i * c + h * d;
        A s = A(0);
        for (i64 x = lane; x < d; x += WARP) s += to_acc(g[at + x]) * to_acc(y[at + x]);
        s = warp_sum(s);
        if (lane == 0) dsum[r] = s;
    }
}

template <typename T, int DR>
__device__ __forceinline__ void flash_dq(i64 t, i64 heads, i64 c, i64 d, double scale_, const T* q, const T* k,
                                         const T* v, const T* g, const typename Acc<T>::type* lse,
                                         const typename Acc<T>::type* dsum, T* dq) {
    typedef typename Acc<T>::type A;
    const int RPW = BQ / ATT_WARPS;
    __shared__ A Qs[BQ][32 * DR];
    __shared__ A Gs[BQ][32 * DR];
    __shared__ A Ks[KT][32 * DR + 1];
    __shared__ A Vs[KT][32 * DR + 1];
    const A scale = A(scale_);
    const i64 bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const i64 base = b * t * c + h * d;
    const i64 q0 = (i64)blockIdx.x * BQ;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    load_rows<T, A, 32 * DR>(Qs, q, base, q0, BQ, t, c, d);
    load_rows<T, A, 32 * DR>(Gs, g, base, q0, BQ, t, c, d);
    A acc[RPW][DR], li[RPW], di[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const i64 i = q0 + w * RPW + rr;
        li[rr] = i < t ? lse[bh * t + i] : A(0);
        di[rr] = i < t ? dsum[bh * t + i] : A(0);
#pragma unroll
        for (int r = 0; r < DR; r++) acc[rr][r] = A(0);
    }
    const i64 kend = q0 + BQ < t ? q0 + BQ : t;
    for (i64 k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();
        load_rows<T, A, 32 * DR + 1>(Ks, k, base, k0, KT, t, c, d);
        load_rows<T, A, 32 * DR + 1>(Vs, v, base, k0, KT, t, c, d);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int row = w * RPW + rr;
            const i64 i = q0 + row;
            if (i >= t || k0 > i) continue;  // uniform over the warp
            const bool ok = k0 + lane <= i;
            A ds = A(0);
            if (ok) {
                const A p = t_exp(dot_rows(Qs[row], Ks[lane], d) * scale - li[rr]);
                ds = p * (dot_rows(Gs[row], Vs[lane], d) - di[rr]) * scale;
            }
            const int nk = (int)(i - k0 + 1 < KT ? i - k0 + 1 : KT);
            for (int jj = 0; jj < nk; jj++) {
                const A sj = __shfl_sync(FULL_MASK, ds, jj);
#pragma unroll
                for (int r = 0; r < DR; r++)
                    if (lane + 32 * r < d) acc[rr][r] += sj * Ks[jj][lane + 32 * r];
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const i64 i = q0 + w * RPW + rr;
        if (i >= t) continue;
#pragma unroll
        for (int r = 0; r < DR; r++)
            if (lane + 32 * r < d) dq[base + i * c + lane + 32 * r] = from_acc<T>(acc[rr][r]);
    }
}

template <typename T, int DR>
__device__ __forceinline__ void flash_dkv(i64 t, i64 heads, i64 c, i64 d, double scale_, const T* q, const T* k,
                                          const T* v, const T* g, const typename Acc<T>::type* lse,
                                          const typename Acc<T>::type* dsum, T* dk, T* dv) {
    typedef typename Acc<T>::type A;
    const int RPW = BQ / ATT_WARPS;      // query rows a warp scores per chunk
    const int KPW = KT / ATT_WARPS;      // keys a warp accumulates
    __shared__ A Ks[KT][32 * DR + 1];
    __shared__ A Vs[KT][32 * DR + 1];
    __shared__ A Qs[BQ][32 * DR];
    __shared__ A Gs[BQ][32 * DR];
    __shared__ A Ps[BQ][KT];
    __shared__ A Ss[BQ][KT];
    __shared__ A Ls[BQ], Ds[BQ];
    const A scale = A(scale_);
    const i64 bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const i64 base = b * t * c + h * d;
    const i64 k0 = (i64)blockIdx.x * KT;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    load_rows<T, A, 32 * DR + 1>(Ks, k, base, k0, KT, t, c, d);
    load_rows<T, A, 32 * DR + 1>(Vs, v, base, k0, KT, t, c, d);
    A ak[KPW][DR], av[KPW][DR];
#pragma unroll
    for (int jj = 0; jj < KPW; jj++)
#pragma unroll
        for (int r = 0; r < DR; r++) ak[jj][r] = av[jj][r] = A(0);
    // Queries before the tile's first key attend to none of its keys.
    for (i64 i0 = k0; i0 < t; i0 += BQ) {
        __syncthreads();  // the previous chunk is no longer read
        load_rows<T, A, 32 * DR>(Qs, q, base, i0, BQ, t, c, d);
        load_rows<T, A, 32 * DR>(Gs, g, base, i0, BQ, t, c, d);
        if (threadIdx.x < BQ) {
            const i64 i = i0 + threadIdx.x;
            Ls[threadIdx.x] = i < t ? lse[bh * t + i] : A(0);
            Ds[threadIdx.x] = i < t ? dsum[bh * t + i] : A(0);
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int row = w * RPW + rr;
            const i64 i = i0 + row, j = k0 + lane;
            A p = A(0), ds = A(0);
            if (i < t && j <= i) {
                p = t_exp(dot_rows(Qs[row], Ks[lane], d) * scale - Ls[row]);
                ds = p * (dot_rows(Gs[row], Vs[lane], d) - Ds[row]) * scale;
            }
            Ps[row][lane] = p;
            Ss[row][lane] = ds;
        }
        __syncthreads();
        for (int row = 0; row < BQ; row++) {
#pragma unroll
            for (int jj = 0; jj < KPW; jj++) {
                const A p = Ps[row][w * KPW + jj], ds = Ss[row][w * KPW + jj];
#pragma unroll
                for (int r = 0; r < DR; r++) {
                    if (lane + 32 * r < d) {
                        av[jj][r] += p * Gs[row][lane + 32 * r];
                        ak[jj][r] += ds * Qs[row][lane + 32 * r];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int jj = 0; jj < KPW; jj++) {
        const i64 j = k0 + w * KPW + jj;
        if (j >= t) continue;
#pragma unroll
        for (int r = 0; r < DR; r++) {
            if (lane + 32 * r < d) {
                dk[base + j * c + lane + 32 * r] = from_acc<T>(ak[jj][r]);
                dv[base + j * c + lane + 32 * r] = from_acc<T>(av[jj][r]);
            }
        }
    }
}

// The tensor-core backward of f16 and bf16 (sm_80 and newer), in the
// manner of FlashAttention-2's: the same two kernels as the scalar
// backward (one for dq, one for dk and dv, so each gradient is summed in
// one fixed order and the bits repeat; atomics into an f32 dq would add a
// [B, T, C] f32 scratch and an order that changes from run to run), every
// product as mma.sync m16n8k16 with f32 accumulators and fragments from
// ldmatrix (.trans where the product's reduction runs down a tile's rows).
// P and dS are rounded to T before their products, as the forward's P is,
// two values an instruction by the packed cvt; the scale is applied once
// to the finished dq and dk rather than to every dS.
//   flash_dq_tc_SUFFIX_DR: as flash_dq_SUFFIX_DR, grid (ceil(T / TQ), B * H).
//       A warp takes 16 query rows (Q's and dO's fragments in registers)
//       and streams KT-key tiles: S = Q K^T and dP = dO V^T (B fragments
//       from the K and V tiles), dS = P (dP - dsum) repacked as the A
//       operand of dq += dS K (K's fragments transposed).
//   flash_dkv_tc_SUFFIX_DR: as flash_dkv_SUFFIX_DR, grid (ceil(T / TK), B * H).
//       A warp takes 16 keys (K's and V's fragments in registers) and
//       streams QC-query chunks, computing the transposes: S^T = K Q^T and
//       dP^T = V dO^T, so that P^T and dS^T are, as accumulators, the A
//       operands of dv += P^T dO and dk += dS^T Q (dO and Q transposed).
// Each kernel's tiles share one buffer of 2 TQ rows: the fragments kept in
// registers are read from it first, then it holds the streamed tiles (for
// DR 4, 34 KiB rather than 52 under the static 48 KiB).
#define TK 64  // keys a tensor-core dk/dv block (16 a warp)
#define QC 32  // query rows a chunk of the tensor-core dk/dv kernel

// T's values of (lo, hi) packed as one 32-bit word, lo in the low half.
__device__ __forceinline__ unsigned tc_pack2(float lo, float hi, tapir_f16) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned tc_pack2(float lo, float hi, tapir_bf16) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The accumulators of two 8-column blocks (16 columns) as an A fragment.
template <typename T> __device__ __forceinline__ void tc_afrag(unsigned (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = tc_pack2(lo[0], lo[1], T());
    a[1] = tc_pack2(lo[2], lo[3], T());
    a[2] = tc_pack2(hi[0], hi[1], T());
    a[3] = tc_pack2(hi[2], hi[3], T());
}

// acc[W / 8][4] += P (16 x N, accumulators p rounded to T) times the N rows
// of tile s (s[k][channel] as B, transposed by ldmatrix): the O += P V form.
template <typename T, int W, int N, int S>
__device__ __forceinline__ void tc_acc_rows(float (&acc)[W / 8][4], const float (&p)[N / 8][4], const u16 (*s)[S],
                                            int lane) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        unsigned pa[4];
        tc_afrag<T>(pa, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int nd = 0; nd < W / 8; nd += 2) {
            unsigned f[4];
            tc_ldsm_x4_trans(f, &s[kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)][nd * 8 + 8 * (lane / 16)]);
            tc_mma(acc[nd], pa, f[0], f[1], T());
            tc_mma(acc[nd + 1], pa, f[2], f[3], T());
        }
    }
}

// Writes a warp's 16 x W accumulators (scaled by mul) to rows r0.. of x.
template <typename T, int W>
__device__ __forceinline__ void tc_store(T* x, const float (&acc)[W / 8][4], float mul, i64 base, i64 r0, i64 t, i64 c,
                                         i64 d, int lane) {
    const int g = lane / 4, tq = lane % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const i64 i = r0 + g + 8 * r;
        if (i >= t) continue;
#pragma unroll
        for (int nd = 0; nd < W / 8; nd++) {
            const i64 col = nd * 8 + 2 * tq;
            if (col < d) x[base + i * c + col] = from_acc<T>(acc[nd][2 * r] * mul);
            if (col + 1 < d) x[base + i * c + col + 1] = from_acc<T>(acc[nd][2 * r + 1] * mul);
        }
    }
}

template <typename T, int DR>
__device__ __forceinline__ void flash_dq_tc(i64 t, i64 heads, i64 c, i64 d, double scale_, const T* q, const T* k,
                                            const T* v, const T* g, const float* lse, const float* dsum, T* dq) {
#if __CUDA_ARCH__ >= 800
    const int W = 32 * DR, S = W + 8;
    __shared__ __align__(16) u16 buf[2 * TQ][S];
    u16(*Ks)[S] = buf;
    u16(*Vs)[S] = buf + KT;
    const float scale = (float)scale_;
    const i64 bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const i64 base = b * t * c + h * d;
    const i64 q0 = (i64)blockIdx.x * TQ;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, gr = lane / 4, tq = lane % 4;
    const bool vec = d % 8 == 0 && c % 8 == 0 && ((u64)q & 15) == 0 && ((u64)k & 15) == 0 && ((u64)v & 15) == 0 &&
                     ((u64)g & 15) == 0;
    const i64 r0 = q0 + w * 16;
    tc_load<T, TQ, W, S>(buf, q, base, q0, t, c, d, vec);
    tc_load<T, TQ, W, S>(buf + TQ, g, base, q0, t, c, d, vec);
    __syncthreads();
    unsigned qf[W / 16][4], gf[W / 16][4];
#pragma unroll
    for (int ks = 0; ks < W / 16; ks++) {
        tc_ldsm_x4(qf[ks], &buf[w * 16 + lane % 16][ks * 16 + 8 * (lane / 16)]);
        tc_ldsm_x4(gf[ks], &buf[TQ + w * 16 + lane % 16][ks * 16 + 8 * (lane / 16)]);
    }
    float li[2], di[2];  // rows gr, gr + 8
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const i64 i = r0 + gr + 8 * r;
        li[r] = i < t ? lse[bh * t + i] : 0.f;
        di[r] = i < t ? dsum[bh * t + i] : 0.f;
    }
    float acc[W / 8][4];
#pragma unroll
    for (int nd = 0; nd < W / 8; nd++) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.f;
    const i64 kend = q0 + TQ < t ? q0 + TQ : t;
    for (i64 k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();  // the fragments, or the previous tile, are read
        tc_load<T, KT, W, S>(Ks, k, base, k0, t, c, d, vec);
        tc_load<T, KT, W, S>(Vs, v, base, k0, t, c, d, vec);
        __syncthreads();
        if (r0 >= t || k0 > r0 + 15) continue;  // uniform over the warp
        float s[KT / 8][4], dp[KT / 8][4];
        tc_rows_t<T, W, KT, S>(s, qf, Ks, lane);
        tc_rows_t<T, W, KT, S>(dp, gf, Vs, lane);
#pragma unroll
        for (int nb = 0; nb < KT / 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const i64 j = k0 + nb * 8 + 2 * tq + (e & 1), i = r0 + gr + 8 * (e >> 1);
                const float p = j <= i && i < t ? t_exp(s[nb][e] * scale - li[e >> 1]) : 0.f;
                s[nb][e] = p * (dp[nb][e] - di[e >> 1]);  // dS / scale
            }
        }
        tc_acc_rows<T, W, KT, S>(acc, s, Ks, lane);
    }
    tc_store<T, W>(dq, acc, scale, base, r0, t, c, d, lane);
#endif
}

template <typename T, int DR>
__device__ __forceinline__ void flash_dkv_tc(i64 t, i64 heads, i64 c, i64 d, double scale_, const T* q, const T* k,
                                             const T* v, const T* g, const float* lse, const float* dsum, T* dk,
                                             T* dv) {
#if __CUDA_ARCH__ >= 800
    const int W = 32 * DR, S = W + 8;
    __shared__ __align__(16) u16 buf[2 * TK][S];
    __shared__ float Ls[QC], Ds[QC];
    u16(*Qs)[S] = buf;
    u16(*Gs)[S] = buf + QC;
    const float scale = (float)scale_;
    const i64 bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const i64 base = b * t * c + h * d;
    const i64 k0 = (i64)blockIdx.x * TK;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, gr = lane / 4, tq = lane % 4;
    const bool vec = d % 8 == 0 && c % 8 == 0 && ((u64)q & 15) == 0 && ((u64)k & 15) == 0 && ((u64)v & 15) == 0 &&
                     ((u64)g & 15) == 0;
    const i64 j0 = k0 + w * 16;  // the warp's first key
    tc_load<T, TK, W, S>(buf, k, base, k0, t, c, d, vec);
    tc_load<T, TK, W, S>(buf + TK, v, base, k0, t, c, d, vec);
    __syncthreads();
    unsigned kf[W / 16][4], vf[W / 16][4];
#pragma unroll
    for (int ks = 0; ks < W / 16; ks++) {
        tc_ldsm_x4(kf[ks], &buf[w * 16 + lane % 16][ks * 16 + 8 * (lane / 16)]);
        tc_ldsm_x4(vf[ks], &buf[TK + w * 16 + lane % 16][ks * 16 + 8 * (lane / 16)]);
    }
    float ak[W / 8][4], av[W / 8][4];
#pragma unroll
    for (int nd = 0; nd < W / 8; nd++) {
        ak[nd][0] = ak[nd][1] = ak[nd][2] = ak[nd][3] = 0.f;
        av[nd][0] = av[nd][1] = av[nd][2] = av[nd][3] = 0.f;
    }
    // Queries before the block's first key attend to none of its keys.
    for (i64 i0 = k0; i0 < t; i0 += QC) {
        __syncthreads();  // the fragments, or the previous chunk, are read
        tc_load<T, QC, W, S>(Qs, q, base, i0, t, c, d, vec);
        tc_load<T, QC, W, S>(Gs, g, base, i0, t, c, d, vec);
        if (threadIdx.x < QC) {
            const i64 i = i0 + threadIdx.x;
            Ls[threadIdx.x] = i < t ? lse[bh * t + i] : 0.f;
            Ds[threadIdx.x] = i < t ? dsum[bh * t + i] : 0.f;
        }
        __syncthreads();
        if (j0 >= t || i0 + QC - 1 < j0) continue;  // uniform: no query of the chunk sees a key of the warp
        float s[QC / 8][4], dp[QC / 8][4];  // S^T and dP^T: rows keys, columns queries
        tc_rows_t<T, W, QC, S>(s, kf, Qs, lane);
        tc_rows_t<T, W, QC, S>(dp, vf, Gs, lane);
#pragma unroll
        for (int nb = 0; nb < QC / 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = nb * 8 + 2 * tq + (e & 1);
                const i64 i = i0 + col, j = j0 + gr + 8 * (e >> 1);
                const float p = j <= i && i < t ? t_exp(s[nb][e] * scale - Ls[col]) : 0.f;
                s[nb][e] = p;
                dp[nb][e] = p * (dp[nb][e] - Ds[col]);  // dS^T / scale
            }
        }
        tc_acc_rows<T, W, QC, S>(av, s, Gs, lane);
        tc_acc_rows<T, W, QC, S>(ak, dp, Qs, lane);
    }
    tc_store<T, W>(dk, ak, scale, base, j0, t, c, d, lane);
    tc_store<T, W>(dv, av, 1.f, base, j0, t, c, d, lane);
#endif
}

#define FLASH_KERNELS(T, SUFFIX, DR)                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                    \
        flash_fwd_##SUFFIX##_##DR(i64 t, i64 heads, i64 c, i64 d, double scale, const T* q, const T* k,           \
                                  const T* v, T* y, Acc<T>::type* lse) {                                         \
        flash_fwd<T, DR>(t, heads, c, d, scale, q, k, v, y, lse);                                                \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                    \
        flash_dq_##SUFFIX##_##DR(i64 t, i64 heads, i64 c, i64 d, double scale, const T* q, const T* k,            \
                                 const T* v, const T* g, const Acc<T>::type* lse, const Acc<T>::type* dsum,     \
                                 T* dq) {                                                                         \
        flash_dq<T, DR>(t, heads, c, d, scale, q, k, v, g, lse, dsum, dq);                                       \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                    \
        flash_dkv_##SUFFIX##_##DR(i64 t, i64 heads, i64 c, i64 d, double scale, const T* q, const T* k,           \
                                  const T* v, const T* g, const Acc<T>::type* lse, const Acc<T>::type* dsum,    \
                                  T* dk, T* dv) {                                                                \
        flash_dkv<T, DR>(t, heads, c, d, scale, q, k, v, g, lse, dsum, dk, dv);                                  \
    }

#define FLASH_PREP(T, SUFFIX)                                                                                     \
    extern "C" __global__ void flash_prep_##SUFFIX(i64 rows, i64 t, i64 heads, i64 c, i64 d, const T* g,          \
                                                   const T* y, Acc<T>::type* dsum) {                             \
        flash_prep<T>(rows, t, heads, c, d, g, y, dsum);                                                         \
    }

#define FLASH_ALL(T, SUFFIX) \
    FLASH_KERNELS(T, SUFFIX, 1) FLASH_KERNELS(T, SUFFIX, 2) FLASH_KERNELS(T, SUFFIX, 4) FLASH_PREP(T, SUFFIX)

// Compiled for every architecture (empty below sm_80, where the host does
// not launch them: it picks them by the device's compute capability).
#define FLASH_TC(T, SUFFIX, DR)                                                                                   \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                    \
        flash_fwd_tc_##SUFFIX##_##DR(i64 t, i64 heads, i64 c, i64 d, double scale, const T* q, const T* k,        \
                                     const T* v, T* y, float* lse) {                                             \
        flash_fwd_tc<T, DR>(t, heads, c, d, scale, q, k, v, y, lse);                                             \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                    \
        flash_dq_tc_##SUFFIX##_##DR(i64 t, i64 heads, i64 c, i64 d, double scale, const T* q, const T* k,         \
                                    const T* v, const T* g, const float* lse, const float* dsum, T* dq) {        \
        flash_dq_tc<T, DR>(t, heads, c, d, scale, q, k, v, g, lse, dsum, dq);                                    \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                    \
        flash_dkv_tc_##SUFFIX##_##DR(i64 t, i64 heads, i64 c, i64 d, double scale, const T* q, const T* k,        \
                                     const T* v, const T* g, const float* lse, const float* dsum, T* dk, T* dv) { \
        flash_dkv_tc<T, DR>(t, heads, c, d, scale, q, k, v, g, lse, dsum, dk, dv);                               \
    }

FLASH_ALL(float, f32)
FLASH_ALL(tapir_f16, f16)
FLASH_ALL(tapir_bf16, bf16)
FLASH_TC(tapir_f16, f16, 1)
FLASH_TC(tapir_f16, f16, 2)
FLASH_TC(tapir_f16, f16, 4)
FLASH_TC(tapir_bf16, bf16, 1)
FLASH_TC(tapir_bf16, bf16, 2)
FLASH_TC(tapir_bf16, bf16, 4)
FLASH_KERNELS(double, f64, 1)
FLASH_KERNELS(double, f64, 2)
FLASH_PREP(double, f64)
