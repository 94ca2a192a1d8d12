// Elementwise ops over strided, broadcast operands (crates/tensor/src/ops/
// unary.rs and binary.rs). The output is contiguous with `n` elements.
//
// Unary kernels: `<op>_<dtype>(n, ndim, info, x, x_offset, p0, p1, out)`;
// `info` holds dims[ndim] then x_strides[ndim] (device memory), or is null
// when x is contiguous from `x_offset`. `p0`/`p1` carry the scalar of
// powf/add_scalar/mul_scalar and clamp's bounds; other ops ignore them.
//
// Binary kernels: `<op>_<dtype>(n, ndim, info, a, a_offset, b, b_offset, out)`;
// `info` holds dims[ndim], a_strides[ndim], b_strides[ndim] (0 on broadcast
// axes), or is null when both are contiguous with the output's shape.
//
// Derivative kernels `<op>_bwd_<dtype>(n, ndim, info, x, x_offset, g,
// g_offset, out)` fuse the first-order derivative the CPU fuses (gelu and
// gelu_tanh take x; relu, tanh and sigmoid the output y: cuda/unary.rs).

#define SQRT_2_OVER_PI 0.7978845608028654
#define GELU_C 0.044715
#define FRAC_1_SQRT_2 0.7071067811865476
#define FRAC_1_SQRT_2PI 0.3989422804014327

__device__ __forceinline__ float t_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double t_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float t_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double t_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float t_sin(float x) { return sinf(x); }
__device__ __forceinline__ double t_sin(double x) { return sin(x); }
__device__ __forceinline__ float t_cos(float x) { return cosf(x); }
__device__ __forceinline__ double t_cos(double x) { return cos(x); }
__device__ __forceinline__ float t_erf(float x) { return erff(x); }
__device__ __forceinline__ double t_erf(double x) { return erf(x); }
__device__ __forceinline__ float t_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ float t_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double t_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float t_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double t_expm1(double x) { return expm1(x); }
__device__ __forceinline__ double t_pow(double x, double y) { return pow(x, y); }

// d/dx gelu_tanh, as in unary.rs.
template <typename A> __device__ __forceinline__ A gelu_tanh_grad(A x) {
    A k = A(SQRT_2_OVER_PI), gc = A(GELU_C), k3 = A(3.0 * GELU_C * SQRT_2_OVER_PI), half = A(0.5);
    A x2 = x * x;
    A t = t_tanh(k * x * (A(1) + gc * x2));
    return half * (A(1) + t) + half * x * (A(1) - t * t) * (k + k3 * x2);
}

// The dense calls (info null) of the unary and binary kernels run 16 bytes
// a thread when their operands are 16-byte aligned (Pack16): for bf16 and
// f16 that is eight elements a load instead of one, the difference between
// a third of HBM's bandwidth and all of it on the H200 model. The last
// n % N elements, and unaligned operands, go element by element.
template <typename T, typename F>
__device__ __forceinline__ bool unary_dense16(i64 n, const T* x, typename Acc<T>::type q0,
                                              typename Acc<T>::type q1, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    if (!aligned16(x) || !aligned16(out)) return false;
    F f;
    const i64 packs = n / N;
    for (i64 k = global_id(); k < packs; k += global_stride()) {
        A v[N];
        Pack16<T>::unpack(((const uint4*)x)[k], v);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = f(v[i], q0, q1);
        ((uint4*)out)[k] = Pack16<T>::pack(v);
    }
    for (i64 i = packs * N + global_id(); i < n; i += global_stride()) out[i] = from_acc<T>(f(to_acc(x[i]), q0, q1));
    return true;
}

template <typename T, typename F>
__device__ __forceinline__ void unary(i64 n, int ndim, const i64* info, const T* x, i64 x_off, double p0,
                                      double p1, T* out) {
    info = block_info(info, 2 * ndim);
    typedef typename Acc<T>::type A;
    F f;
    A q0 = (A)p0, q1 = (A)p1;
    if (!info && unary_dense16<T, F>(n, x + x_off, q0, q1, out)) return;
    for (i64 i = global_id(); i < n; i += global_stride()) {
        i64 xi = x_off + (info ? strided_offset(i, ndim, info, info + ndim) : i);
        out[i] = from_acc<T>(f(to_acc(x[xi]), q0, q1));
    }
}

