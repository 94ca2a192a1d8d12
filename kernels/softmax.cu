// softmax and log_softmax over the last axis of a contiguous [rows, cols]
// buffer (crates/tensor/src/ops/softmax.rs): a block per row, or a warp
// per row of at most SHORT_ROW elements (`row_split`), grid-strided,
// blockDim a multiple of 32; or, for many rows of at most 8 KiB, a warp
// per row held in registers (`softmax_warp_rows` below).
//
// One pass keeps an online (max, sum of exp(x - max)) per thread; warp
// shuffles, then shared memory, merge the pairs; a second pass writes
// exp(x - m) / s or (x - m) - log s. f16/bf16 compute in float.

// Rows a multiple of 16 bytes long, in 16-byte aligned buffers, are read
// and written 16 bytes a thread (Pack16) with term_exp's exponentials, the
// path of the cross-entropy kernels; other rows element by element.
template <bool LOG, typename T>
__device__ __forceinline__ void softmax_rows16(const RowSplit& sp, i64 cols, const T* row, T* orow) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    const uint4* in16 = (const uint4*)row;
    uint4* out16 = (uint4*)orow;
    Lse<A> st;
    st.m = neg_inf<A>();
    st.s = A(0);
    for (i64 k = sp.lane; k < cols / N; k += sp.width) {
        A v[N];
        Pack16<T>::unpack(in16[k], v);
        st = lse_push_n<A, N>(st, v);
    }
    st = sp.warp ? warp_lse(st) : block_lse(st);
    if (st.m == pos_inf<A>()) st.s = quiet_nan<A>();
    const A ls = t_log(st.s), inv = A(1) / st.s;
    for (i64 k = sp.lane; k < cols / N; k += sp.width) {
        A v[N];
        Pack16<T>::unpack(in16[k], v);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = LOG ? (v[i] - st.m) - ls : term_exp(v[i] - st.m) * inv;
        out16[k] = Pack16<T>::pack(v);
    }
}

template <bool LOG, typename T>
__device__ __forceinline__ void softmax_rows(i64 rows, i64 cols, const T* x, T* out) {
    typedef typename Acc<T>::type A;
    const RowSplit sp = row_split(cols);
    const bool vec = ((cols * (i64)sizeof(T)) & 15) == 0 && aligned16(x) && aligned16(out);
    for (i64 r = sp.first; r < rows; r += sp.step) {
        const T* row = x + r * cols;
        T* orow = out + r * cols;
        if (vec) {
            softmax_rows16<LOG, T>(sp, cols, row, orow);
            continue;
        }
        Lse<A> st;
        st.m = neg_inf<A>();
        st.s = A(0);
        for (i64 c = sp.lane; c < cols; c += sp.width) st = lse_push(st, to_acc(row[c]));
        st = sp.warp ? warp_lse(st) : block_lse(st);
        // As on the CPU (and in torch): a +inf maximum makes x - m NaN at
        // that entry, so the sum, and with it the whole row, is NaN. An all
        // -inf row is NaN too, through x - m = -inf - -inf.
        if (st.m == pos_inf<A>()) st.s = quiet_nan<A>();
        if (LOG) {
            // (x - m) - log s, not x - (m + log s): m + log s rounds to m's
            // ulp, which is 1e-3 for m = 1e4 in f32.
            A ls = t_log(st.s);
            for (i64 c = sp.lane; c < cols; c += sp.width) orow[c] = from_acc<T>((to_acc(row[c]) - st.m) - ls);
        } else {
            A inv = A(1) / st.s;
            for (i64 c = sp.lane; c < cols; c += sp.width)
                orow[c] = from_acc<T>(t_exp(to_acc(row[c]) - st.m) * inv);
        }
    }
}

#define SOFTMAX_KERNEL(NAME, LOG, T, SUFFIX)                                                   \
    extern "C" __global__ void NAME##_##SUFFIX(i64 rows, i64 cols, const T* x, T* out) {       \
        softmax_rows<LOG, T>(rows, cols, x, out);                                              \
    }
