//! The CPU kernel of the random draws ([`crate::backend::random`]): each
//! block of the Philox stream computed from its counter and the key, and
//! its words turned into elements as `kernels/random.cu` does (the words
//! each element takes are in [`crate::Rng`]'s module docs): uniforms and
//! randint exactly; normals in f64, where CUDA computes f32, f16 and bf16
//! normals in f32, a few ulps away.

use half::{bf16, f16};

use super::CpuBackend;
use crate::backend::random::{Draw, RandomPlan};
use crate::backend::RandomKernels;
use crate::rng::{box_muller, join, unit53};
use crate::storage::{try_vec, CpuElement, Storage};
use crate::{with_dtype, DType, Element, Error, Result, Rng};

impl RandomKernels for CpuBackend {
    fn random(&self, plan: &RandomPlan) -> Result<Storage> {
        let (n, dtype, draw) = (plan.shape.numel(), plan.dtype, plan.draw);
        let e = draw.per_block(dtype);
        if let Draw::Int { n: range } = draw {
            let v = fill(n, e, plan, |w, o: &mut [i64]| {
                for (j, o) in o.iter_mut().enumerate() {
                    *o = int_value(range, pair(w, j));
                }
            })?;
            return Ok(Storage::cpu(with_dtype!(dtype, T => {
                if dtype == DType::I64 {
                    i64::wrap(v)
                } else {
                    let mut out = try_vec(n)?;
                    out.extend(v.iter().map(|&x| T::from_f64(x as f64)));
                    T::wrap(out)
                }
            })));
        }
        let buf = match dtype {
            DType::F32 => f32::wrap(fill(n, e, plan, |w, o| block_narrow(draw, dtype, w, o))?),
            DType::F16 => f16::wrap(fill(n, e, plan, |w, o| block_narrow(draw, dtype, w, o))?),
            DType::BF16 => bf16::wrap(fill(n, e, plan, |w, o| block_narrow(draw, dtype, w, o))?),
            DType::F64 => f64::wrap(fill(n, e, plan, |w, o| block_f64(draw, w, o))?),
            _ => return Err(Error::UnsupportedDType { op: plan.op, dtype, expected: "a float dtype" }),
        };
        Ok(Storage::cpu(buf))
    }
}

/// Significand bits (with the implicit one) of a single-word dtype.
fn digits(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    }
}

/// Words `2j` and `2j + 1` of a block as one `u64`, the first the high
/// half: the two words of element `j` of a two-word draw.
fn pair(w: [u32; 4], j: usize) -> u64 {
    join(w[2 * j], w[2 * j + 1])
}

/// A single-word element, computed as the CUDA kernels do: in f32, then
/// rounded to the dtype.
trait Narrow: Element {
    fn from_f32(v: f32) -> Self;
}
impl Narrow for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl Narrow for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Narrow for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// The values of one block for a single-word float dtype, into `out`.
fn block_narrow<T: Narrow>(draw: Draw, dtype: DType, w: [u32; 4], out: &mut [T]) {
    match draw {
        Draw::Uniform { lo, scale } => {
            let d = digits(dtype);
            let (lo, scale) = (lo as f32, scale as f32);
            let unit = 1.0 / (1u32 << d) as f32;
            if draw.bits(dtype) == 16 {
                // Two elements a word: 2j the top `d` bits of its high half,
                // 2j + 1 of its low half, times `scale 2^-d` (exact, so the
                // product is `scale u` rounded once).
                let s = scale * unit;
                for (j, o) in out.iter_mut().enumerate() {
                    let x = if j % 2 == 0 { w[j / 2] >> (32 - d) } else { (w[j / 2] >> (16 - d)) & ((1 << d) - 1) };
                    *o = T::from_f32(lo + s * x as f32);
                }
            } else {
                for (o, x) in out.iter_mut().zip(w) {
                    let u = (x >> (32 - d)) as f32 * unit;
                    *o = T::from_f32(lo + scale * u);
                }
            }
        }
        Draw::Normal { mean, std } => {
            let unit = 1.0 / (1u64 << 32) as f64;
            for p in 0..2 {
                let (z0, z1) = box_muller((f64::from(w[2 * p]) + 1.0) * unit, f64::from(w[2 * p + 1]) * unit);
                for (j, z) in [z0, z1].into_iter().enumerate() {
                    if let Some(o) = out.get_mut(2 * p + j) {
                        *o = T::from_f32((mean + std * z) as f32);
                    }
                }
            }
        }
        Draw::Int { .. } => unreachable!("internal: randint takes two words an element"),
    }
}

/// The value of randint from two words joined as `x`, as i64 (saturating).
fn int_value(n: u64, x: u64) -> i64 {
    let v = ((u128::from(x) * u128::from(n)) >> 64) as u64;
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The values of one block for f64, into `out`.
fn block_f64(draw: Draw, w: [u32; 4], out: &mut [f64]) {
    match draw {
        Draw::Uniform { lo, scale } => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = lo + scale * unit53(pair(w, j));
            }
        }
        Draw::Normal { mean, std } => {
            let u1 = ((pair(w, 0) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
            let (z0, z1) = box_muller(u1, unit53(pair(w, 1)));
            for (o, z) in out.iter_mut().zip([z0, z1]) {
                *o = mean + std * z;
            }
        }
        Draw::Int { .. } => unreachable!("internal: randint is generated as i64"),
    }
}

/// `n` elements, block by block from the plan's first block, `e` to a
/// block, each block's elements written by `f` from its words.
fn fill<T: Copy + Default>(
    n: usize,
    e: usize,
    plan: &RandomPlan,
    mut f: impl FnMut([u32; 4], &mut [T]),
) -> Result<Vec<T>> {
    let mut v: Vec<T> = try_vec(n)?;
    v.resize(n, T::default());
    for (b, chunk) in v.chunks_mut(e).enumerate() {
        let b = plan.offset.wrapping_add(b as u64);
        f(Rng::philox([b as u32, (b >> 32) as u32, 0, 0], plan.key), chunk);
    }
    Ok(v)
}