#define UNARY_KERNEL(NAME, T, SUFFIX)                                                              \
    extern "C" __global__ void NAME##_##SUFFIX(i64 n, int ndim, const i64* info, const T* x, i64 x_off, \
                                               double p0, double p1, T* out) {                    \
        unary<T, Op_##NAME>(n, ndim, info, x, x_off, p0, p1, out);                                 \
    }
#define UNARY_ALL(NAME)                   \
    UNARY_KERNEL(NAME, float, f32)        \
    UNARY_KERNEL(NAME, double, f64)       \
    UNARY_KERNEL(NAME, tapir_f16, f16)    \
    UNARY_KERNEL(NAME, tapir_bf16, bf16)

// One line an op: `UNARY_OP(name, expression of x, p0, p1)` makes the
// functor `Op_name` (`A operator()(A x, A p0, A p1)`, A the accumulation
// type) and the kernels `name_f32`, `name_f64`, `name_f16`, `name_bf16`
// that Unary::cuda_kernel names.
#define UNARY_OP(NAME, EXPR)                                                        \
    struct Op_##NAME {                                                              \
        template <typename A> __device__ __forceinline__ A operator()(A x, A p0, A p1) const { \
            (void)p0;                                                               \
            (void)p1;                                                               \
            return EXPR;                                                            \
        }                                                                           \
    };                                                                              \
    UNARY_ALL(NAME)

UNARY_OP(neg, -x)
UNARY_OP(abs, x < A(0) ? -x : x)
UNARY_OP(exp, t_exp(x))
UNARY_OP(log, t_log(x))
UNARY_OP(sqrt, t_sqrt(x))
UNARY_OP(rsqrt, A(1) / t_sqrt(x))
UNARY_OP(tanh, t_tanh(x))
UNARY_OP(sigmoid, A(1) / (A(1) + t_exp(-x)))
// `x < 0`, not `x > 0`, so NaN passes through as in torch and on the CPU.
UNARY_OP(relu, x < A(0) ? A(0) : x)
UNARY_OP(gelu_tanh, A(0.5) * x * (A(1) + t_tanh(A(SQRT_2_OVER_PI) * (x + A(GELU_C) * x * x * x))))
UNARY_OP(gelu, A(0.5) * x * (A(1) + t_erf(x * A(FRAC_1_SQRT_2))))
UNARY_OP(sin, t_sin(x))
UNARY_OP(cos, t_cos(x))
UNARY_OP(square, x * x)
UNARY_OP(powf, t_pow(x, p0))
UNARY_OP(recip, A(1) / x)
UNARY_OP(add_scalar, x + p0)
UNARY_OP(mul_scalar, x * p0)
UNARY_OP(clamp, x < p0 ? p0 : (x > p1 ? p1 : x))
UNARY_OP(erf, t_erf(x))
UNARY_OP(sign, x > A(0) ? A(1) : (x < A(0) ? A(-1) : x))
UNARY_OP(softplus, (x > A(0) ? x : A(0)) + t_log1p(t_exp(x < A(0) ? x : -x)))
UNARY_OP(log1p, t_log1p(x))
UNARY_OP(expm1, t_expm1(x))