FOR_FLOATS(SOFTMAX_KERNEL, softmax, false)
FOR_FLOATS(SOFTMAX_KERNEL, log_softmax, true)

// A warp a row, the row in registers (WARP_ROW_UNITS, kernels/common.cuh):
// `softmax_warp_<dtype>` / `log_softmax_warp_<dtype>(rows, cols, x, out)`
// for rows of whole 16-byte units, at most 4 KiB, from 16-byte aligned x
// and out, when the rows fill the device (the host chooses). Each lane
// loads its units once; a pass over the registers takes the maximum
// (fmax, which skips NaN), shuffles merge it, a second pass sums
// term_exp(x - m), shuffles merge the sums, and a third writes exp(x - m)
// / s or (x - m) - log s from the registers: no shared memory, no barrier,
// no second read of the row. A NaN makes the sum, and so the row, NaN; an
// all -inf row is NaN through -inf - -inf; a +inf maximum makes the sum
// NaN as in softmax_rows.
//
// With BLOCK, a block a row (`softmax_block<U>_<dtype>` /
// `log_softmax_block<U>_<dtype>`): for fewer rows than fill the device,
// or rows past 4 KiB, the row's units spread over the block's threads (a power of two the
// host picks with U, at most 8 units a thread: rows up to 128 KiB), the
// same three passes, the maximum and the sum merged across the block by
// block_reduce (shared memory, barriers; a NaN maximum makes the row NaN
// as the NaN sum does).
template <bool BLOCK, bool LOG, typename T, int U>
__device__ __forceinline__ void softmax_reg_rows(i64 rows, i64 cols, const T* x, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    wrow_each<BLOCK, U>(rows, cols, x, [&](i64 r, const uint4(&u)[U], int lane, int width, int rem) {
        A m = neg_inf<A>();
        wrow_units<T>(u, width, rem, [&](int, A(&v)[N]) {
#pragma unroll
            for (int i = 0; i < N; ++i) m = fmax(m, v[i]);
        });
        m = BLOCK ? block_reduce<1>(m, neg_inf<A>()) : warp_fmax(m);
        A s = A(0);
        wrow_units<T>(u, width, rem, [&](int, A(&v)[N]) {
#pragma unroll
            for (int i = 0; i < N; ++i) s += term_exp(v[i] - m);
        });
        s = BLOCK ? block_reduce<0>(s, A(0)) : warp_sum(s);
        if (m == pos_inf<A>()) s = quiet_nan<A>();
        const A ls = LOG ? t_log(s) : A(0), inv = LOG ? A(0) : A(1) / s;
        uint4* orow = (uint4*)(out + r * cols);
        wrow_units<T>(u, width, rem, [&](int j, A(&v)[N]) {
#pragma unroll
            for (int i = 0; i < N; ++i) v[i] = LOG ? (v[i] - m) - ls : term_exp(v[i] - m) * inv;
            orow[lane + width * j] = Pack16<T>::pack(v);
        });
    });
}

template <bool LOG, typename T>
__device__ __forceinline__ void softmax_warp(i64 rows, i64 cols, const T* x, T* out) {
    const i64 units = cols / Pack16<T>::N;
// Rows of at most 4 KiB (U <= 8): longer ones take the block kernels
// (`block_reg_rows`), whose registers the U = 16 loop would otherwise set
// for every row of this kernel (128, 25% occupancy).
#define SOFTMAX_WARP_U(U)                                                             \
    do {                                                                              \
        if constexpr (U <= 8) softmax_reg_rows<false, LOG, T, U>(rows, cols, x, out); \
    } while (0)
    WROW_DISPATCH(units, WARP, SOFTMAX_WARP_U);
#undef SOFTMAX_WARP_U
}

