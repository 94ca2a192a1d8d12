//! A small, explicit, seeded random generator, so every run is reproducible.

use crate::storage::{try_vec, CpuElement};
use crate::{with_dtype, DType, Element, Result, Shape, Tensor};

/// xoshiro256++ seeded through SplitMix64. Pass it explicitly: there is no
/// hidden global generator in tapir.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
    spare_normal: Option<f64>,
}

impl Rng {
    /// A generator from a seed; the same seed gives the same stream.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng { s: [next(), next(), next(), next()], spare_normal: None }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let r = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        self.spare_normal = Some(r * th.sin());
        r * th.cos()
    }

    /// A tensor of `shape` whose elements, in row-major order, are `draw`'s
    /// successive values converted to `dtype`. A shape whose size overflows
    /// is an [`Error::InvalidShape`](crate::Error::InvalidShape) naming `op`,
    /// one that cannot be allocated an
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory); no number is drawn
    /// then.
    fn generate(
        &mut self,
        op: &'static str,
        shape: Shape,
        dtype: DType,
        mut draw: impl FnMut(&mut Rng) -> f64,
    ) -> Result<Tensor> {
        let n = shape.check(op, dtype)?;
        let buf = with_dtype!(dtype, T => {
            let mut v = try_vec(n)?;
            v.extend((0..n).map(|_| T::from_f64(draw(self))));
            T::wrap(v)
        });
        Tensor::from_buffer(buf, shape)
    }

    /// A tensor uniform in `[lo, hi)`.
    pub fn uniform(&mut self, shape: impl Into<Shape>, lo: f64, hi: f64, dtype: DType) -> Result<Tensor> {
        self.generate("uniform", shape.into(), dtype, |r| lo + (hi - lo) * r.next_f64())
    }

    /// A tensor uniform in `[0, 1)`.
    pub fn rand(&mut self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        self.uniform(shape, 0.0, 1.0, dtype)
    }

    /// A tensor of standard normals.
    pub fn randn(&mut self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        self.normal_tensor(shape, 0.0, 1.0, dtype)
    }

    /// A tensor of normals with `mean` and `std`.
    pub fn normal_tensor(&mut self, shape: impl Into<Shape>, mean: f64, std: f64, dtype: DType) -> Result<Tensor> {
        self.generate("normal", shape.into(), dtype, |r| mean + std * r.normal())
    }

    /// A tensor of integers uniform in `0..n`, as `dtype` (i32/i64 labels).
    pub fn randint(&mut self, shape: impl Into<Shape>, n: u64, dtype: DType) -> Result<Tensor> {
        self.generate("randint", shape.into(), dtype, |r| r.below(n.max(1)) as f64)
    }
}