// Integer neg and abs wrap as torch's and the CPU's do (the minimum maps to
// itself), computed on the unsigned type U. Same arguments as the float
// unary kernels; p0 and p1 are ignored.
template <typename T, typename U, bool ABS>
__device__ __forceinline__ void int_neg_abs(i64 n, int ndim, const i64* info, const T* x, i64 x_off, T* out) {
    info = block_info(info, 2 * ndim);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        T v = x[x_off + (info ? strided_offset(i, ndim, info, info + ndim) : i)];
        out[i] = (ABS && v >= 0) ? v : (T)((U)0 - (U)v);
    }
}
#define INT_UNARY(NAME, ABS)                                                                                   \
    extern "C" __global__ void NAME##_i32(i64 n, int ndim, const i64* info, const int* x, i64 x_off, double p0, \
                                          double p1, int* out) {                                              \
        (void)p0;                                                                                              \
        (void)p1;                                                                                              \
        int_neg_abs<int, unsigned, ABS>(n, ndim, info, x, x_off, out);                                         \
    }                                                                                                          \
    extern "C" __global__ void NAME##_i64(i64 n, int ndim, const i64* info, const i64* x, i64 x_off, double p0, \
                                          double p1, i64* out) {                                              \
        (void)p0;                                                                                              \
        (void)p1;                                                                                              \
        int_neg_abs<i64, u64, ABS>(n, ndim, info, x, x_off, out);                                              \
    }
INT_UNARY(neg, false)
INT_UNARY(abs, true)

// Binary functors: `A operator()(A a, A b)`.
#define BINARY_OP(NAME, EXPR)                                                              \
    struct Op_##NAME {                                                                     \
        template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return EXPR; } \
    };

BINARY_OP(add, a + b)
BINARY_OP(sub, a - b)
BINARY_OP(mul, a * b)
BINARY_OP(div, a / b)
BINARY_OP(pow, t_pow(a, b))
BINARY_OP(maximum, nan_max(a, b))
BINARY_OP(minimum, nan_min(a, b))
// Fused first derivatives, `a` = x (or y), `b` = upstream gradient.
BINARY_OP(relu_bwd, a > A(0) ? b : A(0))
BINARY_OP(tanh_bwd, b * (A(1) - a * a))
BINARY_OP(sigmoid_bwd, b * a * (A(1) - a))
BINARY_OP(gelu_tanh_bwd, gelu_tanh_grad(a) * b)
BINARY_OP(gelu_bwd, b * (A(0.5) * (A(1) + t_erf(a * A(FRAC_1_SQRT_2))) + a * A(FRAC_1_SQRT_2PI) * t_exp(A(-0.5) * a * a)))

template <typename T, typename F>
__device__ __forceinline__ bool binary_dense16(i64 n, const T* a, const T* b, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    if (!aligned16(a) || !aligned16(b) || !aligned16(out)) return false;
    F f;
    const i64 packs = n / N;
    for (i64 k = global_id(); k < packs; k += global_stride()) {
        A x[N], y[N];
        Pack16<T>::unpack(((const uint4*)a)[k], x);
        Pack16<T>::unpack(((const uint4*)b)[k], y);
#pragma unroll
        for (int i = 0; i < N; ++i) x[i] = f(x[i], y[i]);
        ((uint4*)out)[k] = Pack16<T>::pack(x);
    }
    for (i64 i = packs * N + global_id(); i < n; i += global_stride()) out[i] = from_acc<T>(f(to_acc(a[i]), to_acc(b[i])));
    return true;
}

// The period of an operand whose element i is at offset i % period: its
// strides are the contiguous ones over some innermost axes and 0 over the
// rest (size-1 axes aside). A dense operand's period is n, a broadcast
// scalar's 1, a bias broadcast over rows its row length. 0: not periodic.
__device__ __forceinline__ i64 period_of(int ndim, const i64* dims, const i64* strides) {
    i64 p = 1;
    bool inner = true;
    for (int d = ndim - 1; d >= 0; --d) {
        if (dims[d] == 1) continue;
        if (inner && strides[d] == p) {
            p *= dims[d];
            continue;
        }
        inner = false;
        if (strides[d] != 0) return 0;
    }
    return p;
}

// Pack k (elements k * N ..) of an operand of period `per`: a 16-byte load,
// or one element repeated for a period of 1 (a scalar).
template <typename T>
__device__ __forceinline__ bool packable(i64 per, const T* p) {
    return per == 1 || (per % Pack16<T>::N == 0 && aligned16(p));
}
template <typename T>
__device__ __forceinline__ void load_periodic(const T* p, i64 per, i64 k, typename Acc<T>::type* v) {
    const int N = Pack16<T>::N;
    if (per == 1) {
        const typename Acc<T>::type s = to_acc(p[0]);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = s;
    } else {
        Pack16<T>::unpack(((const uint4*)p)[(k * N % per) / N], v);
    }
}

