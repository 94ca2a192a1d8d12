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

/// Picks the vectorisable kernels for f32 and the libm ones for f64 (whose
/// accuracy the f64 gradient checks rely on).
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
        self.tanh()
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
