//! Mini-batches for training loops: tensors that share a leading (sample)
//! dimension, cut into batches, optionally shuffled by a seed.
//!
//! The order of every epoch is a pure function of the seed and the epoch
//! number, so a run resumed from a checkpoint at epoch `e` sees the batches
//! an uninterrupted run would have seen.

use tapir_tensor::{Error, IndexOps, Result, Rng, ShapeOps, Tensor};

/// Batches of samples drawn from tensors that share their first dimension
/// (inputs, labels, weights...), like torch's `DataLoader` over a
/// `TensorDataset`.
///
/// ```
/// use tapir::prelude::*;
///
/// let x = Tensor::arange(0.0, 10.0, 1.0, DType::F32)?.reshape([5, 2])?;
/// let y = Tensor::arange(0.0, 5.0, 1.0, DType::I64)?;
/// let loader = DataLoader::new(&[&x, &y], 2)?.shuffle(7);
/// assert_eq!(loader.num_batches(), 3); // 2 + 2 + 1
///
/// let mut seen = Vec::new();
/// for batch in loader.epoch(0) {
///     let batch = batch?;
///     let (xb, yb) = (&batch[0], &batch[1]);
///     assert_eq!(xb.dims()[0], yb.dims()[0]);
///     // Row i of x is [2i, 2i + 1]: the rows stay with their labels.
///     for (row, label) in xb.to_vec::<f32>()?.chunks(2).zip(yb.to_vec::<i64>()?) {
///         assert_eq!(row[0], 2.0 * label as f32);
///     }
///     seen.extend(yb.to_vec::<i64>()?);
/// }
/// seen.sort();
/// assert_eq!(seen, vec![0, 1, 2, 3, 4]); // every sample once per epoch
/// // The same seed and epoch give the same order.
/// let first = |e| -> Result<Vec<i64>> { loader.epoch(e).next().unwrap()?[1].to_vec::<i64>() };
/// assert_eq!(first(1)?, first(1)?);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct DataLoader {
    tensors: Vec<Tensor>,
    samples: usize,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    /// This process's part of every epoch, `(rank, world)`.
    shard: Option<(usize, usize)>,
}

impl DataLoader {
    /// Batches of `batch_size` samples of `tensors`, in order. An error when
    /// no tensor is given, a tensor is 0-d, the tensors disagree on their
    /// number of samples, or `batch_size` is 0.
    pub fn new(tensors: &[&Tensor], batch_size: usize) -> Result<Self> {
        let first = tensors.first().ok_or_else(|| Error::invalid_arg("DataLoader::new", "no tensors given"))?;
        if batch_size == 0 {
            return Err(Error::invalid_arg("DataLoader::new", "batch_size is 0"));
        }
        if let Some(t) = tensors.iter().find(|t| t.rank() == 0) {
            return Err(Error::InvalidShape {
                op: "DataLoader::new",
                shape: Box::new(t.shape().clone()),
                reason: "every tensor needs a leading sample dimension".into(),
            });
        }
        let samples = first.dims()[0];
        if let Some((k, t)) = tensors.iter().enumerate().find(|(_, t)| t.dims()[0] != samples) {
            return Err(Error::invalid_arg(
                "DataLoader::new",
                format!("tensor 0 has {samples} samples but tensor {k} has {} (shape {})", t.dims()[0], t.shape()),
            ));
        }
        Ok(DataLoader {
            tensors: tensors.iter().map(|&t| t.clone()).collect(),
            samples,
            batch_size,
            seed: None,
            drop_last: false,
            shard: None,
        })
    }

    /// Shuffles the samples every epoch, in an order fixed by `seed` and the
    /// epoch number.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Leaves out a last batch smaller than `batch_size` (torch's
    /// `drop_last`).
    pub fn drop_last(mut self, drop: bool) -> Self {
        self.drop_last = drop;
        self
    }

    /// Gives this process (rank `rank` of `world`) a disjoint part of every
    /// epoch, as torch's `DistributedSampler`: the epoch's order (the same on
    /// every rank for a given seed) is padded by repeating its first samples
    /// to a multiple of `world`, and rank `r` takes every `world`-th sample
    /// from position `r`. With a batch size of `B` on each of `world` ranks,
    /// batch `b` of all ranks together holds exactly the samples of batch `b`
    /// of one process with batch size `world * B`, so data-parallel training
    /// follows single-process training. An error when `world` is 0 or `rank`
    /// is not below it.
    pub fn shard(mut self, rank: usize, world: usize) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(Error::invalid_arg("DataLoader::shard", format!("rank {rank} of a world of {world}")));
        }
        self.shard = (world > 1).then_some((rank, world));
        Ok(self)
    }

    /// Number of samples (of the whole data set, whatever the shard).
    pub fn len(&self) -> usize {
        self.samples
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// Samples this process sees per epoch: all of them, or its shard's
    /// `ceil(len / world)`.
    pub fn shard_len(&self) -> usize {
        match self.shard {
            None => self.samples,
            Some((_, world)) => self.samples.div_ceil(world),
        }
    }

    /// Batches per epoch (of this process's shard).
    pub fn num_batches(&self) -> usize {
        let n = self.shard_len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// The samples this process visits in `epoch`, in order:
    /// [`order`](Self::order), then this process's shard of it.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let order = self.order(epoch);
        match self.shard {
            None => order,
            Some((rank, world)) => {
                let padded = self.samples.div_ceil(world) * world;
                (rank..padded).step_by(world).map(|i| order[i % self.samples.max(1)]).collect()
            }
        }
    }

    /// The order of the samples in `epoch`: `0..n`, or a permutation drawn
    /// from the seed and the epoch (Fisher-Yates).
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.samples).collect();
        if let Some(seed) = self.seed {
            // Mixing the epoch through the generator's own seeding gives
            // unrelated streams for neighbouring epochs.
            let mut rng = Rng::new(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        order
    }

    /// The batches of one epoch. Each item is one tensor per input tensor,
    /// in the order given to [`DataLoader::new`]. Unshuffled batches are
    /// views (no copy); shuffled ones are gathered copies.
    pub fn epoch(&self, epoch: u64) -> Epoch<'_> {
        let order = (self.seed.is_some() || self.shard.is_some()).then(|| self.indices(epoch));
        Epoch { loader: self, order, next: 0, batches: self.num_batches() }
    }
}

/// The batches of one epoch of a [`DataLoader`].
#[derive(Debug)]
pub struct Epoch<'a> {
    loader: &'a DataLoader,
    /// The shuffled order, or `None` for `0..n`.
    order: Option<Vec<usize>>,
    next: usize,
    batches: usize,
}

impl Iterator for Epoch<'_> {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.batches {
            return None;
        }
        let l = self.loader;
        let start = self.next * l.batch_size;
        let len = l.batch_size.min(l.shard_len() - start);
        self.next += 1;
        Some(match &self.order {
            None => l.tensors.iter().map(|t| t.narrow(0, start, len)).collect(),
            Some(order) => {
                let idx: Vec<i64> = order[start..start + len].iter().map(|&i| i as i64).collect();
                // The indices go to each tensor's device (a loader may hold
                // its data on CUDA).
                Tensor::from_vec(idx, [len])
                    .and_then(|idx| l.tensors.iter().map(|t| t.index_select(0, &idx.to_device(t.device())?)).collect())
            }
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.batches - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Epoch<'_> {}