#define SOFTMAX_WARP_KERNEL(NAME, LOG, T, SUFFIX)                                               \
    extern "C" __global__ void NAME##_warp_##SUFFIX(i64 rows, i64 cols, const T* x, T* out) {   \
        softmax_warp<LOG, T>(rows, cols, x, out);                                                \
    }
// The block kernels, one for each U (`softmax_block<U>_<dtype>`, U = 1, 2,
// 4, 8: the host picks it with the block size), so that each takes the
// registers of its own U, and at most 64 (a block of 1,024 threads).
#define SOFTMAX_BLOCK_KERNEL(NAME, LOG, U, T, SUFFIX)                                                     \
    extern "C" __global__ void __launch_bounds__(1024)                                                    \
        NAME##_block##U##_##SUFFIX(i64 rows, i64 cols, const T* x, T* out) {                              \
        softmax_reg_rows<true, LOG, T, U>(rows, cols, x, out);                                            \
    }
#define SOFTMAX_BLOCK_US(NAME, LOG, T, SUFFIX)    \
    SOFTMAX_BLOCK_KERNEL(NAME, LOG, 1, T, SUFFIX) \
    SOFTMAX_BLOCK_KERNEL(NAME, LOG, 2, T, SUFFIX) \
    SOFTMAX_BLOCK_KERNEL(NAME, LOG, 4, T, SUFFIX) \
    SOFTMAX_BLOCK_KERNEL(NAME, LOG, 8, T, SUFFIX)
FOR_FLOATS(SOFTMAX_WARP_KERNEL, softmax, false)
FOR_FLOATS(SOFTMAX_WARP_KERNEL, log_softmax, true)
FOR_FLOATS(SOFTMAX_BLOCK_US, softmax, false)
FOR_FLOATS(SOFTMAX_BLOCK_US, log_softmax, true)

// softmax(scale * x) of each row of a contiguous [rows, tk] buffer of
// scores [..., tq, tk], where row r is query i = r % tq and sees keys
// j <= i + (tk - tq) only (crates/nn's CausalSoftmax): the mask is this
// comparison, never a tensor, and the masked entries are written as exact
// zeros. The row split and reductions are softmax_rows'.
template <typename T>
__device__ __forceinline__ void causal_softmax_rows(i64 rows, i64 tk, i64 tq, double scale_, const T* x, T* out) {
    typedef typename Acc<T>::type A;
    const A scale = A(scale_);
    const RowSplit sp = row_split(tk);
    for (i64 r = sp.first; r < rows; r += sp.step) {
        const T* row = x + r * tk;
        T* orow = out + r * tk;
        const i64 i = r % tq;
        const i64 n = i + 1 + tk - tq < tk ? i + 1 + tk - tq : tk;
        Lse<A> st;
        st.m = neg_inf<A>();
        st.s = A(0);
        for (i64 c = sp.lane; c < n; c += sp.width) st = lse_push(st, to_acc(row[c]) * scale);
        st = sp.warp ? warp_lse(st) : block_lse(st);
        if (st.m == pos_inf<A>()) st.s = quiet_nan<A>();
        const A inv = A(1) / st.s;
        for (i64 c = sp.lane; c < tk; c += sp.width)
            orow[c] = from_acc<T>(c < n ? t_exp(to_acc(row[c]) * scale - st.m) * inv : A(0));
    }
}

#define CAUSAL_SOFTMAX_KERNEL(T, SUFFIX)                                                                    \
    extern "C" __global__ void causal_softmax_##SUFFIX(i64 rows, i64 tk, i64 tq, double scale, const T* x, \
                                                       T* out) {                                           \
        causal_softmax_rows<T>(rows, tk, tq, scale, x, out);                                               \
    }
CAUSAL_SOFTMAX_KERNEL(float, f32)
CAUSAL_SOFTMAX_KERNEL(double, f64)
CAUSAL_SOFTMAX_KERNEL(tapir_f16, f16)
CAUSAL_SOFTMAX_KERNEL(tapir_bf16, bf16)
