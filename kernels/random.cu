// Random tensors from a Philox 4x32-10 stream, element for element the
// numbers the CPU's `Rng` gives (crates/tensor/src/rng.rs documents the
// layout): block `b` of the stream is philox([lo(b), hi(b), 0, 0], key),
// each thread computes whole blocks, so no state is shared.
//
// uniform_<dt>(n, k0, k1, offset, lo, scale, out) and
// normal_<dt>(n, k0, k1, offset, mean, std, out) for dt in f32, f64, f16,
// bf16; randint_i64(n, k0, k1, offset, range, out). Keys are the 32-bit
// halves of the seed passed as ints; `offset` is the draw's first block.
//
// Arithmetic that must match the CPU bit for bit uses the explicitly
// rounded intrinsics (__fmul_rn, __dadd_rn, ...), which the compiler never
// contracts into a fused multiply-add. Uniforms and randint are the CPU's
// bit for bit; f64 normals compute in f64 as the CPU does, f32 normals in
// f32 with tapir's own polynomials (within 4 ulps of the CPU's, which
// computes them in f64), f16 and bf16 normals in f32 with the
// special-function instructions (within 1 ulp).

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

struct Words { unsigned w[4]; };

// The ten rounds' keys: k0 + r W0 and k1 + r W1 are the same for every
// block of a draw, so a thread computes them once, before its loop.
struct RoundKeys { unsigned k0[10], k1[10]; };

__device__ __forceinline__ RoundKeys round_keys(unsigned k0, unsigned k1) {
    RoundKeys k;
    // Opaque to the compiler, so round 0 does not load the parameters again.
    asm("" : "+r"(k0), "+r"(k1));
    k.k0[0] = k0;
    k.k1[0] = k1;
#pragma unroll
    for (int r = 1; r < 10; ++r) {
        // Through asm, so that the compiler keeps the sums in registers
        // rather than computing them again from the parameters in the loop;
        // each into a register of its own (an add, where "+r" was a move
        // and an add).
        asm("add.u32 %0, %1, %2;" : "=r"(k.k0[r]) : "r"(k.k0[r - 1]), "n"(PHILOX_W0));
        asm("add.u32 %0, %1, %2;" : "=r"(k.k1[r]) : "r"(k.k1[r - 1]), "n"(PHILOX_W1));
    }
    return k;
}

