//! A small, explicit, seeded random generator, so every run is
//! reproducible, and the same seed gives the same numbers on every device.
//!
//! The generator is counter-based: Philox 4x32-10 (Salmon, Moraes, Dror
//! and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
//! generator PyTorch's CUDA backend and JAX use. Its state is a key (the
//! seed) and a counter; each 128-bit counter value is turned into four
//! 32-bit words by ten rounds of multiplications and xors, so any word of
//! the stream can be computed on its own. A tensor draw on a CUDA device
//! therefore runs on the device, each thread computing its own counters,
//! and gives exactly what the same draw gives on the CPU.
//!
//! # The stream, exactly
//!
//! - The key is the seed: `k0` its low 32 bits, `k1` its high 32 bits.
//! - Block `b` (a `u64`) is the four words `philox(counter = [lo32(b),
//!   hi32(b), 0, 0], key)`. [`Rng::offset`] is the next unused block.
//! - A tensor draw of `n` elements starts at the next unused block (a
//!   block partly used by scalar draws is skipped) and consumes
//!   `ceil(n / e)` blocks, where `e` elements come from one block: `e = 8`
//!   when an element takes half a word (uniform draws of f16 and bf16),
//!   `e = 4` when it takes one (uniform draws of f32, normal draws of f32,
//!   f16 and bf16), `e = 2` when it takes two (f64, and `randint`).
//!   Element `i` reads block `offset + i / e`: with `e = 8`, the high half
//!   (bits 31..16) of word `(i % 8) / 2` when `i` is even and its low half
//!   (bits 15..0) when `i` is odd; otherwise words `w * (i % e) ..` (`w`
//!   words each, the first the high half when `w = 2`).
//! - Uniform `[lo, hi)`: one word `x` gives `u = (x >> (32 - d)) * 2^-d`
//!   with `d` the dtype's significand bits (24 for f32, 11 for f16, 8 for
//!   bf16), so `u < 1` is exact in the dtype; the value is
//!   `lo + (hi - lo) * u` in f32 (each operation rounded, no fused
//!   multiply-add), rounded once to the dtype. f16 and bf16 take `x` from
//!   a 16-bit half, `u = (x >> (16 - d)) * 2^-d`, and compute the product
//!   as `((hi - lo) * 2^-d) * (x >> (16 - d))`, the same rounded product
//!   whenever `(hi - lo) * 2^-d` is exact in f32 (`|hi - lo|` at least
//!   2^-115, or zero). f64 takes the top 53 bits of two words and
//!   computes in f64. Identical, bit for bit, on every device.
//! - Normal (Box-Muller): elements `2p` and `2p + 1` share a pair of
//!   uniforms: `u1 = (x0 + 1) 2^-32` in `(0, 1]` and `u2 = x1 2^-32` (53-bit
//!   fractions of two words each for f64), `r = sqrt(-2 ln u1)`,
//!   `t = 2 pi u2`, and the values `mean + std r cos t` and
//!   `mean + std r sin t` (an odd last element uses the cosine). The CPU
//!   computes them in f64 and rounds to f32 and then to the dtype. CUDA
//!   computes f64 normals in f64: its `log`, `sin` and `cos` are within a
//!   couple of ulps of the correctly rounded results the CPU's libm is
//!   close to, so f64 normals differ by a few ulps (the test measures at
//!   most 6 and allows 8; 86-89% bitwise equal). CUDA computes f32, f16 and bf16
//!   normals in f32 with tapir's own polynomials (`kernels/random.cu`, no
//!   libdevice calls): `-2 ln u1` from `u1 = 2^-j (1 + f)`, `j` and `f 2^32`
//!   exact integers of the word, `j 2 ln 2 + g + g^2 T(g)` for `g = -2f`
//!   (a degree-8 `T`, `g` split into a float and its exact remainder); `cos`
//!   and `sin` of `t` reduced exactly to the nearest quarter turn by integer
//!   arithmetic, the rest split likewise, degree-8 and degree-7 polynomials.
//!   Over every one of the 2^32 inputs of each (`examples/normal_f32_bounds.rs`),
//!   `r` is within 1.102 ulps of f32 of `sqrt(-2 ln u1)` and `cos t` and
//!   `sin t` within 1.028 of theirs (relative errors 1.674 and 1.449 x 2^-24),
//!   so a standard normal is within 3.63 ulps of the exact value and 4 of
//!   the CPU's value rounded to f32 (ulps taken at the larger of the value
//!   and 0.5, as the tests do: near the zeros of cos and sin the CPU's own
//!   rounding of `t = 2 pi u2` moves its value by more). f32 values are within 4 ulps of the CPU's
//!   for the means and deviations the tests draw (about 63% bitwise equal),
//!   f16 and bf16 within 1 ulp (all but about one in 10^4 to 10^5 equal).
//! - `randint(n)`: two words as a `u64` `x`, the value `(x * n) >> 64`
//!   (bias below `n / 2^64`), stored as i64 (saturating) and converted to the
//!   dtype as a cast does.
//!
//! Scalar draws ([`Rng::next_u64`], [`Rng::below`], [`Rng::normal`]) take
//! the words of one block in order, two per `u64`, high half first.

