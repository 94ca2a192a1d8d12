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

/// tanh for f32 in straight-line code, so loops over slices vectorise: an
/// odd Taylor polynomial near zero (where `1 - 2 / (e^2x + 1)` would cancel)
/// and that formula, on `exp_f32`, elsewhere. Within a few ulp of the
/// correctly rounded result.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    // |x| < 0.25: x (1 - x^2/3 + 2x^4/15 - 17x^6/315 + 62x^8/2835 - 1382x^10/155925)
    let z = a * a;
    let poly =
        1.0 + z * (-0.333_333_34 + z * (0.133_333_33 + z * (-0.053_968_254 + z * (0.021_869_49 + z * -0.008_863_236))));
    let small = a * poly;
    let large = 1.0 - 2.0 / (exp_f32(2.0 * a.min(20.0)) + 1.0);
    let r = if a < 0.25 { small } else { large };
    if x.is_nan() {
        x
    } else {
        r.copysign(x)
    }
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