// a ^ b ^ c in one instruction (`lop3.b32`, truth table 0x96), where C
// would issue two xors.
__device__ __forceinline__ unsigned xor3(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The high half of m x a for a constant m, taken as an immediate operand
// (the compiler would move it into a register first, an instruction more).
template <unsigned M> __device__ __forceinline__ unsigned mulhi_by(unsigned a) {
    unsigned d;
    asm("mul.hi.u32 %0, %1, %2;" : "=r"(d) : "r"(a), "n"(M));
    return d;
}

__device__ __forceinline__ Words philox_block(u64 b, const RoundKeys& k) {
    // Round 0 has c2 = c3 = 0, so one product and two xors; round 1 has c1 = 0.
    // The counter's halves in one move (a cast and a shift are three).
    unsigned c0, c1;
    asm("mov.b64 {%0, %1}, %2;" : "=r"(c0), "=r"(c1) : "l"(b));
    unsigned c2 = mulhi_by<PHILOX_M0>(c0) ^ k.k1[0], c3 = PHILOX_M0 * c0;
    c0 = c1 ^ k.k0[0];
    {
        unsigned hi0 = mulhi_by<PHILOX_M0>(c0), lo0 = PHILOX_M0 * c0;
        unsigned hi1 = mulhi_by<PHILOX_M1>(c2), lo1 = PHILOX_M1 * c2;
        c0 = hi1 ^ k.k0[1];
        c1 = lo1;
        c2 = xor3(hi0, c3, k.k1[1]);
        c3 = lo0;
    }
#pragma unroll
    for (int r = 2; r < 10; ++r) {
        unsigned hi0 = mulhi_by<PHILOX_M0>(c0), lo0 = PHILOX_M0 * c0;
        unsigned hi1 = mulhi_by<PHILOX_M1>(c2), lo1 = PHILOX_M1 * c2;
        unsigned n0 = xor3(hi1, c1, k.k0[r]), n2 = xor3(hi0, c3, k.k1[r]);
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    Words out;
    out.w[0] = c0;
    out.w[1] = c1;
    out.w[2] = c2;
    out.w[3] = c3;
    return out;
}

__device__ __forceinline__ u64 join_words(unsigned hi, unsigned lo) { return ((u64)hi << 32) | (u64)lo; }
// Words 2j and 2j + 1 of a block as one u64, the first the high half.
__device__ __forceinline__ u64 word_pair(Words w, int j) { return join_words(w.w[2 * j], w.w[2 * j + 1]); }
// The top 53 bits as a fraction in [0, 1).
__device__ __forceinline__ double unit53(u64 x) { return __dmul_rn((double)(x >> 11), 0x1p-53); }

// Significand bits of a narrow dtype: u = x 2^-d, x the top d bits of a
// word (f32) or of a half-word (f16, bf16), is exact in it and below 1.
template <typename T> struct Digits { enum { d = 24 }; };
template <> struct Digits<tapir_f16> { enum { d = 11 }; };
template <> struct Digits<tapir_bf16> { enum { d = 8 }; };

// One Box-Muller pair from u1 in (0, 1] and u2 in [0, 1), in double.
__device__ __forceinline__ void box_muller(double u1, double u2, double* z) {
    double r = sqrt(__dmul_rn(-2.0, log(u1)));
    double t = __dmul_rn(6.283185307179586, u2), s, c;
    // One argument reduction for both; the same values as sin(t) and cos(t).
    sincos(t, &s, &c);
    z[0] = __dmul_rn(r, c);
    z[1] = __dmul_rn(r, s);
}

// f32 normals from tapir's own polynomials (the CPU computes in f64).
// crates/tensor/tests/support/normal_f32.rs models these functions
// operation for operation; tests/random.rs checks the model against this
// kernel bit for bit, and examples/normal_f32_bounds.rs checks it against
// f64 on every input (docs/gpu-model.md, "Normals from tapir's own
// polynomials"). Each operation is an explicitly rounded intrinsic or an
// `fma` in `asm` with its coefficient as an immediate operand (NVRTC moves
// each constant into a register first, an instruction the emulator counts).
#define FMA_K(d, a, b, K) asm("fma.rn.f32 %0, %1, %2, " K ";" : "=f"(d) : "f"(a), "f"(b))

// -2 ln u1 for u1 = (x0 + 1) 2^-32. With j = clz(x0 - x0 / 4) (about
// clz(3 u1 / 4)), u1 = 2^-j (1 + f), f in [-1/3, 1/3], and f 2^32 is
// exactly the word F = (x0 + 1) << j read as signed (the shift drops the
// leading one; j = 32 shifts to 0, as PTX clamps, x0 = 2^32 - 1 gives
// j = 0 and F = 0). F is split into its f32 rounding and the integer
// remainder, so g = -2 f = g_hi + g_lo exactly, and -2 ln u1 = j 2 ln 2 +
// P(g), P(g) = -2 log1p(-g / 2) = g + g^2 T(g) + g_lo: T a degree-8
// polynomial fitted to minimize |g| times its error (below 2^-26.8 over
// [-0.7, 0.7]), the terms of g_lo past the first below 2^-25 |g_lo|.
__device__ __forceinline__ float minus_two_log_u1(unsigned x0) {
    const unsigned j = __clz(x0 - (x0 >> 2));
    const int F = (int)((x0 + 1u) << j);
    const float hf = __int2float_rn(F);
    const float lf = __int2float_rn(F - __float2int_rn(hf));
    float g, gl, t;
    asm("mul.rn.f32 %0, %1, 0fB0000000;" : "=f"(g) : "f"(hf));  // -2^-31
    asm("mul.rn.f32 %0, %1, 0fB0000000;" : "=f"(gl) : "f"(lf));
    const float g2 = __fmul_rn(g, g);
    asm("fma.rn.f32 %0, %1, 0f398CE4C4, 0f3A12D6E6;" : "=f"(t) : "f"(g));
    FMA_K(t, t, g, "0f3A74FC07");
    FMA_K(t, t, g, "0f3B0EB589");
    FMA_K(t, t, g, "0f3BAB010D");
    FMA_K(t, t, g, "0f3C4CF292");
    FMA_K(t, t, g, "0f3CFFFDD5");
    FMA_K(t, t, g, "0f3DAAAA6E");
    FMA_K(t, t, g, "0f3E800001");
    const float p = __fadd_rn(g, __fmaf_rn(g2, t, gl));
    float l;  // j 2 ln 2 + P (2 ln 2 rounded to f32, within 2^-28 relative)
    asm("fma.rn.f32 %0, %1, 0f3FB17218, %2;" : "=f"(l) : "f"(__uint2float_rn(j)), "f"(p));
    return l;
}

// cos and sin of t = 2 pi x1 2^-32. The quadrant q = (x1 + 2^29) >> 30 and
// the rest i = x1 << 2 read as signed, t = q pi / 2 + (pi / 4) i 2^-31,
// are exact; i is split into its f32 rounding v 2^31 and the integer
// remainder, whose angle e (below 2.4e-8) goes in to first order. On
// v in [-1, 1]: cos = 1 + v^2 Qc(v^2), sin = (pi / 4) v + v^3 Qs(v^2),
// Qc and Qs fitted for the least relative error (2^-31 and 2^-27.9, with
// pi / 4 taken exactly as the sum of two floats). c and s come back as the
// reduced angle's; bit 30 of sign1 (q odd) says they swap, bit 31 of
// sign0 and of sign1 the signs of cos t and sin t.
__device__ __forceinline__ void sincos_turn(unsigned x1, float* c, float* s, unsigned* sign0, unsigned* sign1) {
    const int i = (int)(x1 << 2);
    const float hf = __int2float_rn(i);
    const float lf = __int2float_rn(i - __float2int_rn(hf));
    float v, e, e2, q;
    asm("mul.rn.f32 %0, %1, 0f30000000;" : "=f"(v) : "f"(hf));   // 2^-31
    const float v2 = __fmul_rn(v, v);
    asm("mul.rn.f32 %0, %1, 0f2FC90FDB;" : "=f"(e) : "f"(lf));   // (pi / 4) 2^-31
    asm("mul.rn.f32 %0, %1, 0fAF9DE9E6;" : "=f"(e2) : "f"(lf));  // -(pi / 4)^2 2^-31
    asm("fma.rn.f32 %0, %1, 0f366A7BF7, 0fB9AAD95B;" : "=f"(q) : "f"(v2));
    FMA_K(q, q, v2, "0f3C81E0D8");
    FMA_K(q, q, v2, "0fBE9DE9E6");
    // cos(phi + e) = cos phi - e sin phi, sin phi taken as (pi / 4) v
    // (e2 = -e pi / 4): 1 + v (v Qc + e2), rounded once but for the inner fma.
    asm("fma.rn.f32 %0, %1, %2, 0f3F800000;" : "=f"(*c) : "f"(v), "f"(__fmaf_rn(v, q, e2)));
    // sin(phi + e) = sin phi + e cos phi, with pi / 4 = s_hi + s_lo:
    // s_hi v + (v (s_lo + v^2 Qs) + e cos), rounded once but for the
    // small terms.
    asm("fma.rn.f32 %0, %1, 0fB816DAD3, 0f3B232FD6;" : "=f"(q) : "f"(v2));
    FMA_K(q, q, v2, "0fBDA55DDF");
    FMA_K(q, v2, q, "0fB2BBBD2E");
    const float x = __fmaf_rn(e, *c, __fmul_rn(v, q));
    asm("fma.rn.f32 %0, %1, 0f3F490FDB, %2;" : "=f"(*s) : "f"(v), "f"(x));
    *sign1 = x1 + 0x20000000u;
    *sign0 = x1 + 0x60000000u;
}

// x with its sign flipped where bit 31 of m is set: (m & 2^31) ^ x, one lop3.
__device__ __forceinline__ float flip_sign(unsigned m, float x) {
    float d;
    asm("lop3.b32 %0, %1, 0x80000000, %2, 0x6A;" : "=f"(d) : "r"(m), "f"(x));
    return d;
}

// One Box-Muller pair in f32 from words x0 and x1 (u1 = (x0 + 1) 2^-32,
// u2 = x1 2^-32): mean + std r cos t and mean + std r sin t, r the square
// root of `minus_two_log_u1`, t from `sincos_turn`.
__device__ __forceinline__ void box_muller_f32(unsigned x0, unsigned x1, float mean, float std, float* z) {
    const float sr = __fmul_rn(std, __fsqrt_rn(minus_two_log_u1(x0)));
    float c, s;
    unsigned sign0, sign1;
    sincos_turn(x1, &c, &s, &sign0, &sign1);
    // (a, b) = (c, s), or (s, c) when q is odd: bit 30 tested as the sign
    // of a shift (NVRTC tests a masked bit with a shift, an and and a setp).
    unsigned shifted;
    asm("shl.b32 %0, %1, 1;" : "=r"(shifted) : "r"(sign1));
    const bool odd = (int)shifted < 0;
    const float a = odd ? s : c, b = odd ? c : s;
    z[0] = __fmaf_rn(flip_sign(sign0, sr), a, mean);
    z[1] = __fmaf_rn(flip_sign(sign1, sr), b, mean);
}

// One Box-Muller pair for f16 and bf16, from the special-function unit:
// `lg2`, `sqrt`, `sin` and `cos` as single `.approx` instructions, where
// `box_muller_f32` spends about 55 instructions a pair on the accuracy
// f32 needs (`lg2` and `sqrt` as `.ftz`: their inputs are never
// subnormal, and without it ptxas wraps each in a subnormal test and
// scaling, four SASS instructions for one). Their documented bounds (the
// CUDA C++ Programming Guide's intrinsics table: log2 within 2^-22
// absolute on [0.5, 2] and 2 ulps elsewhere, sin and cos within 2^-21.41
// and 2^-21.19 absolute on [-pi, pi]; sqrt taken as 3 ulps) keep `r cos t`
// and `r sin t` within 2^-16 of the exact values (tests/random.rs checks
// this with every error at its documented worst: 2^-16.75), 32 times
// inside f16's ulp at 0.5, so rounded to the dtype each value is within 1
// ulp of the CPU's. Where u1 is within 2^-10 of 1, lg2's absolute error
// would be most of -2 ln u1 (r's error up to 2^-10.8, and a NaN were lg2
// of 1 to come back above 0): there, with v = 1 - u1 exact in f32,
// -2 ln u1 = 2 v + v^2 instead (the terms left out below 2^-30).
__device__ __forceinline__ void box_muller_sfu(unsigned x0, unsigned x1, float mean, float std, float* z) {
    float u1, l, v, t, s, c;
    // u1 = (x0 + 1) 2^-32: x0 rounded to f32, the 1 added in the fma.
    asm("fma.rn.f32 %0, %1, 0f2F800000, 0f2F800000;" : "=f"(u1) : "f"(__uint2float_rn(x0)));
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(l) : "f"(u1));
    asm("mul.rn.f32 %0, %1, 0fBFB17218;" : "=f"(l) : "f"(l));  // -2 ln 2
    if (x0 >= 0xFFC00000u) {  // 1 - u1 = (2^32 - 1 - x0) 2^-32 < 2^-10
        asm("mul.rn.f32 %0, %1, 0f2F800000;" : "=f"(v) : "f"(__uint2float_rn(~x0)));
        l = __fmaf_rn(v, v, __fadd_rn(v, v));
    }
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(l) : "f"(l));
    const float sr = __fmul_rn(std, l);
    // t = 2 pi x1 2^-32 less a turn for the words past 2^31: in [-pi, pi).
    asm("mul.rn.f32 %0, %1, 0f30C90FDB;" : "=f"(t) : "f"(__int2float_rn((int)x1)));
    asm("sin.approx.f32 %0, %1;" : "=f"(s) : "f"(t));
    asm("cos.approx.f32 %0, %1;" : "=f"(c) : "f"(t));
    z[0] = __fmaf_rn(sr, c, mean);
    z[1] = __fmaf_rn(sr, s, mean);
}

