//! Data parallelism after PyTorch's DistributedDataParallel: every rank
//! holds the whole model, runs its own batch, and the ranks average their
//! gradients in buckets while the backward is still running.

use std::cell::{Cell, RefCell};

use super::{Communicator, HostBuf, Staged};
use crate::{Bound, Grads, ParamId, ParamStore};
use tapir_autograd::Var;
use tapir_tensor::cuda::timing::{mark, StreamMark};
use tapir_tensor::{BinaryOps, DType, Error, Result, ShapeOps, Tensor};

/// How [`DataParallel`] groups and shares gradients.
#[derive(Clone, Debug)]
pub struct DdpOptions {
    /// The most bytes of gradient one all-reduce carries (torch's
    /// `bucket_cap_mb`, 25 MiB by default). A parameter larger than this
    /// gets a bucket of its own.
    pub bucket_bytes: usize,
    /// The rank whose initial parameters every rank starts from.
    pub root: usize,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions { bucket_bytes: 25 << 20, root: 0 }
    }
}

/// What happened during the last [`DataParallel::grads`], in order: which
/// gradient became final and when each bucket's all-reduce was issued. It
/// is how a test sees that communication starts before the backward ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DdpEvent {
    /// The backward produced the final local gradient of this parameter.
    GradReady(ParamId),
    /// The all-reduce of this bucket was issued.
    AllReduce {
        /// The bucket's index (buckets are reduced in index order).
        bucket: usize,
    },
}

/// One all-reduce's worth of gradients, in one flat buffer.
#[derive(Debug)]
struct Bucket {
    params: Vec<ParamId>,
    /// The flat buffer, made once: on the host in the carrier dtype (f64
    /// for f64 parameters, f32 for every other float), or on a device
    /// backend's device in the parameters' dtype, where each gradient is
    /// copied in and the bucket reduced in place.
    buffer: Tensor,
    /// Gradients packed so far in this step.
    filled: usize,
}

/// Data-parallel training over a [`Communicator`]. Construction makes every
/// rank start from the root's parameters and lays out the buckets; then
/// [`grads`](Self::grads) replaces [`Bound::grads`]: the backward reports
/// each parameter's gradient the moment it is final, the gradient is copied
/// into its bucket, and a bucket is all-reduced as soon as it is full, while
/// the backward goes on with the layers below. The returned gradients are
/// the average over ranks, ready for any optimizer.
///
/// Buckets take parameters in reverse store order (the order a backward
/// produces them for a model defined input to output) and are reduced in
/// index order on every rank, so ranks issue the same collectives in the
/// same order. Their buffers are made once: live bytes at every step
/// boundary are the same on every step.
///
/// ```
/// use tapir::prelude::*;
/// use tapir::nn::dist::{Communicator, DataParallel, DdpOptions};
///
/// let comm = Communicator::single(); // `Communicator::mpi()` under mpirun
/// let mut rng = Rng::new(0);
/// let mut store = ParamStore::new();
/// let net = Mlp::new(&mut store, "net", &[2, 8, 1], Activation::Tanh, &mut rng, DType::F32)?;
/// let mut ddp = DataParallel::new(&comm, &mut store, DdpOptions::default())?;
/// let mut opt = Adam::new(1e-2);
/// let x = rng.randn([16, 2], DType::F32)?;
/// let grads = Graph::scope(|g| {
///     let p = store.bind(g);
///     let loss = net.forward(&p, g.constant(x.clone()))?.square()?.mean_all()?;
///     ddp.grads(&p, loss) // the average over every rank's batch
/// })?;
/// opt.step(&mut store, &grads)?;
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct DataParallel<'c> {
    comm: &'c Communicator,
    buckets: Vec<Bucket>,
    /// For each parameter: its bucket and offset there (elements).
    slots: Vec<(usize, usize)>,
    /// The device a device backend reduces on (NCCL), or `None`: through
    /// the host.
    device: Option<tapir_tensor::Device>,
    /// Shapes and dtypes of the parameters, to rebuild their gradients.
    params: Vec<(Vec<usize>, DType, tapir_tensor::Device)>,
    /// Whether each parameter's gradient is in its bucket this step.
    packed: Vec<bool>,
    /// The next bucket to reduce.
    next: usize,
    events: Vec<DdpEvent>,
    /// Seconds spent inside the all-reduces since construction (through
    /// the host), or queueing them (a device backend).
    comm_s: f64,
    /// A device backend's all-reduces: marks on the device's stream before
    /// and after each, not yet read, and the device seconds of those read.
    spans: RefCell<Vec<(StreamMark, StreamMark)>>,
    device_s: Cell<f64>,
}

