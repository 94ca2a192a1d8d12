// Shared prelude of every kernel file. tapir prepends this text to each
// kernels/*.cu before handing it to NVRTC, so a kernel file needs no
// #include and NVRTC needs no CUDA headers on disk (the pip wheel of NVRTC
// ships none).
//
// Conventions, the same in every file:
// - element counts and offsets are 64-bit (`i64`), so tensors over 2^31
//   elements index correctly;
// - a strided operand is described by `dims` and `strides` (in elements,
//   0 on a broadcast axis) plus a base offset; the output is contiguous;
// - f16 and bf16 are storage types only: they are loaded into float,
//   computed in float and rounded once on store (f32 accumulation);
// - kernel names are `<op>_<dtype>` with dtype in f32, f64, f16, bf16.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned short u16;

#define TAPIR_MAX_DIMS 8
#define WARP 32
#define FULL_MASK 0xffffffffu

// IEEE binary16 and bfloat16 as raw bits; conversions below.
struct __align__(2) tapir_f16 { u16 x; };
struct __align__(2) tapir_bf16 { u16 x; };

// The type arithmetic runs in: double for f64, float for everything else.
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(tapir_f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}
__device__ __forceinline__ float to_acc(tapir_bf16 v) {
    return __uint_as_float(((unsigned)v.x) << 16);
}

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ tapir_f16 from_acc<tapir_f16>(float v) {
    tapir_f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(v));
    return r;
}
// Round to nearest even, keeping NaN a (quiet) NaN, as torch and `half` do.
// sm_80 and newer round in one instruction (`cvt.rn.bf16.f32`), where the
// integer sequence below is seven; older devices have no bf16 conversion.
// The two agree on every finite value and infinity; a NaN stays a NaN
// either way, but hardware's cvt may write a canonical NaN where the
// sequence keeps the payload's upper bits (as `half` does on the CPU and
// the emulator's cvt does); the tests compare NaNs as NaNs, not by bits.
#if __CUDA_ARCH__ >= 800
#define TAPIR_CVT_SM80 1
#endif
template <> __device__ __forceinline__ tapir_bf16 from_acc<tapir_bf16>(float v) {
    tapir_bf16 r;
#ifdef TAPIR_CVT_SM80
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(v));
#else
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (u16)((u >> 16) | 0x40u);
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        r.x = (u16)(u >> 16);
    }
#endif
    return r;
}

// Two floats rounded to a pair of 16-bit values in one 32-bit word, `lo`
// in the low half (the lower address). On sm_80 and newer one
// `cvt.rn.{f16x2,bf16x2}.f32` does both (its first source goes to the
// upper half), where two scalar conversions and the shift and or that
// join them are four instructions for f16 and sixteen for bf16; the
// rounding is the scalar conversion's, so the bits are the same.
template <typename H> __device__ __forceinline__ unsigned pack_half2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack_half2<tapir_f16>(float lo, float hi) {
#ifdef TAPIR_CVT_SM80
    unsigned w;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
#else
    return (unsigned)from_acc<tapir_f16>(lo).x | ((unsigned)from_acc<tapir_f16>(hi).x << 16);
#endif
}
template <> __device__ __forceinline__ unsigned pack_half2<tapir_bf16>(float lo, float hi) {
#ifdef TAPIR_CVT_SM80
    unsigned w;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
#else
    return (unsigned)from_acc<tapir_bf16>(lo).x | ((unsigned)from_acc<tapir_bf16>(hi).x << 16);
#endif
}