// A block's E elements as one aligned unit, so a thread stores them with one
// vector instruction (16 bytes for f32, f64, i64 and the eight f16 or bf16
// uniforms of a block, 8 for four f16 or bf16 normals). `w` gives its bytes
// as 32-bit words, so two 16-bit elements rounded together (`pack_half2`)
// go in as one word.
template <int E, typename T> union alignas(E * sizeof(T)) DrawUnit {
    T v[E];
    unsigned w[E * sizeof(T) / 4];
};

// A unit to memory as one vector store. Four f32 go as a float4: copied as
// the union, NVRTC stores them as words, a `mov.b32` each first.
template <int E, typename T> __device__ __forceinline__ void store_unit(DrawUnit<E, T>* p, const DrawUnit<E, T>& u) {
    *p = u;
}
template <> __device__ __forceinline__ void store_unit(DrawUnit<4, float>* p, const DrawUnit<4, float>& u) {
    *reinterpret_cast<float4*>(p) = make_float4(u.v[0], u.v[1], u.v[2], u.v[3]);
}

// The loop every draw shares: E elements a block, element i from block
// offset + i / E, each thread taking whole blocks (grid-strided) so no
// state is shared. `values(w, u)` computes a block's E elements from its
// words into the unit `u`; those past n are not stored. A whole block
// goes out in one store when `out` is aligned to the unit (a fresh
// allocation always is): lanes store consecutive units, so a warp's store
// covers whole sectors, where E stores of single elements at a stride of E
// would each touch a sector for a quarter (or half) of its bytes. The
// whole blocks of an aligned draw take a loop of their own; the last,
// partial block (or every block, unaligned) the element loop after it.
template <int E, typename T, typename F>
__device__ __forceinline__ void draw_blocks(i64 n, int k0, int k1, i64 offset, T* out, F values) {
    typedef DrawUnit<E, T> U;
    const i64 blocks = (n + E - 1) / E, whole = n / E;
    const bool aligned = ((u64)out % sizeof(U)) == 0;
    const RoundKeys keys = round_keys((unsigned)k0, (unsigned)k1);
    // In a register: the compiler would load the parameter again each block.
    u64 first = (u64)offset;
    asm("" : "+l"(first));
    i64 b = global_id();
    if (aligned && b < whole) {
        // The unit's address and the block's counter step along with b, and
        // the address alone ends the loop (two adds a block fewer than both
        // from b); the step in bytes through an empty asm, so that NVRTC
        // keeps it in a register rather than shifting the stride each block.
        i64 step = global_stride() * (i64)sizeof(U);
        asm("" : "+l"(step));
        char* p = reinterpret_cast<char*>(out) + b * (i64)sizeof(U);
        char* const end = reinterpret_cast<char*>(out) + whole * (i64)sizeof(U);
        u64 ctr = first + (u64)b;
        do {
            U u;
            values(philox_block(ctr, keys), u);
            store_unit(reinterpret_cast<U*>(p), u);
            p += step;
            ctr += (u64)global_stride();
        } while (p < end);
        b = (i64)(ctr - first);
    }
    for (; b < blocks; b += global_stride()) {
        U u;
        values(philox_block(first + (u64)b, keys), u);
        for (int j = 0; j < E; ++j) {
            if (b * E + j < n) out[b * E + j] = u.v[j];
        }
    }
}

