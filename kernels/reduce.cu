// Reductions (crates/tensor/src/ops/reduce.rs). The host first makes the
// reduced axes the last ones (or the leading ones, for column sums) of a
// contiguous buffer, so two shapes of kernel cover every axis set:
//
// - `<op>_last_<dtype>(rows, cols, x, out)`: out[r] = op over x[r, :], a
//   block per row, or a warp per row of at most SHORT_ROW elements
//   (`row_split`), grid-strided, blockDim a multiple of 32;
//   op is sum, max, min (NaN-propagating, as torch) or logsumexp. f16/bf16
//   accumulate in float, f32 in float, f64 in double. `sum_last_i32` and
//   `sum_last_i64` write i64 sums that wrap past 2^63, as the CPU's do.
//   Many rows of at most 8 KiB take `sum_warp_<dtype>` instead (below).
// - `sum_cols_<dtype>(rows, cols, x, out)`: out[c] = sum over r of x[r, c]
//   (the gradient of a broadcast bias), the block's threads counted flat
//   (t = threadIdx.y * blockDim.x + threadIdx.x, so a 1-D block of 256 or a
//   (32, k) block) a multiple of 32 and at most 1024: lane `t % 32` walks a
//   tile of 32 columns so loads coalesce, the warp `t / 32` a share of the
//   rows, and shared memory finishes the sum; the grid strides over tiles.
//   Many rows over few tiles split the rows too: `sum_cols_part_<dtype>(
//   rows, cols, part_rows, x, partial)` and `sum_cols_merge_<dtype>`.
// - A few long rows would leave most of the device idle with a block per
//   row, so they take two launches: `<op>_part_<dtype>(rows, cols, chunk,
//   x, partial)` reduces each chunk of `chunk` elements of a row, a block
//   a chunk, into `partial[rows, parts]` in the accumulation type (float,
//   or double for f64), and `<op>_merge_<dtype>(rows, parts, partial, out)`
//   reduces the partials of each row (the logsumexp of the chunks'
//   logsumexps is the row's).

// The running state of a row reduction of op K (ReduceKind's order: 0 sum,
// 1 max, 2 min, 3 logsumexp), so that one pair of loops below serves every
// op: `init` is the state of no elements, `push` takes one more, `warp` and
// `block` merge the states of a warp or of the block (every thread gets the
// result), and `value` is the reduction the state stands for.
template <int K, typename A> struct Fold {
    typedef A S;
    static __device__ __forceinline__ S init() { return K == 0 ? A(0) : (K == 1 ? neg_inf<A>() : pos_inf<A>()); }
    static __device__ __forceinline__ S push(S s, A x) { return combine<K>(s, x); }
    static __device__ __forceinline__ S warp(S s) { return warp_reduce<K>(s); }
    static __device__ __forceinline__ S block(S s) { return block_reduce<K>(s, init()); }
    static __device__ __forceinline__ A value(S s) { return s; }
};

// log(sum(exp(x))) in one pass of the online (max, sum) state softmax
// uses; -inf for an empty or all -inf row, the maximum when it is +inf or
// NaN, as on the CPU.
template <typename A> struct Fold<3, A> {
    typedef Lse<A> S;
    static __device__ __forceinline__ S init() {
        S s;
        s.m = neg_inf<A>();
        s.s = A(0);
        return s;
    }
    static __device__ __forceinline__ S push(S s, A x) { return lse_push(s, x); }
    static __device__ __forceinline__ S warp(S s) { return warp_lse(s); }
    static __device__ __forceinline__ S block(S s) { return block_lse(s); }
    static __device__ __forceinline__ A value(S s) { return lse_value(s); }
};