// A broadcast call whose operands are both periodic (a bias added to
// every row, a tensor times a device scalar): element i reads a[i % pa]
// and b[i % pb], one remainder each instead of the per-axis division of
// strided_offset, and 16-byte packs when each period is 1 or whole packs
// and the buffers are aligned. False when the call is not of that kind.
template <typename T, typename F>
__device__ __forceinline__ bool binary_periodic(i64 n, int ndim, const i64* info, const T* a, const T* b, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    __shared__ i64 periods[2];
    if (threadIdx.x == 0) {
        periods[0] = period_of(ndim, info, info + ndim);
        periods[1] = period_of(ndim, info, info + 2 * ndim);
    }
    __syncthreads();
    const i64 pa = periods[0], pb = periods[1];
    if (pa == 0 || pb == 0) return false;
    F f;
    if (packable(pa, a) && packable(pb, b) && aligned16(out)) {
        const i64 packs = n / N;
        for (i64 k = global_id(); k < packs; k += global_stride()) {
            A x[N], y[N];
            load_periodic(a, pa, k, x);
            load_periodic(b, pb, k, y);
#pragma unroll
            for (int i = 0; i < N; ++i) x[i] = f(x[i], y[i]);
            ((uint4*)out)[k] = Pack16<T>::pack(x);
        }
        for (i64 i = packs * N + global_id(); i < n; i += global_stride())
            out[i] = from_acc<T>(f(to_acc(a[i % pa]), to_acc(b[i % pb])));
        return true;
    }
    for (i64 i = global_id(); i < n; i += global_stride()) out[i] = from_acc<T>(f(to_acc(a[i % pa]), to_acc(b[i % pb])));
    return true;
}

template <typename T, typename F>
__device__ __forceinline__ void binary(i64 n, int ndim, const i64* info, const T* a, i64 a_off, const T* b,
                                       i64 b_off, T* out) {
    info = block_info(info, 3 * ndim);
    if (!info && binary_dense16<T, F>(n, a + a_off, b + b_off, out)) return;
    if (info && binary_periodic<T, F>(n, ndim, info, a + a_off, b + b_off, out)) return;
    F f;
    for (i64 i = global_id(); i < n; i += global_stride()) {
        i64 ai, bi;
        pair_offsets(i, ndim, info, a_off, b_off, &ai, &bi);
        out[i] = from_acc<T>(f(to_acc(a[ai]), to_acc(b[bi])));
    }
}

#define BINARY_KERNEL(NAME, T, SUFFIX)                                                                      \
    extern "C" __global__ void NAME##_##SUFFIX(i64 n, int ndim, const i64* info, const T* a, i64 a_off,     \
                                               const T* b, i64 b_off, T* out) {                           \
        binary<T, Op_##NAME>(n, ndim, info, a, a_off, b, b_off, out);                                       \
    }
#define BINARY_ALL(NAME)                  \
    BINARY_KERNEL(NAME, float, f32)       \
    BINARY_KERNEL(NAME, double, f64)      \
    BINARY_KERNEL(NAME, tapir_f16, f16)   \
    BINARY_KERNEL(NAME, tapir_bf16, bf16)

BINARY_ALL(add)
BINARY_ALL(sub)
BINARY_ALL(mul)
BINARY_ALL(div)
BINARY_ALL(pow)
BINARY_ALL(maximum)
BINARY_ALL(minimum)
BINARY_ALL(relu_bwd)
BINARY_ALL(tanh_bwd)
BINARY_ALL(sigmoid_bwd)
BINARY_ALL(gelu_tanh_bwd)
BINARY_ALL(gelu_bwd)

