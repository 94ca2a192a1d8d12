// Reductions (crates/tensor/src/ops/reduce.rs). The host first makes the
// reduced axes the last ones (or the leading ones, for column sums) of a
// contiguous buffer, so two shapes of kernel cover every axis set:
//
// - `<op>_last_<dtype>(rows, cols, x, out)`: out[r] = op over x[r, :], one
//   block per row (grid-stride over rows), blockDim a multiple of 32;
//   op is sum, max or min (NaN-propagating, as torch). f16/bf16 accumulate
//   in float, f32 in float, f64 in double.
// - `sum_cols_<dtype>(rows, cols, x, out)`: out[c] = sum over r of x[r, c]
//   (the gradient of a broadcast bias), with blockDim (32, k): threadIdx.x
//   walks columns so loads coalesce, threadIdx.y walks rows, and a shared
//   array finishes the sum.

template <int K, typename T>
__device__ __forceinline__ void reduce_last(i64 rows, i64 cols, const T* x, T* out) {
    typedef typename Acc<T>::type A;
    const A identity = K == 0 ? A(0) : (K == 1 ? neg_inf<A>() : pos_inf<A>());
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * cols;
        A acc = identity;
        for (i64 c = threadIdx.x; c < cols; c += blockDim.x) acc = combine<K>(acc, to_acc(row[c]));
        acc = block_reduce<K>(acc, identity);
        if (threadIdx.x == 0) out[r] = from_acc<T>(acc);
    }
}

#define REDUCE_KERNEL(NAME, K, T, SUFFIX)                                                      \
    extern "C" __global__ void NAME##_last_##SUFFIX(i64 rows, i64 cols, const T* x, T* out) { \
        reduce_last<K, T>(rows, cols, x, out);                                                 \
    }
#define REDUCE_ALL(NAME, K)                   \
    REDUCE_KERNEL(NAME, K, float, f32)        \
    REDUCE_KERNEL(NAME, K, double, f64)       \
    REDUCE_KERNEL(NAME, K, tapir_f16, f16)    \
    REDUCE_KERNEL(NAME, K, tapir_bf16, bf16)

REDUCE_ALL(sum, 0)
REDUCE_ALL(max, 1)
REDUCE_ALL(min, 2)

// Column sums; blockDim.x must be 32 and blockDim.x * blockDim.y <= 1024.
template <typename T>
__device__ __forceinline__ void sum_cols(i64 rows, i64 cols, const T* x, T* out) {
    typedef typename Acc<T>::type A;
    __shared__ A partial[1024];
    i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    A acc = A(0);
    if (c < cols) {
        for (i64 r = threadIdx.y; r < rows; r += blockDim.y) acc += to_acc(x[r * cols + c]);
    }
    partial[threadIdx.y * blockDim.x + threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        A s = A(0);
        for (unsigned k = 0; k < blockDim.y; ++k) s += partial[k * blockDim.x + threadIdx.x];
        out[c] = from_acc<T>(s);
    }
}

#define SUM_COLS_KERNEL(T, SUFFIX)                                                              \
    extern "C" __global__ void sum_cols_##SUFFIX(i64 rows, i64 cols, const T* x, T* out) {      \
        sum_cols<T>(rows, cols, x, out);                                                        \
    }
SUM_COLS_KERNEL(float, f32)
SUM_COLS_KERNEL(double, f64)
SUM_COLS_KERNEL(tapir_f16, f16)
SUM_COLS_KERNEL(tapir_bf16, bf16)

// argmax / argmin over the last axis, i64 indices; the first occurrence
// wins and NaN counts as the extreme, like torch and the CPU.
template <bool MIN, typename T>
__device__ __forceinline__ void arg_last(i64 rows, i64 cols, const T* x, i64* out) {
    typedef typename Acc<T>::type A;
    __shared__ A sv[WARP];
    __shared__ i64 si[WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * cols;
        A best = MIN ? pos_inf<A>() : neg_inf<A>();
        i64 bi = cols;  // "none yet"; loses every comparison below
        for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
            A v = to_acc(row[c]);
            bool better = bi == cols || (!t_isnan(best) && (t_isnan(v) || (MIN ? v < best : v > best)));
            if (better) {
                best = v;
                bi = c;
            }
        }
        // (value, index) pairs: prefer NaN, then the extreme, then the lower index.
        for (int o = WARP / 2; o > 0; o /= 2) {
            A ov = __shfl_xor_sync(FULL_MASK, best, o);
            i64 oi = __shfl_xor_sync(FULL_MASK, bi, o);
            bool take = oi != cols && (bi == cols ||
                                       (t_isnan(ov) && (!t_isnan(best) || oi < bi)) ||
                                       (!t_isnan(best) && !t_isnan(ov) && ((MIN ? ov < best : ov > best) || (ov == best && oi < bi))));
            if (take) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            sv[warp] = best;
            si[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < (int)(blockDim.x / WARP); ++w) {
                A ov = sv[w];
                i64 oi = si[w];
                bool take = oi != cols && (bi == cols ||
                                           (t_isnan(ov) && (!t_isnan(best) || oi < bi)) ||
                                           (!t_isnan(best) && !t_isnan(ov) && ((MIN ? ov < best : ov > best) || (ov == best && oi < bi))));
                if (take) {
                    best = ov;
                    bi = oi;
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
ARG_KERNEL(argmax, false, float, f32)
ARG_KERNEL(argmax, false, double, f64)
ARG_KERNEL(argmax, false, tapir_f16, f16)
ARG_KERNEL(argmax, false, tapir_bf16, bf16)
ARG_KERNEL(argmin, true, float, f32)
ARG_KERNEL(argmin, true, double, f64)
ARG_KERNEL(argmin, true, tapir_f16, f16)
ARG_KERNEL(argmin, true, tapir_bf16, bf16)
