// Sparse cross-entropy on a contiguous [rows, v] block of logits: no
// one-hot, no softmax buffer.
//
// Forward, `ce_fwd_<dtype>(rows, v, x, bias, labels, ignore_index,
// smoothing, lse, loss, bad_row, valid)`: one block per row (grid-stride
// over rows), blockDim a multiple of 32. One pass over the row keeps an online
// (max, sum exp) per thread, and the row sum when label smoothing needs it;
// warp shuffles then shared memory merge them. Per row it writes
//   lse[r]  = log sum_j exp(x_j)                    (kept for the backward)
//   loss[r] = lse - (1 - eps) x_y - eps * sum_j x_j / v,   0 if ignored,
// both in the accumulation type, so a sum over rows is not rounded to
// f16 or bf16 row by row. A row holding +inf has a NaN lse, as on the CPU
// (its log-softmax is inf - inf).
// A label that is neither ignore_index nor in 0..v is an error: the kernel
// records the lowest such row in *bad_row as its complement ~row (the host
// zeroes the word before the launch, so 0 means none, and atomicMax keeps
// the lowest row) and the host turns it into Error::LabelOutOfRange, the
// error the CPU returns. *valid counts the non-ignored rows (for the mean),
// when not null. The host zeroes both words with one memset.
//
// Rows whose bytes are a multiple of 16, from a 16-byte aligned base (and
// bias), are read 16 bytes a thread at a time (Pack16 in common.cuh), and
// the backward writes them so, with the exponentials of term_exp; other
// rows element by element with expf.
//
// `bias` (v values, or null) is added to every row as it is read: the
// fused linear head passes its bias here, so a chunk of logits is the
// matmul's output alone and no second chunk-sized buffer holds the sum.
// The sum is rounded to the accumulation type, which for the head's
// compute dtype is the dtype itself, as the CPU's `logits + bias`.
//
// Backward, `ce_bwd_<dtype>(rows, v, x, bias, lse, labels, ignore_index,
// smoothing, g, g_stride, scale)`: overwrites the logits x (plus bias, as
// above) in place with
//   w_r * (exp(x - lse_r) - eps / v),   minus w_r * (1 - eps) at the label,
// where w_r = g[r * g_stride] * scale (g_stride 0 for a scalar upstream
// gradient; scale 1 / valid for the mean, 1 otherwise). Ignored rows become
// zero. Labels were checked by the forward.
//
// Offsets are 64-bit: rows * v may exceed 2^31 (N = 32768, V = 128256).
// lse is kept in the accumulation type (float for f32/f16/bf16).
//
// `ce_finish_<dtype>(rows, loss, kept, out)`, one block: the call's loss
// from the per-row losses, their sum in f64 (each thread a strided part,
// 16 bytes at a time, then the block's tree, a fixed order), divided by the count of kept rows
// for a mean (kept >= 0; NaN when it is 0; kept = -1 for a sum), rounded
// once to the loss dtype. It replaces the cast, sum, scale and cast
// launches a mean took before.
//
// `ce_scale_<dtype>(n0, x0, n1, x1, n2, x2, s)` scales up to three buffers
// in place (x_k *= s; n_k = 0 for none) in one launch, and
// `ce_bias_grad_<dtype>(rows, v, g, db)` adds the column sums of the
// [rows, v] block g to db (a thread per column, rows summed in the
// accumulation type): the fused linear head scales its gradients and
// accumulates its bias gradient chunk by chunk with no buffer beyond them.

// Whether a kernel over rows of v elements at x (and bias) may use
// 16-byte accesses throughout.
template <typename T> __device__ __forceinline__ bool rows_vectorizable(i64 v, const T* x, const T* bias) {
    return ((v * (i64)sizeof(T)) & 15) == 0 && aligned16(x) && (!bias || aligned16(bias));
}