impl<'c> DataParallel<'c> {
    /// Makes every rank's `store` equal to the root rank's (a broadcast of
    /// each parameter) and lays out the buckets. An error on every rank when
    /// the ranks' models differ, naming the first parameter whose shape or
    /// dtype differs.
    pub fn new(comm: &'c Communicator, store: &mut ParamStore, opts: DdpOptions) -> Result<Self> {
        if opts.root >= comm.world_size() {
            return Err(Error::invalid_arg(
                "DataParallel::new",
                format!("root rank {} in a world of {}", opts.root, comm.world_size()),
            ));
        }
        let device = comm.backend().device().map(|d| d.device());
        if let Some(d) = device {
            if let Some((_, name, p)) = store.iter().find(|(_, _, p)| p.device() != d) {
                return Err(Error::invalid_arg(
                    "DataParallel::new",
                    format!("parameter '{name}' is on {}, the communicator's device is {d}", p.device()),
                ));
            }
        }
        comm.agree_on("DataParallel::new", DType::I64, &[store.len()])
            .map_err(|e| Error::invalid_arg("DataParallel::new", format!("the ranks' models differ in size: {e}")))?;
        let ids: Vec<ParamId> = store.ids().collect();
        for &id in &ids {
            let name = store.name(id).to_string();
            let mut value = store.get(id).clone();
            comm.agree("DataParallel::new", &value)
                .map_err(|e| Error::invalid_arg("DataParallel::new", format!("parameter '{name}': {e}")))?;
            comm.broadcast(&mut value, opts.root)?;
            store.set(id, value)?;
        }
        // Buckets, last parameter first, one carrier dtype each (on a
        // device backend, the parameters' own dtype: NCCL reduces them all).
        let mut slots = vec![(0, 0); ids.len()];
        let mut layout: Vec<(DType, Vec<ParamId>, usize)> = Vec::new();
        for &id in ids.iter().rev() {
            let p = store.get(id);
            let carrier = if device.is_some() { p.dtype() } else { Staged::carrier(p.dtype())? };
            let bytes = p.numel() * carrier.size_in_bytes();
            // Only the most recent bucket of a dtype stays open, so a bucket
            // holds parameters that become final together.
            let open = layout.iter().rposition(|(d, _, _)| *d == carrier);
            let b = match open {
                Some(b) if layout[b].2 + bytes <= opts.bucket_bytes.max(1) => b,
                _ => {
                    layout.push((carrier, Vec::new(), 0));
                    layout.len() - 1
                }
            };
            let (_, members, used) = &mut layout[b];
            slots[id.index()] = (b, *used / carrier.size_in_bytes());
            members.push(id);
            *used += bytes;
        }
        let buckets = layout
            .into_iter()
            .map(|(carrier, params, used)| {
                let mut buffer = Tensor::zeros([used / carrier.size_in_bytes()], carrier)?;
                if let Some(d) = device {
                    buffer = buffer.to_device(d)?;
                }
                Ok(Bucket { params, buffer, filled: 0 })
            })
            .collect::<Result<Vec<_>>>()?;
        let params = ids
            .iter()
            .map(|&id| {
                let p = store.get(id);
                (p.dims().to_vec(), p.dtype(), p.device())
            })
            .collect();
        Ok(DataParallel {
            comm,
            buckets,
            slots,
            device,
            params,
            packed: vec![false; ids.len()],
            next: 0,
            events: Vec::new(),
            comm_s: 0.0,
            spans: RefCell::new(Vec::new()),
            device_s: Cell::new(0.0),
        })
    }

    /// The communicator.
    pub fn comm(&self) -> &Communicator {
        self.comm
    }

