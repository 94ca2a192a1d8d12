//! The f16 and bf16 Box-Muller of `kernels/random.cu` (`box_muller_sfu`)
//! with each special-function instruction at the edge of its documented
//! error, so that a test can bound the kernel's error on hardware, where
//! those instructions are not correctly rounded (the emulated device
//! computes them with the host's libm, so it cannot show the worst case).
//!
//! The bounds (the CUDA C++ Programming Guide's table of single-precision
//! intrinsics): `lg2.approx.f32` within 2^-22 absolute for x in [0.5, 2]
//! and 2 ulps elsewhere; `sin.approx.f32` within 2^-21.41 and
//! `cos.approx.f32` within 2^-21.19 absolute on [-pi, pi]. For
//! `sqrt.approx.f32` this model takes 3 ulps, the OpenCL bound NVIDIA
//! states that instruction meets. Every other operation is the kernel's,
//! rounded as it rounds (`mul_add` is `fma.rn.f32`, `as f32` of an integer
//! `cvt.rn.f32`).

#![allow(dead_code)]

/// Which way each approximate instruction errs: `true` adds its largest
/// error, `false` subtracts it.
#[derive(Clone, Copy, Debug)]
pub struct Worst {
    pub lg2: bool,
    pub sqrt: bool,
    pub trig: bool,
}

/// Every combination of the three directions.
pub fn every_worst() -> impl Iterator<Item = Worst> {
    (0..8).map(|k| Worst { lg2: k & 1 != 0, sqrt: k & 2 != 0, trig: k & 4 != 0 })
}

/// The f32 farthest from `exact` in the direction `up` but within `bound`
/// of it: what an instruction with that error bound may return.
fn at_edge(exact: f64, bound: f64, up: bool) -> f32 {
    let target = if up { exact + bound } else { exact - bound };
    let mut y = target as f32;
    // `as f32` rounds to nearest: step back inside the bound when it went past.
    while (f64::from(y) - exact).abs() > bound {
        y = if (f64::from(y) > exact) == (y > 0.0) {
            f32::from_bits(y.to_bits() - 1)
        } else {
            f32::from_bits(y.to_bits() + 1)
        };
    }
    y
}

/// An f32 ulp at `x` (for the ulp-relative bounds).
fn ulp(x: f64) -> f64 {
    2f64.powi(x.abs().max(f64::from(f32::MIN_POSITIVE)).log2().floor() as i32 - 23)
}

/// `r = sqrt(-2 ln u1)` as the kernel computes it for word `x0`, the
/// approximate instructions erring as `w` says.
pub fn radius(x0: u32, w: Worst) -> f32 {
    const TWO_M32: f32 = 1.0 / 4_294_967_296.0;
    let u1 = (x0 as f32).mul_add(TWO_M32, TWO_M32);
    let exact = f64::from(u1).log2();
    let bound = if (0.5..=2.0).contains(&u1) { 2f64.powi(-22) } else { 2.0 * ulp(exact) };
    let mut l = at_edge(exact, bound, w.lg2) * f32::from_bits(0xBFB1_7218);
    if x0 >= 0xFFC0_0000 {
        let v = (!x0) as f32 * TWO_M32;
        l = v.mul_add(v, v + v);
    }
    let exact = f64::from(l).sqrt();
    at_edge(exact, 3.0 * ulp(exact), w.sqrt)
}

/// `(cos t, sin t)` for `t = 2 pi x1 2^-32` as the kernel computes them.
pub fn cos_sin(x1: u32, w: Worst) -> (f32, f32) {
    let t = (x1 as i32) as f32 * f32::from_bits(0x30C9_0FDB);
    let t = f64::from(t);
    (at_edge(t.cos(), 2f64.powi(-21) * 2f64.powf(-0.19), w.trig), at_edge(t.sin(), 2f64.powf(-21.41), w.trig))
}

/// The exact `sqrt(-2 ln u1)` for `u1 = (x0 + 1) 2^-32`.
pub fn radius_f64(x0: u32) -> f64 {
    // u1 = 1 - v, v = (2^32 - 1 - x0) 2^-32 exactly; ln_1p keeps u1 near 1 accurate.
    (-2.0 * (-(f64::from(!x0) * 2f64.powi(-32))).ln_1p()).sqrt()
}

/// The exact `(cos t, sin t)` for `t = 2 pi x1 2^-32`.
pub fn cos_sin_f64(x1: u32) -> (f64, f64) {
    let t = std::f64::consts::TAU * f64::from(x1) * 2f64.powi(-32);
    (t.cos(), t.sin())
}