// Pack k of a row of logits plus the bias (when not null), in the
// accumulation type: what both kernels' 16-byte paths read.
template <typename T>
__device__ __forceinline__ void logits_pack(const T* row, const T* bias, i64 k, typename Acc<T>::type* e) {
    Pack16<T>::unpack(((const uint4*)row)[k], e);
    if (bias) {
        typename Acc<T>::type b[Pack16<T>::N];
        Pack16<T>::unpack(((const uint4*)bias)[k], b);
#pragma unroll
        for (int i = 0; i < Pack16<T>::N; ++i) e[i] += b[i];
    }
}

template <typename T, typename L>
__device__ __forceinline__ void ce_fwd(i64 rows, i64 v, const T* x, const T* bias, const L* labels, i64 ignore_index,
                                       double smoothing, typename Acc<T>::type* lse_out, typename Acc<T>::type* loss_out,
                                       u64* bad_row, u64* valid) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    const bool smooth = smoothing > 0.0;
    const bool vec = rows_vectorizable(v, x, bias);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * v;
        Lse<A> st;
        st.m = neg_inf<A>();
        st.s = A(0);
        A sx = A(0);
        if (vec) {
            for (i64 k = threadIdx.x; k < v / N; k += blockDim.x) {
                A e[N];
                logits_pack(row, bias, k, e);
                st = lse_push_n<A, N>(st, e);
                if (smooth) {
#pragma unroll
                    for (int i = 0; i < N; ++i) sx += e[i];
                }
            }
        } else {
            for (i64 c = threadIdx.x; c < v; c += blockDim.x) {
                A e = to_acc(row[c]);
                if (bias) e += to_acc(bias[c]);
                st = lse_push(st, e);
                if (smooth) sx += e;
            }
        }
        st = block_lse(st);
        if (smooth) sx = block_reduce<0>(sx, A(0));
        if (threadIdx.x == 0) {
            A lse = lse_value(st);
            if (lse == pos_inf<A>()) lse = lse - lse;
            lse_out[r] = lse;
            i64 y = (i64)labels[r];
            A loss = A(0);
            if (y == ignore_index) {
                // ignored: loss 0, not counted
            } else if (y >= 0 && y < v) {
                A eps = (A)smoothing;
                A xy = to_acc(row[y]);
                if (bias) xy += to_acc(bias[y]);
                loss = lse - (A(1) - eps) * xy - eps * sx / (A)v;
                if (valid) atomicAdd(valid, 1ull);
            } else {
                atomicMax(bad_row, ~(u64)r);
            }
            loss_out[r] = loss;
        }
    }
}

template <typename T, typename L>
__device__ __forceinline__ void ce_bwd(i64 rows, i64 v, T* x, const T* bias, const typename Acc<T>::type* lse,
                                       const L* labels,
                                       i64 ignore_index, double smoothing, const T* g, i64 g_stride, double scale) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    const A eps_v = (A)(smoothing / (double)v);
    const A on = (A)(1.0 - smoothing);
    const bool vec = rows_vectorizable<T>(v, x, bias);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        T* row = x + r * v;
        uint4* row16 = (uint4*)row;
        i64 y = (i64)labels[r];
        if (y == ignore_index || y < 0 || y >= v) {
            if (vec) {
                for (i64 k = threadIdx.x; k < v / N; k += blockDim.x) row16[k] = make_uint4(0u, 0u, 0u, 0u);
            } else {
                for (i64 c = threadIdx.x; c < v; c += blockDim.x) row[c] = from_acc<T>(A(0));
            }
            continue;
        }
        A w = to_acc(g[r * g_stride]) * (A)scale;
        A l = lse[r];
        if (vec) {
            for (i64 k = threadIdx.x; k < v / N; k += blockDim.x) {
                A e[N];
                logits_pack(row, bias, k, e);
#pragma unroll
                for (int i = 0; i < N; ++i) e[i] = w * (term_exp(e[i] - l) - eps_v);
                const i64 at = y - k * N;  // the label's place in this pack, if it is here
                if (at >= 0 && at < N) {
#pragma unroll
                    for (int i = 0; i < N; ++i)
                        if (i == at) e[i] -= w * on;
                }
                row16[k] = Pack16<T>::pack(e);
            }
        } else {
            for (i64 c = threadIdx.x; c < v; c += blockDim.x) {
                A e = to_acc(row[c]);
                if (bias) e += to_acc(bias[c]);
                A d = w * (t_exp(e - l) - eps_v);
                if (c == y) d -= w * on;
                row[c] = from_acc<T>(d);
            }
        }
    }
}

