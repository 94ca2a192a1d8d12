//! Run-time choice of vector instructions for the CPU kernels.
//!
//! The crate is built for the baseline x86-64 target (SSE2), so a loop the
//! compiler vectorises works on four f32 lanes with no fused multiply-add.
//! [`run`] executes a kernel body compiled again inside a
//! `#[target_feature]` copy for AVX-512 or AVX2 + FMA, whichever the
//! processor has: the body is an `#[inline(always)]` closure, so its loops
//! (and the scalar math they call, such as [`tanh_f32`](crate::cpu::math::tanh_f32))
//! are vectorised for the wider registers (docs/performance.md: several
//! times faster for a tanh).
//!
//! Results do not depend on the copy that runs: Rust never contracts
//! `a * b + c` into a fused multiply-add on its own, so each element sees
//! the same operations in the same order whatever the lane width. (Kernels
//! whose lane count would change a reduction's order, the row kernels, fix
//! their lanes per element type instead.)

/// Which compiled copy of the kernels this processor runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The build's baseline (SSE2 on x86-64, anything elsewhere).
    Portable,
    /// AVX2 with FMA.
    Avx2,
    /// AVX-512 Foundation (with AVX2 and FMA).
    Avx512,
}

impl Isa {
    /// The name `TAPIR_CPU_ISA` takes for this copy.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The copy named `s` (`avx512`, `avx2` or `portable`, any case).
    pub fn parse(s: &str) -> Option<Isa> {
        [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// The widest instruction set this processor supports, lowered to
/// `TAPIR_CPU_ISA` where that names a narrower one (`avx2` or `portable`:
/// how an AVX-512 machine runs the code an AVX2-only one would, for
/// measuring it; a wider name than the processor has changes nothing).
/// Every CPU kernel that picks a copy asks here, the narrow matrix
/// products included. Cached: each call is a few loads and tests.
pub fn isa() -> Isa {
    detected().min(cap())
}

/// What the processor supports (the standard library's detection caches it).
fn detected() -> Isa {
    // Miri interprets the portable copy only: it does not run the vector
    // intrinsics, and the unsafe code it checks is the same in every copy.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
        if avx2 && std::arch::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if avx2 {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// `TAPIR_CPU_ISA`, read once; unset is no limit, and a value that names
/// no copy is reported once on stderr and ignored.
fn cap() -> Isa {
    static CAP: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("TAPIR_CPU_ISA") {
        Err(_) => Isa::Avx512,
        Ok(v) => Isa::parse(&v).unwrap_or_else(|| {
            eprintln!("tapir: TAPIR_CPU_ISA={v:?} names no instruction set (avx512, avx2 or portable); ignored");
            Isa::Avx512
        }),
    })
}

/// Runs `body` compiled for the widest instruction set present. Pass an
/// `#[inline(always)]` closure so the body is compiled into each copy:
///
/// ```
/// use tapir_tensor::cpu::simd;
/// let xs = vec![0.5f32; 1000];
/// let mut ys = vec![0.0f32; 1000];
/// simd::run(#[inline(always)] || {
///     for (y, &x) in ys.iter_mut().zip(&xs) {
///         *y = x * 2.0 + 1.0;
///     }
/// });
/// assert_eq!(ys[999], 2.0);
/// ```
#[inline(always)]
pub fn run<R>(body: impl FnOnce() -> R) -> R {
    run_on(isa(), body)
}

/// [`run`] with the copy chosen by the caller; an `isa` wider than the
/// processor supports runs the widest supported copy instead. Tests use it
/// to compare the copies.
#[inline(always)]
pub fn run_on<R>(isa: Isa, body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        fn avx512<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        match isa.min(self::isa()) {
            // SAFETY: `self::isa()` detected the features each copy was
            // compiled for.
            Isa::Avx512 => return unsafe { avx512(body) },
            Isa::Avx2 => return unsafe { avx2(body) },
            Isa::Portable => {}
        }
    }
    let _ = isa;
    body()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::math::{exp_f32, tanh_f32};

    fn map(isa: Isa, xs: &[f32], f: impl Fn(f32) -> f32) -> Vec<u32> {
        let mut out = vec![0.0f32; xs.len()];
        run_on(
            isa,
            #[inline(always)]
            || {
                for (o, &x) in out.iter_mut().zip(xs) {
                    *o = f(x);
                }
            },
        );
        out.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn isa_names_round_trip() {
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse(" AVX2 "), Some(Isa::Avx2));
        assert_eq!(Isa::parse("sse4"), None);
        assert!(isa() <= detected());
    }

    /// Every copy gives the same bits as the portable build.
    #[test]
    fn copies_agree_bit_for_bit() {
        let xs: Vec<f32> = (0..4099).map(|i| (i as f32 - 2049.0) * 0.013).chain([f32::NAN, 1e-30, -0.0]).collect();
        for f in [tanh_f32 as fn(f32) -> f32, exp_f32, |x: f32| x * 1.5 + 0.25, |x: f32| 1.0 / (1.0 + exp_f32(-x))] {
            let base = map(Isa::Portable, &xs, f);
            for isa in [Isa::Avx2, Isa::Avx512] {
                assert_eq!(map(isa, &xs, f), base, "{isa:?}");
            }
        }
        println!("processor runs {:?}", isa());
    }

    /// The same for the f64 tanh, whose two branches every lane computes.
    #[test]
    fn f64_tanh_copies_agree_bit_for_bit() {
        use crate::cpu::math::tanh_f64;
        let xs: Vec<f64> =
            (0..8191).map(|i| (i as f64 - 4095.0) * 0.0061).chain([f64::NAN, 1e-300, -0.0, 1e300]).collect();
        let map = |isa| {
            let mut out = vec![0.0f64; xs.len()];
            run_on(
                isa,
                #[inline(always)]
                || {
                    for (o, &x) in out.iter_mut().zip(&xs) {
                        *o = tanh_f64(x);
                    }
                },
            );
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let base = map(Isa::Portable);
        for isa in [Isa::Avx2, Isa::Avx512] {
            assert_eq!(map(isa), base, "{isa:?}");
        }
    }
}