// The arguments every kernel starts with: the element count, the key's
// halves as ints and the draw's first block.
#define DRAW_HEAD i64 n, int k0, int k1, i64 offset

// f32: four elements a block, one a word.
template <typename T>
__device__ void uniform_narrow(DRAW_HEAD, double lo_d, double scale_d, T* out) {
    const float lo = (float)lo_d, scale = (float)scale_d;
    const int d = Digits<T>::d;
    const float unit = 1.0f / (float)(1u << d);
    draw_blocks<4>(n, k0, k1, offset, out, [&](Words w, DrawUnit<4, T>& u) {
        for (int j = 0; j < 4; ++j) {
            float x = __fmul_rn((float)(w.w[j] >> (32 - d)), unit);
            u.v[j] = from_acc<T>(__fadd_rn(lo, __fmul_rn(scale, x)));
        }
    });
}

// f16 and bf16: eight elements a block, two a word: element 2j from the
// high half of word j, 2j + 1 from its low half, each value lo + s x for
// the top d bits x of its half and s = scale 2^-d (exact, so the product
// is scale u rounded once, u = x 2^-d as for f32); a pair rounded to the
// dtype in one conversion and stored as one word.
template <typename T>
__device__ void uniform_half(DRAW_HEAD, double lo_d, double scale_d, T* out) {
    const int d = Digits<T>::d;
    const float lo = (float)lo_d, s = __fmul_rn((float)scale_d, 1.0f / (float)(1u << d));
    draw_blocks<8>(n, k0, k1, offset, out, [&](Words w, DrawUnit<8, T>& u) {
        for (int j = 0; j < 4; ++j) {
            unsigned x1;
            asm("bfe.u32 %0, %1, %2, %3;" : "=r"(x1) : "r"(w.w[j]), "n"(16 - d), "n"(d));
            float v0 = __fadd_rn(lo, __fmul_rn(s, (float)(w.w[j] >> (32 - d))));
            u.w[j] = pack_half2<T>(v0, __fadd_rn(lo, __fmul_rn(s, (float)x1)));
        }
    });
}