// Comparisons write 1 or 0 in the operands' dtype (as the CPU does), from
// two tensors (`scalar` ignored, b given) or a tensor and `scalar` (b null).
// `cmp`: 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge. The host passes `scalar`
// already rounded to the dtype, as the CPU's `Tensor::scalar_of` does.
template <typename T>
__device__ __forceinline__ void compare(i64 n, int ndim, const i64* info, int cmp, const T* a, i64 a_off,
                                        const T* b, i64 b_off, double scalar, T* out) {
    info = block_info(info, 3 * ndim);
    typedef typename Acc<T>::type A;
    for (i64 i = global_id(); i < n; i += global_stride()) {
        i64 ai, bi;
        pair_offsets(i, ndim, info, a_off, b_off, &ai, &bi);
        A x = to_acc(a[ai]);
        A y = b ? to_acc(b[bi]) : (A)scalar;
        bool r = cmp == 0 ? x == y : cmp == 1 ? x != y : cmp == 2 ? x < y : cmp == 3 ? x <= y : cmp == 4 ? x > y : x >= y;
        out[i] = from_acc<T>(r ? A(1) : A(0));
    }
}

#define COMPARE_KERNEL(T, SUFFIX)                                                                        \
    extern "C" __global__ void compare_##SUFFIX(i64 n, int ndim, const i64* info, int cmp, const T* a,    \
                                                i64 a_off, const T* b, i64 b_off, double scalar, T* out) { \
        compare<T>(n, ndim, info, cmp, a, a_off, b, b_off, scalar, out);                                 \
    }
COMPARE_KERNEL(float, f32)
COMPARE_KERNEL(double, f64)
COMPARE_KERNEL(tapir_f16, f16)
COMPARE_KERNEL(tapir_bf16, bf16)

// Integer comparisons of two tensors, in the operands' own type so int64
// values past 2^53 compare exactly (as on the CPU). Same arguments as the
// float kernels; b must be given (an integer tensor against a float scalar
// is compared in f64 by the host, as the CPU does), `scalar` is ignored.
template <typename T>
__device__ __forceinline__ void int_compare(i64 n, int ndim, const i64* info, int cmp, const T* a, i64 a_off,
                                            const T* b, i64 b_off, T* out) {
    info = block_info(info, 3 * ndim);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        i64 ai, bi;
        pair_offsets(i, ndim, info, a_off, b_off, &ai, &bi);
        T x = a[ai], y = b[bi];
        bool r = cmp == 0 ? x == y : cmp == 1 ? x != y : cmp == 2 ? x < y : cmp == 3 ? x <= y : cmp == 4 ? x > y : x >= y;
        out[i] = r ? 1 : 0;
    }
}
#define INT_COMPARE_KERNEL(T, SUFFIX)                                                                    \
    extern "C" __global__ void compare_##SUFFIX(i64 n, int ndim, const i64* info, int cmp, const T* a,    \
                                                i64 a_off, const T* b, i64 b_off, double scalar, T* out) { \
        (void)scalar;                                                                                    \
        int_compare<T>(n, ndim, info, cmp, a, a_off, b, b_off, out);                                     \
    }
INT_COMPARE_KERNEL(int, i32)
INT_COMPARE_KERNEL(i64, i64)

// Strided copy to a contiguous buffer (`contiguous()`, and the first step
// of an op that needs dense rows). Same dtype in and out.
template <typename T>
__device__ __forceinline__ void copy_strided(i64 n, int ndim, const i64* info, const T* x, i64 x_off, T* out) {
    info = block_info(info, 2 * ndim);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        out[i] = x[x_off + strided_offset(i, ndim, info, info + ndim)];
    }
}
#define COPY_KERNEL(T, SUFFIX)                                                                            \
    extern "C" __global__ void copy_strided_##SUFFIX(i64 n, int ndim, const i64* info, const T* x, i64 x_off, \
                                                     T* out) {                                            \
        copy_strided<T>(n, ndim, info, x, x_off, out);                                                    \
    }
COPY_KERNEL(float, f32)
COPY_KERNEL(double, f64)
COPY_KERNEL(u16, u16)
COPY_KERNEL(int, i32)
COPY_KERNEL(i64, i64)