// The row reductions of op K. `last` reads TI and writes T, accumulating in
// T's accumulation type: TI = T for the row kernels, TI = that
// accumulation type for the merges. `part` reduces the chunks of long
// rows, a block each (see the header).
template <int K> struct RowReduce {
    template <typename TI, typename T>
    static __device__ __forceinline__ void last(i64 rows, i64 cols, const TI* x, T* out) {
        typedef Fold<K, typename Acc<T>::type> F;
        const int N = Pack16<TI>::N;
        const RowSplit s = row_split(cols);
        // Rows a multiple of 16 bytes from an aligned base: 16-byte loads.
        const bool vec = ((cols * (i64)sizeof(TI)) & 15) == 0 && aligned16(x);
        for (i64 r = s.first; r < rows; r += s.step) {
            const TI* row = x + r * cols;
            typename F::S st = F::init();
            if (vec) {
                for (i64 k = s.lane; k < cols / N; k += s.width) {
                    typename Acc<T>::type v[N];
                    Pack16<TI>::unpack(((const uint4*)row)[k], v);
#pragma unroll
                    for (int i = 0; i < N; ++i) st = F::push(st, v[i]);
                }
            } else {
                for (i64 c = s.lane; c < cols; c += s.width) st = F::push(st, to_acc(row[c]));
            }
            st = s.warp ? F::warp(st) : F::block(st);
            if (s.lane == 0) out[r] = from_acc<T>(F::value(st));
        }
    }

    template <typename T>
    static __device__ __forceinline__ void part(i64 rows, i64 cols, i64 chunk, const T* x, typename Acc<T>::type* out) {
        typedef Fold<K, typename Acc<T>::type> F;
        i64 parts = (cols + chunk - 1) / chunk;
        for (i64 b = blockIdx.x; b < rows * parts; b += gridDim.x) {
            const T* row = x + (b / parts) * cols;
            i64 start = (b % parts) * chunk, end = start + chunk < cols ? start + chunk : cols;
            typename F::S st = F::init();
            for (i64 c = start + threadIdx.x; c < end; c += blockDim.x) st = F::push(st, to_acc(row[c]));
            st = F::block(st);
            if (threadIdx.x == 0) out[b] = F::value(st);
        }
    }
};

// The three entry points of a reduction that may split its work over two
// launches, for element type T: LAST(rows, cols, x, out) in one launch,
// PART(rows, cols, n, x, partial) writing partials in the accumulation
// type, and MERGE(rows, cols, partial, out) reducing them. R's `last` and
// `part` do the work.
#define STAGED_KERNELS(R, LAST, PART, MERGE, T)                                                      \
    extern "C" __global__ void LAST(i64 rows, i64 cols, const T* x, T* out) {                        \
        R::last<T, T>(rows, cols, x, out);                                                           \
    }                                                                                                \
    extern "C" __global__ void PART(i64 rows, i64 cols, i64 n, const T* x, typename Acc<T>::type* out) { \
        R::part<T>(rows, cols, n, x, out);                                                           \
    }                                                                                                \
    extern "C" __global__ void MERGE(i64 rows, i64 cols, const typename Acc<T>::type* x, T* out) {    \
        R::last<typename Acc<T>::type, T>(rows, cols, x, out);                                       \
    }

#define ROW_KERNELS(NAME, K, T, SUFFIX) \
    STAGED_KERNELS(RowReduce<K>, NAME##_last_##SUFFIX, NAME##_part_##SUFFIX, NAME##_merge_##SUFFIX, T)
FOR_FLOATS(ROW_KERNELS, sum, 0)
FOR_FLOATS(ROW_KERNELS, max, 1)
FOR_FLOATS(ROW_KERNELS, min, 2)
FOR_FLOATS(ROW_KERNELS, logsumexp, 3)

// The sum of each row held in registers, a warp a row (WARP_ROW_UNITS,
// kernels/common.cuh): `sum_warp_<dtype>(rows, cols, x, out)` for rows of
// whole 16-byte units, at most 8 KiB, from a 16-byte aligned x, when the
// rows fill the device (the host chooses). Each lane adds its units in
// order, shuffles add the lanes' sums: no shared memory, no barrier.
template <typename T, int U>
__device__ __forceinline__ void sum_warp_rows(i64 rows, i64 cols, const T* x, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    wrow_each<false, U>(rows, cols, x, [&](i64 r, const uint4(&u)[U], int lane, int width, int rem) {
        A s = A(0);
        wrow_units<T>(u, width, rem, [&](int, A(&v)[N]) {
#pragma unroll
            for (int i = 0; i < N; ++i) s += v[i];
        });
        s = warp_sum(s);
        if (lane == 0) out[r] = from_acc<T>(s);
    });
}
template <typename T> __device__ __forceinline__ void sum_warp(i64 rows, i64 cols, const T* x, T* out) {
    const i64 units = cols / Pack16<T>::N;
#define SUM_WARP_U(U) sum_warp_rows<T, U>(rows, cols, x, out)
    WROW_DISPATCH(units, WARP, SUM_WARP_U);
#undef SUM_WARP_U
}
#define SUM_WARP_KERNEL(T, SUFFIX)                                                                 \
    extern "C" __global__ void sum_warp_##SUFFIX(i64 rows, i64 cols, const T* x, T* out) {         \
        sum_warp<T>(rows, cols, x, out);                                                           \
    }
