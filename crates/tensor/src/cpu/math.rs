//! Scalar kernels written so the compiler can vectorise them.

/// e^x for f32 in straight-line code (no libm call, no branches), so loops
/// over slices vectorise. Cody-Waite range reduction and a degree-6
/// polynomial: within 2 ulp of the correctly rounded result on the normal
/// range; exactly 0 below -87.3 (so -inf gives 0) and +inf above 88.7.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.0, 88.5);
    // Round x / ln 2 to an integer n with the magic-number trick; n's bits
    // are then read straight from the sum, with no float-to-int conversion
    // (which would keep the loop from vectorising).
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (0.166_666_67 + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_889)))));
    let scale = f32::from_bits(((ni + 127) << 23) as u32);
    let y = p * scale;
    if x < -87.3 {
        0.0
    } else if x > 88.7 {
        f32::INFINITY
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// tanh for f32 in straight-line code, so loops over slices vectorise:
/// `x P(x^2) / Q(x^2)` with `P` of degree 6 and `Q` of degree 3, fitted
/// here (iteratively reweighted least squares towards the smallest largest
/// relative error; 7e-9 in f64 on `|x| <= 9`, beyond which tanh rounds to
/// +-1 in f32). Evaluated in f32 it is within 6 ulp of the correctly
/// rounded result, and within 1 ulp for 91% of inputs; the largest errors
/// are just below 1, where an ulp is 6e-8. About 25 vector operations and
/// one division: about half the time of the `1 - 2 / (e^2x + 1)` on
/// [`exp_f32`] it replaced (docs/performance.md).
/// `P(0) = Q(0) = 1`, so tiny inputs come back unchanged, and odd symmetry
/// is exact.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.clamp(-9.0, 9.0);
    let z = a * a;
    let p = 1.0
        + z * (0.130_840_5
            + z * (3.104e-3
                + z * (1.115_474_5e-5 + z * (-2.022_687_4e-8 + z * (5.278_669_5e-11 + z * -8.490_37e-14)))));
    let q = 1.0 + z * (0.464_173_76 + z * (2.449_535_4e-2 + z * 2.546_207_7e-4));
    (a * p / q).clamp(-1.0, 1.0)
}

/// `R` of [`tanh_f64`], lowest degree first.
const TANH_R: [f64; 13] = [
    -0.33333333333333043,
    0.13333333333297584,
    -0.05396825395269176,
    0.021869488193943465,
    -0.008863231075479283,
    0.0035920906103847953,
    -0.0014556206820502014,
    0.0005891723251656551,
    -0.00023669208384345097,
    9.194465960343677e-5,
    -3.2059183285399925e-5,
    8.550287790612008e-6,
    -1.2338478071310297e-6,
];

/// `P` of [`exp_f64_reduced`], lowest degree first.
const EXP_P: [f64; 10] = [
    0.5000000000000011,
    0.16666666666666413,
    0.041666666666530135,
    0.008333333333494461,
    0.0013888888943636504,
    0.00019841269506604375,
    2.4801493092719666e-5,
    2.7557586334998063e-6,
    2.763025044937028e-7,
    2.5000077509076688e-8,
];

/// `c[0] + x (c[1] + x (c[2] + ...))`, unrolled by the compiler.
#[inline(always)]
fn horner<const N: usize>(c: &[f64; N], x: f64) -> f64 {
    let (last, rest) = c.split_last().expect("a polynomial has a coefficient");
    rest.iter().rev().fold(*last, |p, &c| c + x * p)
}

/// tanh for f64 in straight-line code, so loops over slices vectorise
/// (libm's `tanh` is a call per element, a third of an f64 PINN
/// evaluation's time). Below `|x| = 0.8` it is `x + x z R(z)` with
/// `z = x^2` and `R` of degree 12 in `z`; above, `1 - 2 / (e^(2|x|) + 1)`
/// with the sign of `x`, `e^(2|x|)` from `exp_f64_reduced`. Every lane
/// computes both and keeps one. `R` and `exp_f64_reduced`'s polynomial
/// were fitted here (weighted least squares iterated towards the smallest
/// largest error, in 40-digit arithmetic: `|z (R - f)|` relative to tanh
/// under 2^-56.9 on `z <= 0.64`, where `f(z) = (tanh sqrt z - sqrt z) /
/// z^1.5`). Within 1.03 ulp of the exact value on a sample of 105,000
/// inputs across `(0, 20]` checked in 40 digits, 92% of them correctly
/// rounded (glibc's `tanh` on the same sample: 2.10 ulps, 71%); the tests
/// hold it within 2 ulps of glibc's on 420,000 inputs.
/// `scripts/fit-tanh-f64.py` fits both polynomials and runs that check.
/// Odd symmetry is exact, tiny inputs come back unchanged, `|x| >= 19.1`
/// gives +-1, NaN stays NaN (docs/performance.md).
#[inline(always)]
pub fn tanh_f64(x: f64) -> f64 {
    // On |x|, the sign put back at the end: exact odd symmetry, and -0
    // stays -0.
    let a = x.abs();
    let z = a * a;
    let small = a + a * (z * horner(&TANH_R, z));
    // `clamp` keeps a NaN; 20 is past where tanh rounds to 1.
    let e = exp_f64_reduced(2.0 * a.clamp(0.0, 20.0));
    let big = 1.0 - 2.0 / (e + 1.0);
    let y = if a < 0.8 { small } else { big };
    y.copysign(x)
}