// Integer add, sub and mul wrap on overflow as torch's do; they are computed
// on the unsigned type U, where overflow is defined. OP: 0 add, 1 sub,
// 2 mul, 3 maximum, 4 minimum. Same arguments as the float kernels.
template <typename T, typename U, int OP>
__device__ __forceinline__ void int_binary(i64 n, int ndim, const i64* info, const T* a, i64 a_off, const T* b,
                                           i64 b_off, T* out) {
    info = block_info(info, 3 * ndim);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        i64 ai, bi;
        pair_offsets(i, ndim, info, a_off, b_off, &ai, &bi);
        T x = a[ai], y = b[bi];
        T r;
        if (OP == 0) r = (T)((U)x + (U)y);
        else if (OP == 1) r = (T)((U)x - (U)y);
        else if (OP == 2) r = (T)((U)x * (U)y);
        else if (OP == 3) r = x > y ? x : y;
        else r = x < y ? x : y;
        out[i] = r;
    }
}

#define INT_BINARY(NAME, OP)                                                                                  \
    extern "C" __global__ void NAME##_i32(i64 n, int ndim, const i64* info, const int* a, i64 a_off,          \
                                          const int* b, i64 b_off, int* out) {                                \
        int_binary<int, unsigned, OP>(n, ndim, info, a, a_off, b, b_off, out);                                \
    }                                                                                                         \
    extern "C" __global__ void NAME##_i64(i64 n, int ndim, const i64* info, const i64* a, i64 a_off,          \
                                          const i64* b, i64 b_off, i64* out) {                                \
        int_binary<i64, u64, OP>(n, ndim, info, a, a_off, b, b_off, out);                                     \
    }

INT_BINARY(add, 0)
INT_BINARY(sub, 1)
INT_BINARY(mul, 2)
INT_BINARY(maximum, 3)
INT_BINARY(minimum, 4)

// Integer pow by squaring, wrapping as the CPU's (on U, as above). No
// integer holds a negative power: such an element is written 0 and its
// lowest output position recorded in *bad (set to ~0 by the host;
// atomicMin), which the host turns into the CPU's error, reading the
// exponent back. `pow_<dtype>(n, ndim, info, a, a_offset, b, b_offset, out, bad)`.
template <typename T, typename U>
__device__ __forceinline__ void int_pow(i64 n, int ndim, const i64* info, const T* a, i64 a_off, const T* b,
                                        i64 b_off, T* out, u64* bad) {
    info = block_info(info, 3 * ndim);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        i64 ai, bi;
        pair_offsets(i, ndim, info, a_off, b_off, &ai, &bi);
        T y = b[bi];
        if (y < 0) {
            atomicMin(bad, (u64)i);
            out[i] = 0;
            continue;
        }
        U base = (U)a[ai], acc = 1;
        for (u64 e = (u64)y; e > 0; e >>= 1) {
            if (e & 1) acc *= base;
            base *= base;
        }
        out[i] = (T)acc;
    }
}
extern "C" __global__ void pow_i32(i64 n, int ndim, const i64* info, const int* a, i64 a_off, const int* b,
                                   i64 b_off, int* out, u64* bad) {
    int_pow<int, unsigned>(n, ndim, info, a, a_off, b, b_off, out, bad);
}
extern "C" __global__ void pow_i64(i64 n, int ndim, const i64* info, const i64* a, i64 a_off, const i64* b,
                                   i64 b_off, i64* out, u64* bad) {
    int_pow<i64, u64>(n, ndim, info, a, a_off, b, b_off, out, bad);
}

// Kernels that move elements without computing on them are named by the
// width of the value (u16 for f16/bf16, u32 for f32/i32, u64 for f64/i64),
// so each serves every dtype of that width bit for bit.
typedef unsigned int u32;