// The call's loss from the per-row losses; one block (see the header).
template <typename T>
__device__ __forceinline__ void ce_finish(i64 rows, const typename Acc<T>::type* loss, i64 kept, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<A>::N;
    double s = 0.0;
    i64 head = 0;
    // 16 bytes a thread: one block keeps 4x the bytes in flight of 4-byte loads.
    if (aligned16(loss)) {
        head = rows / N * N;
        for (i64 q = threadIdx.x; q < rows / N; q += blockDim.x) {
            A v[Pack16<A>::N];
            Pack16<A>::unpack(((const uint4*)loss)[q], v);
            for (int u = 0; u < N; ++u) s += (double)v[u];
        }
    }
    for (i64 r = head + threadIdx.x; r < rows; r += blockDim.x) s += (double)loss[r];
    s = block_reduce<0>(s, 0.0);
    if (threadIdx.x == 0) {
        if (kept >= 0) s = kept == 0 ? quiet_nan<double>() : s / (double)kept;
        out[0] = from_acc<T>((typename Acc<T>::type)s);
    }
}

#define CE_KERNELS(T, SUFFIX, L, LSUFFIX)                                                                      \
    extern "C" __global__ void ce_fwd_##SUFFIX##_##LSUFFIX(i64 rows, i64 v, const T* x, const T* bias,         \
                                                            const L* labels, i64 ignore_index,                 \
                                                            double smoothing, Acc<T>::type* lse,               \
                                                            Acc<T>::type* loss, u64* bad_row, u64* valid) {    \
        ce_fwd<T, L>(rows, v, x, bias, labels, ignore_index, smoothing, lse, loss, bad_row, valid);            \
    }                                                                                                          \
    extern "C" __global__ void ce_bwd_##SUFFIX##_##LSUFFIX(i64 rows, i64 v, T* x, const T* bias,               \
                                                            const Acc<T>::type* lse, const L* labels,          \
                                                            i64 ignore_index, double smoothing, const T* g,    \
                                                            i64 g_stride, double scale) {                      \
        ce_bwd<T, L>(rows, v, x, bias, lse, labels, ignore_index, smoothing, g, g_stride, scale);              \
    }
#define CE_FINISH(T, SUFFIX)                                                                           \
    extern "C" __global__ void ce_finish_##SUFFIX(i64 rows, const Acc<T>::type* loss, i64 kept, T* out) {      \
        ce_finish<T>(rows, loss, kept, out);                                                               \
    }
CE_FINISH(float, f32)
CE_FINISH(double, f64)
CE_FINISH(tapir_f16, f16)
CE_FINISH(tapir_bf16, bf16)

#define CE_ALL(L, LSUFFIX)                       \
    CE_KERNELS(float, f32, L, LSUFFIX)           \
    CE_KERNELS(double, f64, L, LSUFFIX)          \
    CE_KERNELS(tapir_f16, f16, L, LSUFFIX)       \
    CE_KERNELS(tapir_bf16, bf16, L, LSUFFIX)

// x *= s in place: 16 bytes a thread when x is aligned (a fresh buffer
// always is), the few elements past the last whole unit one a thread.
template <typename T> __device__ void ce_scale(i64 n, T* x, double s_d) {
    typedef typename Acc<T>::type A;
    const A s = (A)s_d;
    const int N = Pack16<T>::N;
    i64 head = 0;
    if (aligned16(x)) {
        head = n / N * N;
        uint4* u = reinterpret_cast<uint4*>(x);
        for (i64 i = global_id(); i < n / N; i += global_stride()) {
            A e[N];
            Pack16<T>::unpack(u[i], e);
#pragma unroll
            for (int j = 0; j < N; ++j) e[j] = e[j] * s;
            u[i] = Pack16<T>::pack(e);
        }
    }
    for (i64 i = head + global_id(); i < n; i += global_stride()) x[i] = from_acc<T>(to_acc(x[i]) * s);
}

