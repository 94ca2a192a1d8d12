// softmax and log_softmax over the last axis of a contiguous [rows, cols]
// buffer (crates/tensor/src/ops/softmax.rs), one block per row
// (grid-stride over rows), blockDim a multiple of 32.
//
// One pass keeps an online (max, sum of exp(x - max)) per thread; warp
// shuffles, then shared memory, merge the pairs; a second pass writes
// exp(x - m) / s or x - (m + log s). f16/bf16 compute in float.

template <bool LOG, typename T>
__device__ __forceinline__ void softmax_rows(i64 rows, i64 cols, const T* x, T* out) {
    typedef typename Acc<T>::type A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * cols;
        T* orow = out + r * cols;
        Lse<A> st;
        st.m = neg_inf<A>();
        st.s = A(0);
        for (i64 c = threadIdx.x; c < cols; c += blockDim.x) st = lse_push(st, to_acc(row[c]));
        st = block_lse(st);
        if (LOG) {
            A lse = st.m + t_log(st.s);
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = from_acc<T>(to_acc(row[c]) - lse);
        } else {
            A inv = A(1) / st.s;
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x)
                orow[c] = from_acc<T>(t_exp(to_acc(row[c]) - st.m) * inv);
        }
    }
}

#define SOFTMAX_KERNEL(NAME, LOG, T, SUFFIX)                                                   \
    extern "C" __global__ void NAME##_##SUFFIX(i64 rows, i64 cols, const T* x, T* out) {       \
        softmax_rows<LOG, T>(rows, cols, x, out);                                              \
    }
#define SOFTMAX_ALL(NAME, LOG)                   \
    SOFTMAX_KERNEL(NAME, LOG, float, f32)        \
    SOFTMAX_KERNEL(NAME, LOG, double, f64)       \
    SOFTMAX_KERNEL(NAME, LOG, tapir_f16, f16)    \
    SOFTMAX_KERNEL(NAME, LOG, tapir_bf16, bf16)

SOFTMAX_ALL(softmax, false)
SOFTMAX_ALL(log_softmax, true)