SUM_WARP_KERNEL(float, f32)
SUM_WARP_KERNEL(double, f64)
SUM_WARP_KERNEL(tapir_f16, f16)
SUM_WARP_KERNEL(tapir_bf16, bf16)

// Integer sums in 64 bits. The adds are unsigned, so overflow wraps (as
// the CPU's wrapping_add) instead of being undefined.
template <typename T>
__device__ __forceinline__ void sum_int_last(i64 rows, i64 cols, const T* x, i64* out) {
    __shared__ u64 partial[WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const RowSplit s = row_split(cols);
    for (i64 r = s.first; r < rows; r += s.step) {
        const T* row = x + r * cols;
        u64 acc = 0;
        for (i64 c = s.lane; c < cols; c += s.width) acc += (u64)(i64)row[c];
        acc = warp_sum(acc);
        if (s.warp) {
            if (lane == 0) out[r] = (i64)acc;
            continue;
        }
        if (lane == 0) partial[warp] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 s = 0;
            for (int w = 0; w < (int)(blockDim.x / WARP); ++w) s += partial[w];
            out[r] = (i64)s;
        }
        __syncthreads();
    }
}

#define SUM_INT_KERNEL(T, SUFFIX)                                                                     \
    extern "C" __global__ void sum_last_##SUFFIX(i64 rows, i64 cols, const T* x, i64* out) {          \
        sum_int_last<T>(rows, cols, x, out);                                                          \
    }
SUM_INT_KERNEL(int, i32)
SUM_INT_KERNEL(i64, i64)

// The sum over rows [r0, r1) of the columns of tile `tile`, in the threads
// of the first warp (lane = column in the tile); every thread of the block
// calls it.
template <typename A, typename TI>
__device__ __forceinline__ A cols_tile_sum(i64 r0, i64 r1, i64 cols, i64 tile, const TI* x) {
    __shared__ A partial[1024];
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    int lane = t % WARP, group = t / WARP, groups = blockDim.x * blockDim.y / WARP;
    i64 c = tile * WARP + lane;
    A acc = A(0);
    if (c < cols) {
        for (i64 r = r0 + group; r < r1; r += groups) acc += to_acc(x[r * cols + c]);
    }
    partial[t] = acc;
    __syncthreads();
    A s = A(0);
    if (group == 0) {
        for (int k = 0; k < groups; ++k) s += partial[k * WARP + lane];
    }
    __syncthreads();
    return s;
}

// Column sums (see the header for the thread layout), in the form
// STAGED_KERNELS takes. `last` reads TI = T, or the accumulation
// type for the merge of partial sums. `part` serves many rows over few
// columns: each block sums `part_rows` rows of one tile into partial[part,
// c] (accumulation type), and the merge adds the parts, so that more than a
// few blocks share the rows.
struct ColSum {
    template <typename TI, typename T>
    static __device__ __forceinline__ void last(i64 rows, i64 cols, const TI* x, T* out) {
        typedef typename Acc<T>::type A;
        int t = threadIdx.y * blockDim.x + threadIdx.x;
        for (i64 tile = blockIdx.x; tile * WARP < cols; tile += gridDim.x) {
            A s = cols_tile_sum<A>(0, rows, cols, tile, x);
            i64 c = tile * WARP + t % WARP;
            if (t < WARP && c < cols) out[c] = from_acc<T>(s);
        }
    }