// where(mask, a, b) (binary.rs's Where): `a` where the mask is non-zero,
// else `b`, all three strided and broadcast to the output's shape:
// `where_<mask dtype>_<width>(n, ndim, info, m, m_off, a, a_off, b, b_off, out)`;
// `info` holds dims[ndim], then the strides of m, a and b (0 on broadcast
// axes). A NaN mask entry is non-zero and -0.0 is zero, as on the CPU.
__device__ __forceinline__ bool nonzero(float v) { return v != 0.0f; }
__device__ __forceinline__ bool nonzero(double v) { return v != 0.0; }
__device__ __forceinline__ bool nonzero(tapir_f16 v) { return to_acc(v) != 0.0f; }
__device__ __forceinline__ bool nonzero(tapir_bf16 v) { return to_acc(v) != 0.0f; }
__device__ __forceinline__ bool nonzero(int v) { return v != 0; }
__device__ __forceinline__ bool nonzero(i64 v) { return v != 0; }

template <typename M, typename V>
__device__ __forceinline__ void where_select(i64 n, int ndim, const i64* info, const M* m, i64 m_off, const V* a,
                                             i64 a_off, const V* b, i64 b_off, V* out) {
    info = block_info(info, 4 * ndim);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        i64 mi = m_off + strided_offset(i, ndim, info, info + ndim);
        i64 ai = a_off + strided_offset(i, ndim, info, info + 2 * ndim);
        i64 bi = b_off + strided_offset(i, ndim, info, info + 3 * ndim);
        out[i] = nonzero(m[mi]) ? a[ai] : b[bi];
    }
}
#define WHERE_KERNEL(M, MS, V, VS)                                                                              \
    extern "C" __global__ void where_##MS##_##VS(i64 n, int ndim, const i64* info, const M* m, i64 m_off,       \
                                                 const V* a, i64 a_off, const V* b, i64 b_off, V* out) {       \
        where_select<M, V>(n, ndim, info, m, m_off, a, a_off, b, b_off, out);                                   \
    }
#define WHERE_ALL(M, MS)          \
    WHERE_KERNEL(M, MS, u16, u16) \
    WHERE_KERNEL(M, MS, u32, u32) \
    WHERE_KERNEL(M, MS, u64, u64)
WHERE_ALL(float, f32)
WHERE_ALL(double, f64)
WHERE_ALL(tapir_f16, f16)
WHERE_ALL(tapir_bf16, bf16)
WHERE_ALL(int, i32)
WHERE_ALL(i64, i64)

// A strided copy into a strided region of the output (concat and pad in
// shape.rs, which zero the rest first): `place_<width>(n, ndim, info, x, out)`;
// `info` holds dims[ndim] (x's), then x's strides, then the output's; the
// host passes both pointers at their first element.
template <typename V>
__device__ __forceinline__ void place(i64 n, int ndim, const i64* info, const V* x, V* out) {
    info = block_info(info, 3 * ndim);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        out[strided_offset(i, ndim, info, info + 2 * ndim)] = x[strided_offset(i, ndim, info, info + ndim)];
    }
}
#define PLACE_KERNEL(V, VS)                                                                                   \
    extern "C" __global__ void place_##VS(i64 n, int ndim, const i64* info, const V* x, V* out) {            \
        place<V>(n, ndim, info, x, out);                                                                      \
    }
PLACE_KERNEL(u16, u16)
PLACE_KERNEL(u32, u32)
PLACE_KERNEL(u64, u64)

// Fill: every one of the `n` elements of `out` gets the bit pattern in the
// low bits of `bits` (the value already converted to the dtype on the host,
// as the CPU's constructors convert it), so one kernel per element width
// serves every dtype of that width and -0.0 or a NaN payload is kept.
// All-zero fills use a memset instead.
#define FILL_KERNEL(T, SUFFIX)                                                       \
    extern "C" __global__ void fill_##SUFFIX(i64 n, i64 bits, T* out) {             \
        T v = (T)(u64)bits;                                                          \
        for (i64 i = global_id(); i < n; i += global_stride()) {                     \
            out[i] = v;                                                              \
        }                                                                            \
    }
FILL_KERNEL(u16, b16)
FILL_KERNEL(unsigned int, b32)
FILL_KERNEL(u64, b64)
