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

// f32 <-> f16 and bf16, the casts of mixed precision: four elements a
// thread, one 16-byte access on the f32 side and one 8-byte access on the
// 2-byte side, so that a warp's requests cover whole sectors on both (two
// 16-byte f32 loads a lane would leave every request half used), when the
// buffers are so aligned; the rest element by element.
template <typename H> __device__ __forceinline__ bool narrow16(i64 n, const float* x, H* out) {
    if (!aligned16(x) || ((u64)out & 7) != 0) return false;
    const i64 packs = n / 4;
    for (i64 k = global_id(); k < packs; k += global_stride()) {
        float v[4];
        Pack16<float>::unpack(((const uint4*)x)[k], v);
        ((uint2*)out)[k] = make_uint2(Pack16Half<H>::pack_word(v), Pack16Half<H>::pack_word(v + 2));
    }
    for (i64 i = packs * 4 + global_id(); i < n; i += global_stride()) out[i] = from_acc<H>(x[i]);
    return true;
}
template <typename H> __device__ __forceinline__ bool widen16(i64 n, const H* x, float* out) {
    if (((u64)x & 7) != 0 || !aligned16(out)) return false;
    const i64 packs = n / 4;
    for (i64 k = global_id(); k < packs; k += global_stride()) {
        uint2 r = ((const uint2*)x)[k];
        float v[4];
        Pack16Half<H>::unpack_word(r.x, v);
        Pack16Half<H>::unpack_word(r.y, v + 2);
        ((uint4*)out)[k] = Pack16<float>::pack(v);
    }
    for (i64 i = packs * 4 + global_id(); i < n; i += global_stride()) out[i] = to_acc(x[i]);
    return true;
}
template <typename I, typename O> __device__ __forceinline__ bool cast16(i64, const I*, O*) { return false; }
template <> __device__ __forceinline__ bool cast16<float, tapir_f16>(i64 n, const float* x, tapir_f16* out) {
    return narrow16(n, x, out);
}
template <> __device__ __forceinline__ bool cast16<float, tapir_bf16>(i64 n, const float* x, tapir_bf16* out) {
    return narrow16(n, x, out);
}
template <> __device__ __forceinline__ bool cast16<tapir_f16, float>(i64 n, const tapir_f16* x, float* out) {
    return widen16(n, x, out);
}
template <> __device__ __forceinline__ bool cast16<tapir_bf16, float>(i64 n, const tapir_bf16* x, float* out) {
    return widen16(n, x, out);
}

template <typename I, typename O>
__device__ __forceinline__ void cast(i64 n, const I* x, O* out) {
    if (cast16<I, O>(n, x, out)) return;
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