// Column sums of g [rows, v] added to db [v], for rows of whole 16-byte
// units on aligned bases: a block takes 32 units of columns (a warp's
// 512-byte row segment) and splits the rows among its 8 warps, each
// summing every 8th row in registers; the 8 partial sums meet in shared
// memory in warp order, so the result does not depend on scheduling.
// One thread a column (the plain kernel below) reads 2 or 4 bytes a lane,
// and a vocabulary of 32,000 gives it only 125 blocks.
#define BIAS_WARPS 8
template <typename T> __device__ void ce_bias_grad16(i64 rows, i64 v, const T* g, T* db) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    __shared__ A part[BIAS_WARPS][N][32];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const i64 units = v / N;
    for (i64 tile = blockIdx.x; tile * 32 < units; tile += gridDim.x) {
        const i64 unit = tile * 32 + lane;
        A acc[N];
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] = A(0);
        if (unit < units) {
            const uint4* col = reinterpret_cast<const uint4*>(g) + unit;
            for (i64 r = w; r < rows; r += BIAS_WARPS) {
                A e[N];
                Pack16<T>::unpack(col[r * units], e);
#pragma unroll
                for (int j = 0; j < N; ++j) acc[j] += e[j];
            }
        }
#pragma unroll
        for (int j = 0; j < N; ++j) part[w][j][lane] = acc[j];
        __syncthreads();
        if (w == 0 && unit < units) {
            for (int k = 1; k < BIAS_WARPS; ++k) {
#pragma unroll
                for (int j = 0; j < N; ++j) acc[j] += part[k][j][lane];
            }
            uint4* out = reinterpret_cast<uint4*>(db) + unit;
            A d[N];
            Pack16<T>::unpack(*out, d);
#pragma unroll
            for (int j = 0; j < N; ++j) d[j] = d[j] + acc[j];
            *out = Pack16<T>::pack(d);
        }
        __syncthreads();
    }
}

// The fused head's two or three gradients scaled in one launch: a launch
// each cost the model's 2 us apiece, more than the bias's and the hidden
// states' bytes take. Each buffer is grid-strided in turn.
template <typename T> __device__ void ce_scale3(i64 n0, T* x0, i64 n1, T* x1, i64 n2, T* x2, double s) {
    ce_scale<T>(n0, x0, s);
    ce_scale<T>(n1, x1, s);
    ce_scale<T>(n2, x2, s);
}

#define CE_INPLACE(T, SUFFIX)                                                                    \
    extern "C" __global__ void ce_scale_##SUFFIX(i64 n0, T* x0, i64 n1, T* x1, i64 n2, T* x2, double s) { \
        ce_scale3<T>(n0, x0, n1, x1, n2, x2, s);                                                 \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * BIAS_WARPS)                                \
        ce_bias_grad16_##SUFFIX(i64 rows, i64 v, const T* g, T* db) {                            \
        ce_bias_grad16<T>(rows, v, g, db);                                                       \
    }                                                                                            \
    extern "C" __global__ void ce_bias_grad_##SUFFIX(i64 rows, i64 v, const T* g, T* db) {      \
        typedef Acc<T>::type A;                                                                  \
        for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < v; j += (i64)gridDim.x * blockDim.x) { \
            A s = A(0);                                                                          \
            for (i64 r = 0; r < rows; ++r) s += to_acc(g[r * v + j]);                            \
            db[j] = from_acc<T>(to_acc(db[j]) + s);                                              \
        }                                                                                        \
    }
CE_INPLACE(float, f32)
CE_INPLACE(double, f64)
CE_INPLACE(tapir_f16, f16)
CE_INPLACE(tapir_bf16, bf16)

// Labels as i64 (torch's dtype) or i32.
CE_ALL(i64, i64)
CE_ALL(int, i32)