/// e^y for f64 `y` in [-700, 700] (no range checks: the callers clamp),
/// in straight-line code: `y = n ln 2 + r` with `n` rounded by the
/// magic-number trick and `ln 2 = LN2_HI + LN2_LO` (`LN2_HI` has 32
/// significant bits, so `n LN2_HI` is exact), then `e^r = 1 + r + r^2 P(r)`
/// with `P` of degree 9 fitted on `|r| <= ln 2 / 2` (`r^2 |P - g| e^-r`
/// under 2^-57.9), times `2^n` built from `n`'s bits.
#[inline(always)]
fn exp_f64_reduced(y: f64) -> f64 {
    const LN2_HI: f64 = 0.6931471803691238;
    const LN2_LO: f64 = 1.9082149292705877e-10;
    const MAGIC: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52: adding it rounds to an integer
    let t = y * std::f64::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let ni = (t.to_bits() as i64).wrapping_sub(MAGIC.to_bits() as i64);
    let r = (y - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + (r + (r * r) * horner(&EXP_P, r));
    p * f64::from_bits((ni.wrapping_add(1023) << 52) as u64)
}

/// Picks the vectorisable kernels: both tanh are straight-line code; e^x
/// is for f32, libm's for f64.
pub(crate) trait Fast: Sized {
    fn fast_exp(self) -> Self;
    fn fast_tanh(self) -> Self;
}

impl Fast for f32 {
    #[inline(always)]
    fn fast_exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn fast_tanh(self) -> Self {
        tanh_f32(self)
    }
}

impl Fast for f64 {
    #[inline(always)]
    fn fast_exp(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn fast_tanh(self) -> Self {
        tanh_f64(self)
    }
}

/// The error function to about 1e-14, by its Maclaurin series near zero and
/// its asymptotic expansion in the tails.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        return f64::NAN;
    }
    let r = if a < 4.0 {
        // erf x = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let x2 = a * a;
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            // `<=` so that x = 0 (every term zero) terminates too.
            if add.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        // erfc x ~ e^(-x^2) / (x sqrt(pi)) * sum (-1)^n (2n-1)!! / (2x^2)^n
        let x2 = a * a;
        let (mut term, mut sum) = (1.0, 1.0);
        for n in 1..12 {
            term *= -((2 * n - 1) as f64) / (2.0 * x2);
            sum += term;
        }
        1.0 - (-x2).exp() / (a * std::f64::consts::PI.sqrt()) * sum
    } else {
        1.0
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_f32_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -10.0f32;
        while x < 10.0 {
            let (a, b) = (tanh_f32(x) as f64, (x as f64).tanh());
            worst = worst.max((a - b).abs() / b.abs().max(1e-30));
            x += 0.000_731;
        }
        assert!(worst < 6e-7, "worst relative error {worst}");
        // Distance in ulp from the correctly rounded value, odd symmetry,
        // and never past +-1 (1 - tanh^2 is a derivative).
        let mut worst_ulp = 0i64;
        let mut x = 1e-6f32;
        while x < 12.0 {
            let y = tanh_f32(x);
            let want = (x as f64).tanh() as f32;
            worst_ulp = worst_ulp.max((y.to_bits() as i64 - want.to_bits() as i64).abs());
            assert_eq!(tanh_f32(-x), -y);
            assert!(y <= 1.0);
            x = (x * 1.000_01).max(x + 1e-7);
        }
        assert!(worst_ulp <= 6, "worst error {worst_ulp} ulp");
        assert_eq!(tanh_f32(0.0), 0.0);
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(1e-30), 1e-30);
    }

    /// Ulps between two f64 of the same sign.
    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn tanh_f64_is_within_two_ulps_of_libm_and_one_of_the_exact_value() {
        // Dense where both branches meet and where tanh bends, then
        // geometric from the subnormals to past where it rounds to 1.
        let dense = (0..400_000).map(|i| i as f64 * 7.5e-6);
        let mut geometric = Vec::new();
        let mut x = 1e-310f64;
        while x < 30.0 {
            geometric.push(x);
            x *= 1.000_37;
        }
        let mut worst = (0, 0.0);
        for x in dense.chain(geometric) {
            let y = tanh_f64(x);
            let d = ulps(y, x.tanh());
            if d > worst.0 {
                worst = (d, x);
            }
            assert_eq!(tanh_f64(-x).to_bits(), (-y).to_bits(), "odd at {x}");
            assert!(y <= 1.0, "tanh {x} = {y}");
        }
        assert!(worst.0 <= 2, "{} ulps from libm at {}", worst.0, worst.1);
        // Correctly rounded values (50 digits): within one ulp each, on
        // both sides of the switch at 0.8.
        for (x, want) in [
            (0.3, 0.2913126124515909),
            (0.5, 0.46211715726000974),
            (0.7999999999999999, 0.6640367702678489),
            (0.8, 0.664036770267849),
            (1.0, 0.7615941559557649),
            (2.0, 0.9640275800758169),
            (5.0, 0.9999092042625951),
            (18.5, 0.9999999999999998),
        ] {
            assert!(ulps(tanh_f64(x), want) <= 1, "tanh {x} = {} against {want}", tanh_f64(x));
        }
        assert_eq!(tanh_f64(0.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(tanh_f64(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(tanh_f64(1e-300), 1e-300);
        assert_eq!(tanh_f64(5e-324), 5e-324);
        assert_eq!(tanh_f64(19.1), 1.0);
        assert_eq!(tanh_f64(f64::INFINITY), 1.0);
        assert_eq!(tanh_f64(f64::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f64(1e300), 1.0);
        assert!(tanh_f64(f64::NAN).is_nan());
        assert!(tanh_f64(-f64::NAN).is_nan());
    }

    #[test]
    fn exp_f32_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_f32(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-1e4), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }
}
