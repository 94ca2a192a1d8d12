//! The random family's seam: what a tensor draw computes ([`Draw`]), the
//! plan of one draw ([`RandomPlan`]) and the kernel every device
//! implements ([`RandomKernels`]). The generator, its stream and its
//! checks are [`crate::Rng`]'s; its module docs give the words each
//! element is computed from, which every device follows exactly, so a seed
//! gives the same numbers everywhere.

use crate::storage::Storage;
use crate::{DType, Device, Result, Shape};

/// What a tensor draw computes from its words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Draw {
    /// Uniform in `[lo, lo + scale)`.
    Uniform {
        /// The lower bound.
        lo: f64,
        /// The width of the interval.
        scale: f64,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
    },
    /// Integers uniform in `0..n` (`n > 0`).
    Int {
        /// The bound.
        n: u64,
    },
}

impl Draw {
    /// Bits of the block an element takes: 64 (two words) for f64 and
    /// `randint`, 16 (half a word) for f16 and bf16 uniforms, 32 (one word)
    /// otherwise.
    pub fn bits(self, dtype: DType) -> usize {
        match self {
            Draw::Int { .. } => 64,
            _ if dtype == DType::F64 => 64,
            Draw::Uniform { .. } if matches!(dtype, DType::F16 | DType::BF16) => 16,
            _ => 32,
        }
    }
    /// Elements one block (128 bits) gives: 2, 4 or 8.
    pub fn per_block(self, dtype: DType) -> usize {
        128 / self.bits(dtype)
    }
}

/// One tensor draw, checked by the generator: a float dtype for uniform
/// and normal draws, any dtype for integers (drawn as i64 and converted as
/// a cast converts), a shape whose size fits.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomPlan {
    /// The draw's name, as errors show it.
    pub op: &'static str,
    /// The output's shape.
    pub shape: Shape,
    /// The output's dtype.
    pub dtype: DType,
    /// What each element is computed from its words.
    pub draw: Draw,
    /// The Philox key.
    pub key: [u32; 2],
    /// The first block of the stream the draw reads.
    pub offset: u64,
    /// Where the tensor is made (a draw has no operand to say it).
    pub device: Device,
}

/// The random family's kernel.
pub trait RandomKernels {
    /// A new contiguous tensor's buffer holding the draw's elements,
    /// element `i` from the words of block `offset + i / per_block`.
    fn random(&self, plan: &RandomPlan) -> Result<Storage>;
}