// Elements 2p and 2p + 1 of a unit of four: f32 as they are, f16 and bf16
// rounded together into word p.
__device__ __forceinline__ void put_pair(DrawUnit<4, float>& u, int p, float a, float b) {
    u.v[2 * p] = a;
    u.v[2 * p + 1] = b;
}
template <typename T> __device__ __forceinline__ void put_pair(DrawUnit<4, T>& u, int p, float a, float b) {
    u.w[p] = pack_half2<T>(a, b);
}

template <typename T>
__device__ void normal_narrow(DRAW_HEAD, double mean_d, double std_d, T* out) {
    const float mean = (float)mean_d, std = (float)std_d;
    draw_blocks<4>(n, k0, k1, offset, out, [&](Words w, DrawUnit<4, T>& u) {
        for (int p = 0; p < 2; ++p) {
            float z[2];
            if (Digits<T>::d == 24) {
                box_muller_f32(w.w[2 * p], w.w[2 * p + 1], mean, std, z);
            } else {
                box_muller_sfu(w.w[2 * p], w.w[2 * p + 1], mean, std, z);
            }
            put_pair(u, p, z[0], z[1]);
        }
    });
}

#define RANDOM_NARROW(T, S, UNIFORM)                                                                 \
    extern "C" __global__ void uniform_##S(DRAW_HEAD, double lo, double scale, T* out) {            \
        UNIFORM<T>(n, k0, k1, offset, lo, scale, out);                                               \
    }                                                                                                \
    extern "C" __global__ void normal_##S(DRAW_HEAD, double mean, double std, T* out) {             \
        normal_narrow<T>(n, k0, k1, offset, mean, std, out);                                         \
    }