// 16-byte accesses: Pack16<T>::N elements of T in one uint4, the widest
// load and store a thread issues (4 f32, 2 f64, 8 f16 or bf16), so a warp
// moves 512 bytes per instruction instead of 64 to 128. A kernel takes this
// path when every access it makes this way is 16-byte aligned (aligned16 of
// each base, and rows a multiple of 16 bytes long), else its element loop.
// Elements are unpacked into the accumulation type in registers.
__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15) == 0; }
template <typename T> struct Pack16;
template <> struct Pack16<float> {
    enum { N = 4 };
    __device__ static __forceinline__ void unpack(uint4 r, float* o) {
        o[0] = __uint_as_float(r.x);
        o[1] = __uint_as_float(r.y);
        o[2] = __uint_as_float(r.z);
        o[3] = __uint_as_float(r.w);
    }
    __device__ static __forceinline__ uint4 pack(const float* v) {
        return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    }
};
template <> struct Pack16<double> {
    enum { N = 2 };
    __device__ static __forceinline__ void unpack(uint4 r, double* o) {
        o[0] = __hiloint2double((int)r.y, (int)r.x);
        o[1] = __hiloint2double((int)r.w, (int)r.z);
    }
    __device__ static __forceinline__ uint4 pack(const double* v) {
        return make_uint4((unsigned)__double2loint(v[0]), (unsigned)__double2hiint(v[0]), (unsigned)__double2loint(v[1]),
                          (unsigned)__double2hiint(v[1]));
    }
};
// Two 16-bit elements per word, the lower address in the low half.
// A word splits into its halves with one `mov` (f16: then a conversion
// each); a bf16 is the upper half of a float, so its pair is a shift and an
// and, no split (the same bits as to_acc of each half).
template <typename H> __device__ __forceinline__ void unpack_half2(unsigned w, float* o);
template <> __device__ __forceinline__ void unpack_half2<tapir_f16>(unsigned w, float* o) {
    u16 lo, hi;
    asm("mov.b32 {%0, %1}, %2;" : "=h"(lo), "=h"(hi) : "r"(w));
    asm("cvt.f32.f16 %0, %1;" : "=f"(o[0]) : "h"(lo));
    asm("cvt.f32.f16 %0, %1;" : "=f"(o[1]) : "h"(hi));
}
template <> __device__ __forceinline__ void unpack_half2<tapir_bf16>(unsigned w, float* o) {
    o[0] = __uint_as_float(w << 16);
    o[1] = __uint_as_float(w & 0xffff0000u);
}
template <typename H> struct Pack16Half {
    enum { N = 8 };
    __device__ static __forceinline__ void unpack_word(unsigned w, float* o) { unpack_half2<H>(w, o); }
    __device__ static __forceinline__ void unpack(uint4 r, float* o) {
        unpack_word(r.x, o);
        unpack_word(r.y, o + 2);
        unpack_word(r.z, o + 4);
        unpack_word(r.w, o + 6);
    }
    __device__ static __forceinline__ unsigned pack_word(const float* v) { return pack_half2<H>(v[0], v[1]); }
    __device__ static __forceinline__ uint4 pack(const float* v) {
        return make_uint4(pack_word(v), pack_word(v + 2), pack_word(v + 4), pack_word(v + 6));
    }
};
template <> struct Pack16<tapir_f16> : Pack16Half<tapir_f16> {};
template <> struct Pack16<tapir_bf16> : Pack16Half<tapir_bf16> {};

// Float constants and limits by accumulation type.
template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() { return __longlong_as_double(0xfff0000000000000ll); }
template <typename A> __device__ __forceinline__ A pos_inf() { return -neg_inf<A>(); }
template <typename A> __device__ __forceinline__ A quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double quiet_nan<double>() { return __longlong_as_double(0x7ff8000000000000ll); }

// Overloads so templates can call one name for float and double.
__device__ __forceinline__ float t_exp(float x) { return expf(x); }
__device__ __forceinline__ double t_exp(double x) { return exp(x); }
__device__ __forceinline__ float t_log(float x) { return logf(x); }
__device__ __forceinline__ double t_log(double x) { return log(x); }
__device__ __forceinline__ bool t_isnan(float x) { return x != x; }
__device__ __forceinline__ bool t_isnan(double x) { return x != x; }

// The flat index of a grid-stride loop, in 64 bits.
__device__ __forceinline__ i64 global_id() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 global_stride() { return (i64)blockDim.x * gridDim.x; }

// Offset of contiguous index `i` in an operand with these dims and strides.
__device__ __forceinline__ i64 strided_offset(i64 i, int ndim, const i64* dims, const i64* strides) {
    i64 off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
        i64 n = dims[d];
        off += (i % n) * strides[d];
        i /= n;
    }
    return off;
}