    template <typename T>
    static __device__ __forceinline__ void part(i64 rows, i64 cols, i64 part_rows, const T* x, typename Acc<T>::type* out) {
        typedef typename Acc<T>::type A;
        int t = threadIdx.y * blockDim.x + threadIdx.x;
        i64 tiles = (cols + WARP - 1) / WARP, parts = (rows + part_rows - 1) / part_rows;
        for (i64 b = blockIdx.x; b < tiles * parts; b += gridDim.x) {
            i64 tile = b % tiles, part = b / tiles;
            i64 r0 = part * part_rows, r1 = r0 + part_rows < rows ? r0 + part_rows : rows;
            A s = cols_tile_sum<A>(r0, r1, cols, tile, x);
            i64 c = tile * WARP + t % WARP;
            if (t < WARP && c < cols) out[part * cols + c] = s;
        }
    }
};

#define COL_KERNELS(NAME, T, SUFFIX) \
    STAGED_KERNELS(ColSum, NAME##_##SUFFIX, NAME##_part_##SUFFIX, NAME##_merge_##SUFFIX, T)
FOR_FLOATS(COL_KERNELS, sum_cols)

// argmax / argmin over the last axis, i64 indices; the first occurrence
// wins and NaN counts as the extreme, like torch and the CPU.

// Whether the candidate (ov, oi) beats (best, bi): a NaN first, then the
// extreme, then the lower index; `none` marks "no element yet".
template <bool MIN, typename A>
__device__ __forceinline__ bool arg_beats(A ov, i64 oi, A best, i64 bi, i64 none) {
    if (oi == none) return false;
    if (bi == none) return true;
    if (t_isnan(ov)) return !t_isnan(best) || oi < bi;
    if (t_isnan(best)) return false;
    return (MIN ? ov < best : ov > best) || (ov == best && oi < bi);
}

template <bool MIN, typename T>
__device__ __forceinline__ void arg_last(i64 rows, i64 cols, const T* x, i64* out) {
    typedef typename Acc<T>::type A;
    __shared__ A sv[WARP];
    __shared__ i64 si[WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const RowSplit s = row_split(cols);
    for (i64 r = s.first; r < rows; r += s.step) {
        const T* row = x + r * cols;
        A best = MIN ? pos_inf<A>() : neg_inf<A>();
        i64 bi = cols;  // "none yet"
        // Each thread's columns rise, so a later one wins only when strictly better.
        for (i64 c = s.lane; c < cols; c += s.width) {
            A v = to_acc(row[c]);
            if (arg_beats<MIN>(v, c, best, bi, cols)) {
                best = v;
                bi = c;
            }
        }
        for (int o = WARP / 2; o > 0; o /= 2) {
            A ov = __shfl_xor_sync(FULL_MASK, best, o);
            i64 oi = __shfl_xor_sync(FULL_MASK, bi, o);
            if (arg_beats<MIN>(ov, oi, best, bi, cols)) {
                best = ov;
                bi = oi;
            }
        }
        if (s.warp) {
            if (lane == 0) out[r] = bi == cols ? 0 : bi;
            continue;
        }
        if (lane == 0) {
            sv[warp] = best;
            si[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < (int)(blockDim.x / WARP); ++w) {
                if (arg_beats<MIN>(sv[w], si[w], best, bi, cols)) {
                    best = sv[w];
                    bi = si[w];
                }
            }
            out[r] = bi == cols ? 0 : bi;
        }
        __syncthreads();
    }
}

#define ARG_KERNEL(NAME, MIN, T, SUFFIX)                                                          \
    extern "C" __global__ void NAME##_last_##SUFFIX(i64 rows, i64 cols, const T* x, i64* out) {   \
        arg_last<MIN, T>(rows, cols, x, out);                                                     \
    }
FOR_FLOATS(ARG_KERNEL, argmax, false)
FOR_FLOATS(ARG_KERNEL, argmin, true)