RANDOM_NARROW(float, f32, uniform_narrow)
RANDOM_NARROW(tapir_f16, f16, uniform_half)
RANDOM_NARROW(tapir_bf16, bf16, uniform_half)

// f64: two words an element, two elements a block.
extern "C" __global__ void uniform_f64(DRAW_HEAD, double lo, double scale, double* out) {
    draw_blocks<2>(n, k0, k1, offset, out, [&](Words w, DrawUnit<2, double>& u) {
        for (int j = 0; j < 2; ++j) u.v[j] = __dadd_rn(lo, __dmul_rn(scale, unit53(word_pair(w, j))));
    });
}
extern "C" __global__ void normal_f64(DRAW_HEAD, double mean, double std, double* out) {
    draw_blocks<2>(n, k0, k1, offset, out, [&](Words w, DrawUnit<2, double>& u) {
        double z[2];
        box_muller(__dmul_rn((double)((word_pair(w, 0) >> 11) + 1), 0x1p-53), unit53(word_pair(w, 1)), z);
        for (int j = 0; j < 2; ++j) u.v[j] = __dadd_rn(mean, __dmul_rn(std, z[j]));
    });
}

// Integers uniform in 0..range: (x * range) >> 64 of a 64-bit word pair,
// saturated to i64 (another dtype is a cast of this, as on the CPU).
extern "C" __global__ void randint_i64(DRAW_HEAD, i64 range, i64* out) {
    draw_blocks<2>(n, k0, k1, offset, out, [&](Words w, DrawUnit<2, i64>& u) {
        for (int j = 0; j < 2; ++j) {
            u64 x = __umul64hi(word_pair(w, j), (u64)range);
            u.v[j] = x > 0x7fffffffffffffffull ? 0x7fffffffffffffffll : (i64)x;
        }
    });
}