// The offsets of element `i` in the two operands of a binary kernel: dense
// when `info` is null, else through the operands' dims (info), a's strides
// (info + ndim) and b's (info + 2 * ndim), the layout the host writes.
__device__ __forceinline__ void pair_offsets(i64 i, int ndim, const i64* info, i64 a_off, i64 b_off, i64* ai,
                                             i64* bi) {
    *ai = a_off + (info ? strided_offset(i, ndim, info, info + ndim) : i);
    *bi = b_off + (info ? strided_offset(i, ndim, info, info + 2 * ndim) : i);
}

// A kernel's `info` (its `count` dims and strides) copied into shared
// memory once a block: the index arithmetic of every element then reads
// shared memory, where it issued a global load per dimension and operand
// for each element (a broadcast load whose 32-byte sector carries 8 useful
// bytes, which halved a broadcast multiply's sector efficiency). Null, a
// dense call, stays null. Every thread of the block calls it, before any
// divergence (it synchronises the block).
#define TAPIR_MAX_INFO (4 * TAPIR_MAX_DIMS)
__device__ __forceinline__ const i64* block_info(const i64* info, int count) {
    __shared__ i64 shared_info[TAPIR_MAX_INFO];
    if (!info || count > TAPIR_MAX_INFO) return info;
    for (int k = threadIdx.x; k < count; k += blockDim.x) shared_info[k] = info[k];
    __syncthreads();
    return shared_info;
}