pub(crate) use crate::backend::random::Draw;
use crate::backend::random::RandomPlan;
use crate::{DType, Device, Error, Result, Shape, Tensor};

/// Philox's round multipliers and Weyl key increments.
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;
/// `2 pi`, the one constant both devices' Box-Muller multiply by.
const TWO_PI: f64 = std::f64::consts::TAU;

/// A seeded Philox 4x32-10 stream (see the module docs for its exact
/// layout). Pass it explicitly: there is no hidden global generator in
/// tapir.
#[derive(Debug, Clone)]
pub struct Rng {
    key: [u32; 2],
    /// The next unused block.
    counter: u64,
    /// The words of the block scalar draws are reading, and how many of
    /// them are used (4: none left).
    words: [u32; 4],
    used: usize,
    spare_normal: Option<f64>,
}

pub(crate) fn join(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

/// The top 53 bits of `x` as a fraction in `[0, 1)`.
pub(crate) fn unit53(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// One Box-Muller pair from `u1` in `(0, 1]` and `u2` in `[0, 1)`.
pub(crate) fn box_muller(u1: f64, u2: f64) -> (f64, f64) {
    let r = (-2.0 * u1.ln()).sqrt();
    let t = TWO_PI * u2;
    (r * t.cos(), r * t.sin())
}

/// PyTorch's `torch.randn(shape)` and `torch.rand(shape)`, found where a
/// PyTorch user looks for them. tapir has no hidden global generator, so
/// the generator is the last argument: `Tensor::randn(s, d, &mut rng)` is
/// `rng.randn(s, d)`, and `Rng::new(seed)` plays `torch.manual_seed(seed)`.
///
/// ```
/// use tapir::prelude::*;
///
/// let mut rng = Rng::new(0);
/// let x = Tensor::randn([2, 3], DType::F32, &mut rng)?;
/// assert_eq!(x.dims(), &[2, 3]);
/// // The same numbers as the generator's own method from the same seed.
/// assert_eq!(x.to_vec::<f32>()?, Rng::new(0).randn([2, 3], DType::F32)?.to_vec::<f32>()?);
/// let u = Tensor::rand([4], DType::F64, &mut rng)?.to_vec::<f64>()?;
/// assert!(u.iter().all(|v| (0.0..1.0).contains(v)));
/// # Ok::<(), Error>(())
/// ```
impl Tensor {
    /// A tensor of standard normals from `rng` (`torch.randn`); see
    /// [`Rng::randn_on`] for another device.
    pub fn randn(shape: impl Into<Shape>, dtype: DType, rng: &mut Rng) -> Result<Tensor> {
        rng.randn(shape, dtype)
    }

    /// A tensor uniform in `[0, 1)` from `rng` (`torch.rand`); see
    /// [`Rng::rand_on`] for another device.
    pub fn rand(shape: impl Into<Shape>, dtype: DType, rng: &mut Rng) -> Result<Tensor> {
        rng.rand(shape, dtype)
    }
}

impl Rng {
    /// A generator from a seed; the same seed gives the same stream
    /// (`torch.manual_seed`, for a generator of its own).
    #[doc(alias = "manual_seed")]
    pub fn new(seed: u64) -> Self {
        Rng { key: [seed as u32, (seed >> 32) as u32], counter: 0, words: [0; 4], used: 4, spare_normal: None }
    }

    /// Philox 4x32-10 of one counter under one key: the four words of a
    /// block (public for known-answer tests).
    pub fn philox(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
        let (mut c, mut k) = (counter, key);
        for _ in 0..10 {
            let p0 = u64::from(M0) * u64::from(c[0]);
            let p1 = u64::from(M1) * u64::from(c[2]);
            let (hi0, lo0, hi1, lo1) = ((p0 >> 32) as u32, p0 as u32, (p1 >> 32) as u32, p1 as u32);
            c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        c
    }

    /// The next unused block of the stream: how many blocks scalar and
    /// tensor draws have consumed so far.
    pub fn offset(&self) -> u64 {
        self.counter
    }

    /// The words of block `b`.
    fn block(&self, b: u64) -> [u32; 4] {
        Rng::philox([b as u32, (b >> 32) as u32, 0, 0], self.key)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            self.words = self.block(self.counter);
            self.counter = self.counter.wrapping_add(1);
            self.used = 0;
        }
        self.used += 1;
        self.words[self.used - 1]
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32();
        join(hi, self.next_u32())
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        unit53(self.next_u64())
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
        let (z0, z1) = box_muller(u1, self.next_f64());
        self.spare_normal = Some(z1);
        z0
    }

    /// A tensor of `shape` on `device` whose element `i` is computed from
    /// the words the module docs give it, by that device's
    /// [`RandomKernels`](crate::backend::RandomKernels). A shape whose size
    /// overflows is an [`Error::InvalidShape`] naming `op`, a float draw
    /// of an integer dtype an [`Error::UnsupportedDType`], one that cannot
    /// be allocated an [`Error::OutOfMemory`]; no number is drawn then.
    fn generate(&mut self, op: &'static str, shape: Shape, dtype: DType, draw: Draw, device: Device) -> Result<Tensor> {
        let n = shape.check(op, dtype)?;
        if !matches!(draw, Draw::Int { .. }) && !dtype.is_float() {
            return Err(Error::UnsupportedDType { op, dtype, expected: "a float dtype" });
        }
        let blocks = n.div_ceil(draw.per_block(dtype)) as u64;
        let start = self.counter;
        let plan = RandomPlan { op, shape, dtype, draw, key: self.key, offset: start, device };
        let out = crate::tensor::backend_for(device).random(&plan)?;
        // A partly read block is never shared with a tensor draw.
        self.used = 4;
        self.counter = start.wrapping_add(blocks);
        Ok(Tensor::from_storage(out, plan.shape))
    }

    /// A tensor uniform in `[lo, hi)`.
    pub fn uniform(&mut self, shape: impl Into<Shape>, lo: f64, hi: f64, dtype: DType) -> Result<Tensor> {
        self.uniform_on(shape, lo, hi, dtype, Device::Cpu)
    }

    /// A tensor uniform in `[lo, hi)` on `device`, generated there; the
    /// same numbers as [`Rng::uniform`] gives from the same state.
    pub fn uniform_on(
        &mut self,
        shape: impl Into<Shape>,
        lo: f64,
        hi: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        self.generate("uniform", shape.into(), dtype, Draw::Uniform { lo, scale: hi - lo }, device)
    }

    /// A tensor uniform in `[0, 1)`.
    pub fn rand(&mut self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        self.uniform(shape, 0.0, 1.0, dtype)
    }

    /// A tensor uniform in `[0, 1)` on `device`.
    pub fn rand_on(&mut self, shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        self.uniform_on(shape, 0.0, 1.0, dtype, device)
    }

    /// A tensor of standard normals.
    pub fn randn(&mut self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        self.normal_tensor(shape, 0.0, 1.0, dtype)
    }

    /// A tensor of standard normals on `device`.
    pub fn randn_on(&mut self, shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        self.normal_tensor_on(shape, 0.0, 1.0, dtype, device)
    }

    /// A tensor of normals with `mean` and `std`.
    pub fn normal_tensor(&mut self, shape: impl Into<Shape>, mean: f64, std: f64, dtype: DType) -> Result<Tensor> {
        self.normal_tensor_on(shape, mean, std, dtype, Device::Cpu)
    }

    /// A tensor of normals with `mean` and `std` on `device`.
    pub fn normal_tensor_on(
        &mut self,
        shape: impl Into<Shape>,
        mean: f64,
        std: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        self.generate("normal", shape.into(), dtype, Draw::Normal { mean, std }, device)
    }

    /// A tensor of integers uniform in `0..n`, as `dtype` (i32/i64 labels).
    pub fn randint(&mut self, shape: impl Into<Shape>, n: u64, dtype: DType) -> Result<Tensor> {
        self.randint_on(shape, n, dtype, Device::Cpu)
    }

    /// A tensor of integers uniform in `0..n`, as `dtype`, on `device`.
    pub fn randint_on(&mut self, shape: impl Into<Shape>, n: u64, dtype: DType, device: Device) -> Result<Tensor> {
        self.generate("randint", shape.into(), dtype, Draw::Int { n: n.max(1) }, device)
    }
}