    /// Number of buckets.
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Bytes of the bucket buffers (made once, at construction).
    pub fn bucket_bytes(&self) -> usize {
        self.buckets.iter().map(|b| b.buffer.numel() * b.buffer.dtype().size_in_bytes()).sum()
    }

    /// Seconds this rank spent inside the gradients' all-reduces since
    /// construction (waiting for slower ranks included): with the steps'
    /// time, how much of a step communication takes. On a device backend
    /// (NCCL), where a call only queues the reduction on the device's
    /// stream behind the backward's kernels, it is the device's own time
    /// between marks (CUDA events) recorded before and after each
    /// all-reduce: this call waits for the last of them.
    pub fn comm_seconds(&self) -> Result<f64> {
        if self.device.is_none() {
            return Ok(self.comm_s);
        }
        self.read_spans()?;
        Ok(self.device_s.get())
    }

    /// Adds the device time of the all-reduces marked so far.
    fn read_spans(&self) -> Result<()> {
        let mut total = self.device_s.get();
        for (before, after) in self.spans.borrow_mut().drain(..) {
            total += before.seconds_until(&after)?;
        }
        self.device_s.set(total);
        Ok(())
    }

    /// What the last [`grads`](Self::grads) did, in order.
    pub fn events(&self) -> &[DdpEvent] {
        &self.events
    }

