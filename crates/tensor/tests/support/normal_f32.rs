//! The f32 Box-Muller of `kernels/random.cu` (`minus_two_log_u1`,
//! `sincos_turn`, `box_muller_f32`), operation for operation: the same
//! words in, the same roundings (`mul_add` is the kernel's `fma.rn.f32`,
//! `as f32` of an integer its `cvt.rn.f32.s32`, `as i32` of a float its
//! `cvt.rni.s32.f32` on these integer-valued floats), so the same bits out.
//! `tests/random.rs` checks that against the kernel on the device, and
//! against f64 on a sample of the inputs; `examples/normal_f32_bounds.rs`
//! checks every input. The f64 references compute the same exact
//! reductions in f64, so they are the functions' values to within 2^-50.

#![allow(dead_code)]

/// 2^-31 and -2^-31, exact.
const TWO_M31: f32 = 1.0 / 2_147_483_648.0;
/// The coefficients of `T` (degree 8, constant term first) in
/// `-2 ln u1 = j 2 ln 2 + g + g^2 T(g) + g_lo`.
const T: [u32; 9] = [
    0x3E80_0001,
    0x3DAA_AA6E,
    0x3CFF_FDD5,
    0x3C4C_F292,
    0x3BAB_010D,
    0x3B0E_B589,
    0x3A74_FC07,
    0x3A12_D6E6,
    0x398C_E4C4,
];
/// `2 ln 2` rounded to f32.
const TWO_LN2: u32 = 0x3FB1_7218;
/// `cos = 1 + v^2 (c1 + c2 v^2 + c3 v^4 + c4 v^6)`.
const C: [u32; 4] = [0xBE9D_E9E6, 0x3C81_E0D8, 0xB9AA_D95B, 0x366A_7BF7];
/// `sin = s0 v + v (s0_lo + v^2 (s1 + s2 v^2 + s3 v^4))`, `s0 + s0_lo` =
/// pi / 4 to within 2^-50.
const S: [u32; 4] = [0x3F49_0FDB, 0xBDA5_5DDF, 0x3B23_2FD6, 0xB816_DAD3];
const S0_LO: u32 = 0xB2BB_BD2E;
/// `(pi / 4) 2^-31` and `-(pi / 4)^2 2^-31`, the remainder's angle and its
/// product with `pi / 4`.
const E1: u32 = 0x2FC9_0FDB;
const E2: u32 = 0xAF9D_E9E6;

fn f(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// `-2 ln u1` for `u1 = (x0 + 1) 2^-32`, as the kernel computes it.
pub fn minus_two_log_u1(x0: u32) -> f32 {
    let j = (x0 - (x0 >> 2)).leading_zeros();
    // PTX's shl clamps the shift: by 32, 0.
    let big_f = x0.wrapping_add(1).checked_shl(j).unwrap_or(0) as i32;
    let hf = big_f as f32;
    let lf = big_f.wrapping_sub(hf as i32) as f32;
    let (g, gl) = (hf * -TWO_M31, lf * -TWO_M31);
    let g2 = g * g;
    let mut t = g.mul_add(f(T[8]), f(T[7]));
    for k in (0..7).rev() {
        t = t.mul_add(g, f(T[k]));
    }
    let p = g + g2.mul_add(t, gl);
    (j as f32).mul_add(f(TWO_LN2), p)
}

/// `-2 ln u1` in f64 (`u1` is exact in f64).
pub fn minus_two_log_u1_f64(x0: u32) -> f64 {
    -2.0 * ((f64::from(x0) + 1.0) * 2f64.powi(-32)).ln()
}

/// `(cos t, sin t)` for `t = 2 pi x1 2^-32`, as the kernel computes them.
pub fn cos_sin_turn(x1: u32) -> (f32, f32) {
    let i = (x1 << 2) as i32;
    let hf = i as f32;
    let lf = i.wrapping_sub(hf as i32) as f32;
    let v = hf * TWO_M31;
    let v2 = v * v;
    let (e, e2) = (lf * f(E1), lf * f(E2));
    let q = v2.mul_add(f(C[3]), f(C[2])).mul_add(v2, f(C[1])).mul_add(v2, f(C[0]));
    let c = v.mul_add(v.mul_add(q, e2), 1.0);
    let q = v2.mul_add(f(S[3]), f(S[2])).mul_add(v2, f(S[1]));
    let q = v2.mul_add(q, f(S0_LO));
    let x = e.mul_add(c, v * q);
    let s = v.mul_add(f(S[0]), x);
    let (sign1, sign0) = (x1.wrapping_add(0x2000_0000), x1.wrapping_add(0x6000_0000));
    let (a, b) = if (sign1 << 1) as i32 >= 0 { (c, s) } else { (s, c) };
    (flip_sign(sign0, a), flip_sign(sign1, b))
}

/// `(cos t, sin t)` in f64 from the same exact reduction: the quadrant
/// `q = (x1 + 2^29) >> 30` and the rest `(pi / 4) i 2^-31`, `i = x1 << 2`
/// read as signed (exact in f64).
pub fn cos_sin_turn_f64(x1: u32) -> (f64, f64) {
    let i = (x1 << 2) as i32;
    let (s, c) = (f64::from(i) * (std::f64::consts::FRAC_PI_4 * 2f64.powi(-31))).sin_cos();
    match x1.wrapping_add(0x2000_0000) >> 30 {
        0 => (c, s),
        1 => (-s, c),
        2 => (-c, -s),
        _ => (s, -c),
    }
}

/// `x` with its sign flipped where bit 31 of `m` is set (the kernel's lop3).
fn flip_sign(m: u32, x: f32) -> f32 {
    f32::from_bits((m & 0x8000_0000) ^ x.to_bits())
}

/// One pair of f32 normals from words `x0` and `x1`, as the kernel computes
/// them: `mean + std r cos t` and `mean + std r sin t`.
pub fn box_muller_f32(x0: u32, x1: u32, mean: f32, std: f32) -> (f32, f32) {
    let sr = std * minus_two_log_u1(x0).sqrt();
    let (c, s) = cos_sin_turn(x1);
    (sr.mul_add(c, mean), sr.mul_add(s, mean))
}

/// `|got - want|` in ulps of f32 at `want` (`want` not zero).
pub fn ulps(got: f32, want: f64) -> f64 {
    (f64::from(got) - want).abs() / 2f64.powi(want.abs().log2().floor() as i32 - 23)
}
