//! The optimizer state sharded across ranks (ZeRO stage 1): each rank keeps
//! Adam's moments for its 1/N of the parameters.

use super::{Communicator, Staged};
use crate::{Adam, Grads, Optimizer, ParamStore};
use tapir_tensor::{DType, Error, Result, ShapeOps, Tensor};

/// Adam with its moments split across ranks: the parameters, flattened in
/// store order and padded to a multiple of the world size, are cut into one
/// shard per rank. A step reduce-scatters the local gradients (each rank
/// gets the average of its shard), updates its shard with Adam (the same
/// arithmetic as [`Adam`] on the whole model), and all-gathers the updated
/// shards into every rank's parameters. Each rank holds `2 * shard` moment
/// elements instead of `2 * numel`: 1/N of the unsharded state.
///
/// Takes the local gradients ([`Bound::grads`](crate::Bound::grads)), not
/// averaged ones: the reduce-scatter is the averaging. Every parameter must
/// have the same float dtype, and Adam's `no_decay_groups` is not supported
/// (one weight decay for the whole flat shard).
#[derive(Debug)]
pub struct ShardedAdam<'c> {
    comm: &'c Communicator,
    adam: Adam,
    /// The shard's parameters as a one-tensor store, which `adam` updates.
    shard: ParamStore,
    dtype: DType,
    numel: usize,
    shard_len: usize,
}

impl<'c> ShardedAdam<'c> {
    /// Sharded `adam` for the parameters of `store` (already equal on every
    /// rank, e.g. after [`DataParallel::new`](super::DataParallel::new)).
    pub fn new(comm: &'c Communicator, adam: Adam, store: &ParamStore) -> Result<Self> {
        if !adam.no_decay_groups.is_empty() && adam.weight_decay != 0.0 {
            return Err(Error::invalid_arg(
                "ShardedAdam::new",
                "no_decay_groups are not supported: the shard mixes parameters of every group",
            ));
        }
        let mut dtypes = store.iter().map(|(_, _, t)| t.dtype());
        let dtype = dtypes.next().ok_or_else(|| Error::invalid_arg("ShardedAdam::new", "the store is empty"))?;
        if let Some(other) = dtypes.find(|&d| d != dtype) {
            return Err(Error::DTypeMismatch { op: "ShardedAdam::new", lhs: dtype, rhs: other });
        }
        Staged::carrier(dtype)?;
        let numel = store.numel();
        let world = comm.world_size();
        let shard_len = numel.div_ceil(world);
        let mut shard = ParamStore::new();
        shard.add("shard", Tensor::zeros([shard_len], dtype)?)?;
        Ok(ShardedAdam { comm, adam, shard, dtype, numel, shard_len })
    }

    /// Elements of this rank's shard.
    pub fn shard_len(&self) -> usize {
        self.shard_len
    }

    /// Bytes of optimizer state on this rank (Adam's two moments of the
    /// shard; 0 before the first step).
    pub fn state_bytes(&self) -> usize {
        self.adam.state().iter().flatten().map(|t| t.numel() * t.dtype().size_in_bytes()).sum()
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.adam.steps()
    }

    /// One update of every parameter of `store` from this rank's local
    /// gradients.
    pub fn step(&mut self, store: &mut ParamStore, local: &Grads) -> Result<()> {
        local.check_fits(store, "ShardedAdam::step")?;
        if store.numel() != self.numel {
            return Err(Error::invalid_arg("ShardedAdam::step", "the store is not the one the optimizer was made for"));
        }
        let world = self.comm.world_size();
        let rank = self.comm.rank();
        let padded = self.shard_len * world;
        let carrier = Staged::carrier(self.dtype)?;
        // The gradients, flat, reduce-scattered: this rank's shard, averaged.
        let mut flat = flatten(local.iter().map(|(_, g)| g), carrier, padded)?;
        let mut mine = Staged::zeros(carrier, self.shard_len);
        self.comm.backend().reduce_scatter_sum(flat.as_buf(), mine.as_buf())?;
        mine.scale(1.0 / world as f64);
        let grad = mine.into_tensor(vec![self.shard_len], self.dtype, store.device()?)?;
        // This rank's shard of the parameters, updated by Adam.
        let params = flatten(store.iter().map(|(_, _, p)| p), carrier, padded)?;
        let lo = rank * self.shard_len;
        let piece = params.range(lo, self.shard_len);
        let id = self.shard.ids().next().expect("internal: the shard store holds one tensor");
        self.shard.set(id, piece.into_tensor(vec![self.shard_len], self.dtype, store.device()?)?)?;
        self.adam.step(&mut self.shard, &Grads::from_tensors(vec![grad]))?;
        // Every rank's updated shard, back into every rank's parameters.
        let mut updated = Staged::from(self.shard.get(id))?;
        let mut all = Staged::zeros(carrier, padded);
        self.comm.backend().all_gather(updated.as_buf(), all.as_buf())?;
        let mut offset = 0;
        let ids: Vec<_> = store.ids().collect();
        for pid in ids {
            let p = store.get(pid);
            let (n, dims, dtype, device) = (p.numel(), p.dims().to_vec(), p.dtype(), p.device());
            store.set(pid, all.range(offset, n).into_tensor(dims, dtype, device)?)?;
            offset += n;
        }
        Ok(())
    }
}

/// `tensors`, flattened in order into one host buffer of `len` elements
/// (zeros after the last).
fn flatten<'a>(tensors: impl Iterator<Item = &'a Tensor>, carrier: DType, len: usize) -> Result<Staged> {
    let mut out = Staged::zeros(carrier, len);
    let mut offset = 0;
    for t in tensors {
        let t = if Staged::carrier(t.dtype())? == t.dtype() { t.clone() } else { t.cast(carrier)? };
        match (&mut out, Staged::from(&t)?) {
            (Staged::F32(o), Staged::F32(v)) => o[offset..offset + v.len()].copy_from_slice(&v),
            (Staged::F64(o), Staged::F64(v)) => o[offset..offset + v.len()].copy_from_slice(&v),
            _ => return Err(Error::invalid_arg("ShardedAdam", "parameters of different float dtypes")),
        }
        offset += t.numel();
    }
    Ok(out)
}