    /// The gradients of `loss` with respect to every parameter of `bound`,
    /// averaged over ranks: the backward and the all-reduces interleaved.
    pub fn grads<'g>(&mut self, bound: &Bound<'g>, loss: Var<'g>) -> Result<Grads> {
        self.grads_with(bound, loss, None)
    }

    /// This rank's gradients alone, with no communication, added to
    /// `accumulated` (torch's `no_sync`): for every micro-batch but the
    /// last when accumulating gradients; the last one goes through
    /// [`grads_with`](Self::grads_with).
    pub fn accumulate<'g>(&mut self, bound: &Bound<'g>, loss: Var<'g>, accumulated: &mut Option<Grads>) -> Result<()> {
        let local = bound.grads(loss)?;
        *accumulated = Some(match accumulated.take() {
            None => local,
            Some(acc) => sum_grads(&acc, &local)?,
        });
        Ok(())
    }

    /// [`grads`](Self::grads) of the last micro-batch, with the gradients
    /// [`accumulate`](Self::accumulate)d over the earlier ones added before
    /// they are shared.
    pub fn grads_with<'g>(&mut self, bound: &Bound<'g>, loss: Var<'g>, accumulated: Option<Grads>) -> Result<Grads> {
        if let Some(acc) = &accumulated {
            if acc.len() != self.params.len() {
                return Err(Error::invalid_arg(
                    "DataParallel::grads_with",
                    format!("{} accumulated gradients for {} parameters", acc.len(), self.params.len()),
                ));
            }
        }
        if bound.vars().len() != self.params.len() {
            return Err(Error::invalid_arg(
                "DataParallel::grads",
                format!("the bound store has {} parameters, the model had {}", bound.vars().len(), self.params.len()),
            ));
        }
        // The last step's reductions are done by now (its gradients were
        // read): their marks are read here, so they do not pile up.
        self.read_spans()?;
        self.events.clear();
        self.packed.iter_mut().for_each(|p| *p = false);
        self.buckets.iter_mut().for_each(|b| b.filled = 0);
        self.next = 0;
        let acc = accumulated.as_ref();
        bound.graph().grad_hooked(loss, bound.vars(), &mut |k, g| {
            self.events.push(DdpEvent::GradReady(ParamId(k)));
            match acc {
                Some(a) => self.pack(k, &g.add(a.get(ParamId(k)))?),
                None => self.pack(k, g),
            }
        })?;
        // Parameters no gradient reached: zeros (or what was accumulated),
        // the same on every rank, since the ranks run the same graph.
        for k in 0..self.params.len() {
            if !self.packed[k] {
                let g = match acc {
                    Some(a) => a.get(ParamId(k)).clone(),
                    None => {
                        let (dims, dtype, device) = &self.params[k];
                        Tensor::zeros(dims.clone(), *dtype)?.to_device(*device)?
                    }
                };
                self.pack(k, &g)?;
            }
        }
        self.unpack()
    }

    /// Copies parameter `k`'s gradient into its bucket, then reduces every
    /// bucket that is full and next in order.
    fn pack(&mut self, k: usize, g: &Tensor) -> Result<()> {
        let (b, offset) = self.slots[k];
        let bucket = &mut self.buckets[b];
        if self.device.is_some() {
            // A copy on the device's stream, into the bucket made once.
            tapir_tensor::cuda::copy_into(&mut bucket.buffer, offset, g)?;
        } else {
            match Staged::from(g)? {
                Staged::F32(v) => bucket.buffer.make_mut::<f32>()?[offset..offset + v.len()].copy_from_slice(&v),
                Staged::F64(v) => bucket.buffer.make_mut::<f64>()?[offset..offset + v.len()].copy_from_slice(&v),
            }
        }
        self.packed[k] = true;
        bucket.filled += 1;
        while self.next < self.buckets.len() && self.buckets[self.next].filled == self.buckets[self.next].params.len() {
            self.reduce(self.next)?;
            self.next += 1;
        }
        Ok(())
    }

    /// The all-reduce of bucket `b`, averaged.
    fn reduce(&mut self, b: usize) -> Result<()> {
        self.events.push(DdpEvent::AllReduce { bucket: b });
        let t0 = std::time::Instant::now();
        if let Some(collectives) = self.comm.backend().device() {
            // The bucket reduced in place on the device's stream: the call
            // returns once it is queued, and the backward's next kernels
            // queue behind it. The marks around it time it on the device.
            let device = collectives.device();
            let before = mark(device)?;
            collectives.all_reduce(&mut self.buckets[b].buffer, super::ReduceOp::Average)?;
            self.spans.borrow_mut().push((before, mark(device)?));
            self.comm_s += t0.elapsed().as_secs_f64();
            return Ok(());
        }
        let inv = 1.0 / self.comm.world_size() as f64;
        let buffer = &mut self.buckets[b].buffer;
        match buffer.dtype() {
            DType::F64 => {
                let s = buffer.make_mut::<f64>()?;
                self.comm.backend().all_reduce_sum(HostBuf::F64(&mut *s))?;
                s.iter_mut().for_each(|x| *x *= inv);
            }
            _ => {
                let s = buffer.make_mut::<f32>()?;
                self.comm.backend().all_reduce_sum(HostBuf::F32(&mut *s))?;
                s.iter_mut().for_each(|x| *x = (*x as f64 * inv) as f32);
            }
        }
        self.comm_s += t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// The averaged gradients out of the buckets, each in its parameter's
    /// shape, dtype and device.
    fn unpack(&self) -> Result<Grads> {
        let mut out = Vec::with_capacity(self.params.len());
        for (k, (dims, dtype, device)) in self.params.iter().enumerate() {
            let (b, offset) = self.slots[k];
            let n: usize = dims.iter().product();
            let buffer = &self.buckets[b].buffer;
            if self.device.is_some() {
                // A view of the reduced bucket, in the parameter's shape.
                out.push(buffer.narrow(0, offset, n)?.reshape(dims.clone())?);
                continue;
            }
            let t = match buffer.dtype() {
                DType::F64 => {
                    let s = buffer.as_slice::<f64>().ok_or_else(|| Error::invalid_arg("DataParallel", "bucket"))?;
                    Tensor::from_vec(s[offset..offset + n].to_vec(), dims.clone())?
                }
                _ => {
                    let s = buffer.as_slice::<f32>().ok_or_else(|| Error::invalid_arg("DataParallel", "bucket"))?;
                    Tensor::from_vec(s[offset..offset + n].to_vec(), dims.clone())?
                }
            };
            let t = if t.dtype() == *dtype { t } else { t.cast(*dtype)? };
            out.push(t.to_device(*device)?);
        }
        Ok(Grads::from_tensors(out))
    }
}

/// `a + b`, gradient by gradient.
fn sum_grads(a: &Grads, b: &Grads) -> Result<Grads> {
    if a.len() != b.len() {
        return Err(Error::invalid_arg("DataParallel::accumulate", format!("{} and {} gradients", a.len(), b.len())));
    }
    a.iter().zip(b.iter()).map(|((_, x), (_, y))| x.add(y)).collect::<Result<Vec<_>>>().map(Grads::from_tensors)
}
