// dtype casts of a contiguous buffer (`to_dtype`), `cast_<from>_<to>(n, x,
// out)`. Floats convert through double when either side is f64 and through
// float otherwise; f16/bf16 round to nearest even; float to integer
// truncates toward zero (as Rust's `as` and torch do, NaN giving 0).

__device__ __forceinline__ double to_f64(float v) { return (double)v; }
__device__ __forceinline__ double to_f64(double v) { return v; }
__device__ __forceinline__ double to_f64(tapir_f16 v) { return (double)to_acc(v); }
__device__ __forceinline__ double to_f64(tapir_bf16 v) { return (double)to_acc(v); }
__device__ __forceinline__ double to_f64(int v) { return (double)v; }
__device__ __forceinline__ double to_f64(i64 v) { return (double)v; }

template <typename O> __device__ __forceinline__ O from_f64(double v);
template <> __device__ __forceinline__ float from_f64<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double from_f64<double>(double v) { return v; }
// One rounding from double, as the CPU's `f16::from_f64`: round toward
// zero to float, make the result odd when inexact (the sticky bit), then
// round to nearest even. Round-to-odd into a format with at least two more
// bits than the target makes the second rounding exact.
__device__ __forceinline__ float round_to_odd_f32(double v) {
    float f = __double2float_rz(v);
    if ((double)f != v && f == f) f = __uint_as_float(__float_as_uint(f) | 1u);
    return f;
}
template <> __device__ __forceinline__ tapir_f16 from_f64<tapir_f16>(double v) { return from_acc<tapir_f16>(round_to_odd_f32(v)); }
template <> __device__ __forceinline__ tapir_bf16 from_f64<tapir_bf16>(double v) { return from_acc<tapir_bf16>(round_to_odd_f32(v)); }
// Saturating, NaN to 0, as Rust's `as`.
template <> __device__ __forceinline__ int from_f64<int>(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return (int)(-2147483647 - 1);
    return (int)v;
}
template <> __device__ __forceinline__ i64 from_f64<i64>(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return 9223372036854775807ll;
    if (v <= -9223372036854775808.0) return (i64)(-9223372036854775807ll - 1);
    return (i64)v;
}

template <typename I, typename O> __device__ __forceinline__ O convert(I v) { return from_f64<O>(to_f64(v)); }
// Exact paths that must not go through double (i64 -> i32 does, to
// saturate as the CPU's `as` does).
template <> __device__ __forceinline__ i64 convert<i64, i64>(i64 v) { return v; }
template <> __device__ __forceinline__ i64 convert<int, i64>(int v) { return (i64)v; }
template <> __device__ __forceinline__ float convert<tapir_f16, float>(tapir_f16 v) { return to_acc(v); }
template <> __device__ __forceinline__ float convert<tapir_bf16, float>(tapir_bf16 v) { return to_acc(v); }
template <> __device__ __forceinline__ tapir_f16 convert<float, tapir_f16>(float v) { return from_acc<tapir_f16>(v); }
template <> __device__ __forceinline__ tapir_bf16 convert<float, tapir_bf16>(float v) { return from_acc<tapir_bf16>(v); }

template <typename I, typename O>
__device__ __forceinline__ void cast(i64 n, const I* x, O* out) {
    for (i64 i = global_id(); i < n; i += global_stride()) out[i] = convert<I, O>(x[i]);
}

#define CAST(I, IS, O, OS) \
    extern "C" __global__ void cast_##IS##_##OS(i64 n, const I* x, O* out) { cast<I, O>(n, x, out); }
#define CAST_FROM(I, IS)            \
    CAST(I, IS, float, f32)         \
    CAST(I, IS, double, f64)        \
    CAST(I, IS, tapir_f16, f16)     \
    CAST(I, IS, tapir_bf16, bf16)   \
    CAST(I, IS, int, i32)           \
    CAST(I, IS, i64, i64)

CAST_FROM(float, f32)
CAST_FROM(double, f64)
CAST_FROM(tapir_f16, f16)
CAST_FROM(tapir_bf16, bf16)
CAST_FROM(int, i32)
CAST_FROM(i64, i64)