// Warp and block reductions by shuffles. A block reduction needs blockDim.x
// a multiple of 32 and at most 1024; every thread gets the result.
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
// NaN-propagating max and min, as torch's reductions are.
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) { return (t_isnan(a) || a > b) ? a : b; }
template <typename A> __device__ __forceinline__ A nan_min(A a, A b) { return (t_isnan(a) || a < b) ? a : b; }
template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = WARP / 2; o > 0; o /= 2) v = nan_max(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
template <typename A> __device__ __forceinline__ A warp_min(A v) {
    for (int o = WARP / 2; o > 0; o /= 2) v = nan_min(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// 0 = sum, 1 = max, 2 = min.
template <int K, typename A> __device__ __forceinline__ A combine(A a, A b) {
    return K == 0 ? a + b : (K == 1 ? nan_max(a, b) : nan_min(a, b));
}
template <int K, typename A> __device__ __forceinline__ A warp_reduce(A v) {
    for (int o = WARP / 2; o > 0; o /= 2) v = combine<K>(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
template <int K, typename A> __device__ A block_reduce(A v, A identity) {
    __shared__ A partial[WARP];
    __shared__ A result;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_reduce<K>(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        A w = lane < (int)(blockDim.x / WARP) ? partial[lane] : identity;
        w = warp_reduce<K>(w);
        if (lane == 0) result = w;
    }
    __syncthreads();
    A r = result;
    __syncthreads();  // `partial` and `result` may be reused right after
    return r;
}

// Online log-sum-exp state: running max `m` and sum `s` of exp(x - m).
template <typename A> struct Lse {
    A m, s;
};
// A NaN anywhere makes the max NaN for good, so the result is NaN as on the
// CPU (which checks for NaN after its pass), whatever comes before or after.
template <typename A> __device__ __forceinline__ Lse<A> lse_push(Lse<A> a, A x) {
    if (t_isnan(x) || t_isnan(a.m)) {
        a.m = t_isnan(a.m) ? a.m : x;
    } else if (x > a.m) {
        a.s = (a.m == neg_inf<A>() ? A(0) : a.s * t_exp(a.m - x)) + A(1);
        a.m = x;
    } else if (x == neg_inf<A>()) {
        // exp(-inf - m) = 0; skipping also keeps an all -inf row at s = 0.
    } else {
        a.s += t_exp(x - a.m);
    }
    return a;
}
// exp(x) for the terms of a softmax or log-sum-exp, whose arguments are
// differences x - max <= 0: one multiply and the hardware's base-2
// exponential (ex2.approx.ftz, relative error about 2^-22, subnormal
// results flushed to 0), where expf's full-range sequence is several
// times the instructions. -inf gives 0 and NaN stays NaN. Double keeps exp.
__device__ __forceinline__ float term_exp(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}
__device__ __forceinline__ double term_exp(double x) { return exp(x); }

// lse_push of N values at once: one max over them (fmax, which skips a
// NaN: a NaN term makes the sum NaN instead, and lse_value turns a NaN sum
// into a NaN result), at most one rescale of the running sum, then N
// exponentials. A NaN that only -inf values accompany is kept in m, as
// lse_push keeps it, and sticks; -inf adds nothing; an all -inf run keeps
// s = 0; at m = +inf the sum is never read.
template <typename A, int N> __device__ __forceinline__ Lse<A> lse_push_n(Lse<A> a, const A* x) {
    if (t_isnan(a.m)) return a;
    A cm = x[0];
#pragma unroll
    for (int i = 1; i < N; ++i) cm = fmax(cm, x[i]);
    A m = fmax(a.m, cm);
    if (m == neg_inf<A>()) {
#pragma unroll
        for (int i = 0; i < N; ++i)
            if (t_isnan(x[i])) a.m = x[i];
        return a;
    }
    A s = a.s;
    if (m != a.m) s = a.m == neg_inf<A>() ? A(0) : s * term_exp(a.m - m);
#pragma unroll
    for (int i = 0; i < N; ++i) s += term_exp(x[i] - m);
    a.m = m;
    a.s = s;
    return a;
}
template <typename A> __device__ __forceinline__ Lse<A> lse_merge(Lse<A> a, Lse<A> b) {
    if (t_isnan(a.m)) return a;
    if (t_isnan(b.m)) return b;
    if (b.m == neg_inf<A>()) return a;
    if (a.m == neg_inf<A>()) return b;
    A m = a.m > b.m ? a.m : b.m;
    Lse<A> r;
    r.m = m;
    r.s = a.s * t_exp(a.m - m) + b.s * t_exp(b.m - m);
    return r;
}
template <typename A> __device__ __forceinline__ Lse<A> warp_lse(Lse<A> v) {
    for (int o = WARP / 2; o > 0; o /= 2) {
        Lse<A> other;
        other.m = __shfl_xor_sync(FULL_MASK, v.m, o);
        other.s = __shfl_xor_sync(FULL_MASK, v.s, o);
        v = lse_merge(v, other);
    }
    return v;
}
template <typename A> __device__ Lse<A> block_lse(Lse<A> v) {
    __shared__ A pm[WARP], ps[WARP];
    __shared__ A rm, rs;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_lse(v);
    if (lane == 0) {
        pm[warp] = v.m;
        ps[warp] = v.s;
    }
    __syncthreads();
    if (warp == 0) {
        Lse<A> w;
        w.m = neg_inf<A>();
        w.s = A(0);
        if (lane < (int)(blockDim.x / WARP)) {
            w.m = pm[lane];
            w.s = ps[lane];
        }
        w = warp_lse(w);
        if (lane == 0) {
            rm = w.m;
            rs = w.s;
        }
    }
    __syncthreads();
    Lse<A> r;
    r.m = rm;
    r.s = rs;
    __syncthreads();
    return r;
}
// log(sum exp) from the state; a NaN or +-inf max passes through as on the CPU.
template <typename A> __device__ __forceinline__ A lse_value(Lse<A> a) {
    if (a.m == neg_inf<A>() || a.m == pos_inf<A>() || t_isnan(a.m)) return a.m;
    return a.m + t_log(a.s);
}

// M(args..., T, SUFFIX) once for each float dtype (the kernels of
// reduce.cu and softmax.cu).
#define FOR_FLOATS(M, ...)         \
    M(__VA_ARGS__, float, f32)     \
    M(__VA_ARGS__, double, f64)    \
    M(__VA_ARGS__, tapir_f16, f16) \
    M(__VA_ARGS__, tapir_bf16, bf16)

// Rows held in registers, a warp a row (the `*_warp_<dtype>` kernels of
// softmax.cu and reduce.cu): a row of `units` 16-byte units, at most
// WARP_ROW_UNITS a lane (8 KiB: 4,096 f16/bf16, 2,048 f32, 1,024 f64), from
// a 16-byte aligned base. Lane l holds units l, l + 32, ... in u[0..U): U is
// a power of two with units > 32 * U / 2, so the first U / 2 of them exist
// in every lane and only the rest are tested (`rem` = units - lane). The
// rows go warp by warp, blockDim.x / 32 a block, grid-strided; the host
// launches these for many rows (crates/tensor/src/cuda/launch.rs,
// `warp_rows`), the block-per-row kernels otherwise.
//
// The same with a block a row (BLOCK true: the `*_block<U>_<dtype>` kernels
// of softmax.cu): the row's units are spread over the blockDim.x threads
// (lane = threadIdx.x, `width` = blockDim.x, a power of two), a block a
// row, grid-strided, with units > width * U / 2 likewise.
#define WARP_ROW_UNITS 16
template <int U> __device__ __forceinline__ bool wrow_has(int j, int width, int rem) {
    return j < U / 2 || width * j < rem;
}
// The rows of this warp (or block) one by one: loads lane's units of row r
// into u, then calls body(r, u, lane, width, rem).
template <bool BLOCK, int U, typename T, typename F>
__device__ __forceinline__ void wrow_each(i64 rows, i64 cols, const T* x, F body) {
    const int width = BLOCK ? (int)blockDim.x : WARP;
    const int lane = BLOCK ? (int)threadIdx.x : (int)(threadIdx.x % WARP), rem = (int)(cols / Pack16<T>::N) - lane;
    const i64 per = BLOCK ? 1 : blockDim.x / WARP;
    for (i64 r = blockIdx.x * per + (BLOCK ? 0 : threadIdx.x / WARP); r < rows; r += gridDim.x * per) {
        const uint4* row = (const uint4*)(x + r * cols);
        uint4 u[U];
#pragma unroll
        for (int j = 0; j < U; ++j)
            if (wrow_has<U>(j, width, rem)) u[j] = row[lane + width * j];
        body(r, u, lane, width, rem);
    }
}
// f(j, v) for each unit j this lane holds, unpacked into v (Acc<T>).
template <typename T, int U, typename F>
__device__ __forceinline__ void wrow_units(const uint4 (&u)[U], int width, int rem, F f) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
        if (!wrow_has<U>(j, width, rem)) continue;
        typename Acc<T>::type v[Pack16<T>::N];
        Pack16<T>::unpack(u[j], v);
        f(j, v);
    }
}
// Calls BODY(U) with U the power of two for `units` (at most
// WIDTH * WARP_ROW_UNITS, WIDTH the threads of a row); BODY is a macro
// that instantiates the row loop.
#define WROW_DISPATCH(units, WIDTH, BODY)   \
    do {                                    \
        if ((units) <= (WIDTH))             \
            BODY(1);                        \
        else if ((units) <= 2 * (WIDTH))    \
            BODY(2);                        \
        else if ((units) <= 4 * (WIDTH))    \
            BODY(4);                        \
        else if ((units) <= 8 * (WIDTH))    \
            BODY(8);                        \
        else                                \
            BODY(16);                       \
    } while (0)
template <typename A> __device__ __forceinline__ A warp_fmax(A v) {
    for (int o = WARP / 2; o > 0; o /= 2) v = fmax(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// How the rows of a `[rows, cols]` row kernel map onto threads: a block of
// blockDim.x threads per row, or, for rows of at most SHORT_ROW elements, a
// warp per row (blockDim.x / 32 rows a block), so that many short rows (a
// batch of ten logits) do not leave most of each block idle. Either way the
// rows are grid-strided; a block-wide row loop is uniform over the block
// (its reductions may synchronise), a warp-wide one over the warp.
#define SHORT_ROW 64
struct RowSplit {
    i64 first, step;  // this thread's first row, and the stride to the next
    int lane, width;  // index among the threads of a row, and their count
    bool warp;        // a warp per row
};
__device__ __forceinline__ RowSplit row_split(i64 cols) {
    RowSplit s;
    s.warp = cols <= SHORT_ROW;
    if (s.warp) {
        int per = blockDim.x / WARP;
        s.first = (i64)blockIdx.x * per + threadIdx.x / WARP;
        s.step = (i64)gridDim.x * per;
        s.lane = threadIdx.x % WARP;
        s.width = WARP;
    } else {
        s.first = blockIdx.x;
        s.step = gridDim.x;
        s.lane = threadIdx.x;
        s.width = blockDim.x;
    }
    return s;
}
