//! Collectives and data parallelism over NCCL among CUDA devices of one
//! process: one thread per device, one communicator each
//! (`Communicator::nccl_devices`). On the emulated device (built with
//! `TAPIR_CUDA=emulated`) NCCL is the emulator's stand-in and this binary
//! asks for 4 emulated devices; each test that finds too few devices, or
//! no NCCL, says so and passes, unless `TAPIR_REQUIRE_CUDA=1`, which makes
//! that a failure (CI sets it).

#![cfg(feature = "nccl")]

use std::sync::{Mutex, MutexGuard};

use tapir_autograd::Graph;
use tapir_nn::dist::{Communicator, DataParallel, DdpOptions, ReduceOp, ShardedAdam};
use tapir_nn::{Activation, Adam, Gpt, GptConfig, Grads, Mlp, Optimizer, ParamStore};
use tapir_tensor::prelude::*;
use tapir_testing::{assert_close, cuda_or_skip, cuda_test};

static LOCK: Mutex<()> = Mutex::new(());

/// One test at a time: the ranks' threads of two tests would share the
/// emulated devices' streams.
fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// `n` CUDA devices, or `None` after saying why not (a failure under
/// `TAPIR_REQUIRE_CUDA=1`).
fn devices(test: &str, n: usize) -> Option<Vec<Device>> {
    if tapir_tensor::cuda::emulated_selected() && std::env::var_os("TAPIR_CUDA_EMU_DEVICES").is_none() {
        // Read by the emulator when it starts, before any device is opened;
        // every test of this binary asks for the same number.
        std::env::set_var("TAPIR_CUDA_EMU_DEVICES", "4");
    }
    let opened: Result<Vec<Device>> = (0..n).map(Device::cuda).collect();
    let devs = cuda_or_skip(test, opened)?;
    let nccl = tapir_tensor::cuda::nccl::nccl_version();
    cuda_or_skip(&format!("{test} (NCCL)"), nccl).map(|v| {
        println!("{test}: NCCL version {v} on {n} devices");
        devs
    })
}

/// Runs `f(rank, comm)` on one thread per communicator; the results in
/// rank order.
fn on_ranks<T: Send>(comms: Vec<Communicator>, f: impl Fn(usize, &Communicator) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                let f = &f;
                s.spawn(move || f(r, &comm))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

const DTYPES: [DType; 6] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];

/// Rank `r`'s input: small integers (halves for floats), exact in every dtype.
fn input(r: usize, n: usize, dtype: DType) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let k = ((r + 1) * (i + 3) * 7 % 23) as f64 - 11.0;
            if dtype.is_float() {
                k * 0.5
            } else {
                k
            }
        })
        .collect()
}

fn tensor(v: &[f64], dims: &[usize], dtype: DType, device: Device) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims.to_vec()).unwrap().cast(dtype).unwrap().to_device(device).unwrap()
}

/// The element-wise reduction of `inputs` as `dtype` rounds it.
fn reference(inputs: &[Vec<f64>], op: ReduceOp, dtype: DType) -> Vec<f64> {
    let world = inputs.len();
    let out: Vec<f64> = (0..inputs[0].len())
        .map(|i| {
            let col = inputs.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => col.sum(),
                ReduceOp::Average if dtype.is_float() => col.sum::<f64>() / world as f64,
                // Integer division, truncating toward zero, as NCCL's average of integers.
                ReduceOp::Average => ((col.sum::<f64>() as i64) / world as i64) as f64,
                ReduceOp::Max => col.fold(f64::NEG_INFINITY, f64::max),
                _ => col.fold(f64::INFINITY, f64::min),
            }
        })
        .collect();
    Tensor::from_vec(out, [inputs[0].len()]).unwrap().cast(dtype).unwrap().to_vec_f64()
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1e-2,
        DType::F32 => 1e-6,
        _ => 0.0,
    }
}

#[cuda_test]
fn collectives_match_the_cpu_on_2_3_and_4_devices() {
    let _s = serial();
    let Some(all) = devices("collectives_match_the_cpu_on_2_3_and_4_devices", 4) else { return };
    for world in 2..=4 {
        let comms = Communicator::nccl_devices(&all[..world]).unwrap();
        let dims = [2 * world, 3];
        let n = dims[0] * dims[1];
        let ins: Vec<Vec<Vec<f64>>> = DTYPES.iter().map(|&d| (0..world).map(|r| input(r, n, d)).collect()).collect();
        let ins = &ins;
        on_ranks(comms, |r, comm| {
            let dev = all[r];
            assert_eq!((comm.rank(), comm.world_size()), (r, world));
            for (k, &dtype) in DTYPES.iter().enumerate() {
                let mine = &ins[k][r];
                let tol = tolerance(dtype);
                let what = |op: &str| format!("{op} of {dtype} on rank {r} of {world}");
                for op in [ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max, ReduceOp::Min] {
                    let mut t = tensor(mine, &dims, dtype, dev);
                    comm.all_reduce(&mut t, op).unwrap();
                    assert_eq!((t.dims(), t.dtype(), t.device()), (&dims[..], dtype, dev));
                    assert_close(
                        &what(&format!("all_reduce {op:?}")),
                        &t.to_vec_f64(),
                        &reference(&ins[k], op, dtype),
                        tol,
                    );

                    let scattered = comm.reduce_scatter(&tensor(mine, &dims, dtype, dev), op).unwrap();
                    assert_eq!(scattered.dims(), &[2, 3]);
                    let full = reference(&ins[k], op, dtype);
                    assert_close(
                        &what(&format!("reduce_scatter {op:?}")),
                        &scattered.to_vec_f64(),
                        &full[r * 6..(r + 1) * 6],
                        tol,
                    );
                }
                let mut b = tensor(mine, &dims, dtype, dev);
                comm.broadcast(&mut b, world - 1).unwrap();
                assert_eq!(
                    b.to_vec_f64(),
                    reference(&ins[k][world - 1..], ReduceOp::Sum, dtype),
                    "{}",
                    what("broadcast")
                );

                let gathered = comm.all_gather(&tensor(mine, &dims, dtype, dev)).unwrap();
                assert_eq!(gathered.dims(), &[world, dims[0], dims[1]]);
                let want: Vec<f64> =
                    (0..world).flat_map(|q| reference(&ins[k][q..q + 1], ReduceOp::Sum, dtype)).collect();
                assert_eq!(gathered.to_vec_f64(), want, "{}", what("all_gather"));
            }
        });
    }
}

#[cuda_test]
fn misuse_is_an_error_naming_the_devices_and_shapes() {
    let _s = serial();
    let Some(all) = devices("misuse_is_an_error_naming_the_devices_and_shapes", 2) else { return };
    let comms = Communicator::nccl_devices(&all[..2]).unwrap();
    let errors = on_ranks(comms, |r, comm| {
        // A host tensor, and one on the other rank's device: errors before
        // anything reaches NCCL (so no rank waits for the other).
        let mut host = Tensor::zeros([3], DType::F32).unwrap();
        let e = comm.all_reduce(&mut host, ReduceOp::Sum).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { lhs: Device::Cpu, .. }), "{e}");
        let mut other = Tensor::zeros_on([3], DType::F32, all[1 - r]).unwrap();
        let e = comm.all_reduce(&mut other, ReduceOp::Sum).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        // Different shapes on the two ranks: both fail, naming both.
        let mut t = Tensor::zeros_on([2 + r], DType::F32, all[r]).unwrap();
        comm.all_reduce(&mut t, ReduceOp::Sum).unwrap_err().to_string()
    });
    for e in &errors {
        assert!(e.contains("rank 0: float32 [2]") && e.contains("rank 1: float32 [3]"), "{e}");
    }
    // The same devices twice, and a CPU device, are refused up front.
    let twice = Communicator::nccl_devices(&[all[0], all[0]]).unwrap_err();
    assert!(twice.to_string().contains("listed twice"), "{twice}");
    assert!(Communicator::nccl_devices(&[Device::Cpu]).is_err());
}

/// A regression task: 64 samples of 3 features.
fn data(device: Device, dtype: DType) -> (Tensor, Tensor) {
    let mut rng = Rng::new(7);
    let x = rng.randn([64, 3], dtype).unwrap();
    let y = x.sum(&[1], true).unwrap().sin().unwrap();
    (x.to_device(device).unwrap(), y.to_device(device).unwrap())
}

/// `steps` Adam steps of an MLP on `device`, each on rows
/// `rank * rows..` of every step's batch of `world * rows`, its gradients
/// shared by `comm` (none: the plain gradients). Returns the losses
/// averaged over ranks and the flat parameters after each step.
fn train(
    comm: Option<&Communicator>,
    device: Device,
    dtype: DType,
    rows: usize,
    steps: usize,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let (rank, world) = comm.map_or((0, 1), |c| (c.rank(), c.world_size()));
    let mut store = ParamStore::new();
    let net = Mlp::new(&mut store, "net", &[3, 16, 16, 1], Activation::Tanh, &mut Rng::new(1), dtype).unwrap();
    store.to_device(device).unwrap();
    let mut ddp = comm.map(|c| DataParallel::new(c, &mut store, DdpOptions { bucket_bytes: 512, root: 0 }).unwrap());
    let mut adam = Adam::new(1e-2);
    let (x, y) = data(device, dtype);
    let (mut losses, mut params) = (Vec::new(), Vec::new());
    let mut boundary = None;
    let t0 = std::time::Instant::now();
    for step in 0..steps {
        let start = (step * world * rows) % 64 + rank * rows;
        let (xb, yb) = (x.narrow(0, start, rows).unwrap(), y.narrow(0, start, rows).unwrap());
        let (loss, grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let loss = net.forward(&p, g.constant(xb.clone()))?.sub(&g.constant(yb.clone()))?.square()?.mean_all()?;
            let grads = match ddp.as_mut() {
                Some(d) => d.grads(&p, loss)?,
                None => p.grads(loss)?,
            };
            Ok::<_, Error>((loss.value()?.clone(), grads))
        })
        .unwrap();
        adam.step(&mut store, &grads).unwrap();
        drop::<Grads>(grads);
        let mut l = loss;
        if let Some(c) = comm {
            c.all_reduce(&mut l, ReduceOp::Average).unwrap();
        }
        losses.push(l.to_vec_f64()[0]);
        drop(l);
        params.push(store.iter().flat_map(|(_, _, t)| t.to_vec_f64()).collect());
        // Live bytes on the device identical at every step boundary after
        // the first (which makes Adam's moments and the reduced buckets).
        if step >= 1 {
            let now = memory_allocated(device);
            assert_eq!(*boundary.get_or_insert(now), now, "rank {rank}: live bytes changed at step {step}");
        }
    }
    if let Some(d) = &ddp {
        // The all-reduces' time as the device measured it (marks on its
        // stream around each): some, and within the run's.
        let (comm, wall) = (d.comm_seconds().unwrap(), t0.elapsed().as_secs_f64());
        assert!(comm > 0.0 && comm < wall, "rank {rank}: all-reduces {comm} s of a {wall} s run");
    }
    (losses, params)
}

#[cuda_test]
fn data_parallel_over_nccl_follows_one_device() {
    let _s = serial();
    // 20 steps, to 1e-5 in f32 and 1e-12 in f64 (the MPI tests' bounds).
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        for world in [2, 4] {
            let Some(all) = devices("data_parallel_over_nccl_follows_one_device", world) else { return };
            let steps = 20;
            // One device with the whole batch of world * 4 rows...
            let (one_losses, one_params) = train(None, all[0], dtype, world * 4, steps);
            // ...and `world` devices with 4 rows each.
            let comms = Communicator::nccl_devices(&all[..world]).unwrap();
            let runs = on_ranks(comms, |r, comm| train(Some(comm), all[r], dtype, 4, steps));
            for (r, (losses, params)) in runs.iter().enumerate() {
                assert_close(&format!("{dtype} losses of rank {r} of {world}"), losses, &one_losses, tol);
                for (step, p) in params.iter().enumerate() {
                    // Every rank holds the same parameters after every step.
                    assert_eq!(
                        p, &runs[0].1[step],
                        "{dtype}: rank {r} of {world} differs from rank 0 after step {step}"
                    );
                    let what = format!("{dtype} parameters of rank {r} of {world} at step {step}");
                    assert_close(&what, p, &one_params[step], tol);
                }
            }
            println!("{dtype}, {world} devices: losses {:?}; one device: {one_losses:?}", runs[0].0);
        }
    }
}

/// `train`'s MLP and batches in f32 under ZeRO-1: each rank's local
/// gradients go to a `ShardedAdam`, which averages them over the ranks
/// (reduce-scatter), updates its shard of the parameters and gathers the
/// rest. The losses averaged over ranks, this rank's optimizer-state
/// bytes, and the model's element count.
fn train_zero(comm: &Communicator, device: Device, rows: usize, steps: usize) -> (Vec<f64>, usize, usize) {
    let (rank, world) = (comm.rank(), comm.world_size());
    let mut store = ParamStore::new();
    // The same seed on every rank: the same parameters, with no broadcast.
    let net = Mlp::new(&mut store, "net", &[3, 16, 16, 1], Activation::Tanh, &mut Rng::new(1), DType::F32).unwrap();
    store.to_device(device).unwrap();
    let mut zero = ShardedAdam::new(comm, Adam::new(1e-2), &store).unwrap();
    let (x, y) = data(device, DType::F32);
    let (mut losses, mut boundary) = (Vec::new(), None);
    for step in 0..steps {
        let start = (step * world * rows) % 64 + rank * rows;
        let (xb, yb) = (x.narrow(0, start, rows).unwrap(), y.narrow(0, start, rows).unwrap());
        let (loss, grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let loss = net.forward(&p, g.constant(xb.clone()))?.sub(&g.constant(yb.clone()))?.square()?.mean_all()?;
            Ok::<_, Error>((loss.value()?.clone(), p.grads(loss)?))
        })
        .unwrap();
        zero.step(&mut store, &grads).unwrap();
        drop::<Grads>(grads);
        let mut l = loss;
        comm.all_reduce(&mut l, ReduceOp::Average).unwrap();
        losses.push(l.to_vec_f64()[0]);
        drop(l);
        if step >= 1 {
            let now = memory_allocated(device);
            assert_eq!(*boundary.get_or_insert(now), now, "rank {rank}: live bytes changed at step {step}");
        }
    }
    (losses, zero.state_bytes(), store.numel())
}

/// ZeRO-1 over NCCL on 2 and 4 devices: the losses of data parallelism
/// (1e-6), with exactly 1/N of Adam's moments on each rank (the flat
/// parameters padded to a multiple of N).
#[cuda_test]
fn sharded_adam_over_nccl_matches_data_parallel_with_a_share_of_the_state() {
    let _s = serial();
    let test = "sharded_adam_over_nccl_matches_data_parallel_with_a_share_of_the_state";
    for world in [2, 4] {
        let Some(all) = devices(test, world) else { return };
        let steps = 10;
        let ddp = on_ranks(Communicator::nccl_devices(&all[..world]).unwrap(), |r, comm| {
            train(Some(comm), all[r], DType::F32, 4, steps).0
        });
        let zero =
            on_ranks(Communicator::nccl_devices(&all[..world]).unwrap(), |r, comm| train_zero(comm, all[r], 4, steps));
        for (r, (losses, state_bytes, numel)) in zero.iter().enumerate() {
            assert_close(&format!("ZeRO-1 losses of rank {r} of {world}"), losses, &ddp[r], 1e-6);
            assert_eq!(*state_bytes, numel.div_ceil(world) * 2 * 4, "rank {r} of {world}: Adam's state bytes");
        }
        println!("{world} devices: ZeRO-1 losses {:?}; data parallel {:?}", zero[0].0, ddp[0]);
    }
}

/// 20 steps of `tapir gpt`'s model (no dropout) on `device`: batches of
/// `rows` sequences, this rank's share of every global batch, the
/// gradients shared by `comm` (none: the plain gradients). The losses,
/// averaged over ranks.
fn train_gpt(comm: Option<&Communicator>, device: Device, rows: usize) -> Vec<f64> {
    let (rank, world) = comm.map_or((0, 1), |c| (c.rank(), c.world_size()));
    let cfg = GptConfig {
        vocab: 11,
        block_size: 8,
        d_model: 16,
        n_layer: 1,
        n_head: 2,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: true,
    };
    let mut rng = Rng::new(3);
    let ids = rng.randint([64, 8], 11, DType::I64).unwrap().to_device(device).unwrap();
    let targets = rng.randint([64, 8], 11, DType::I64).unwrap().to_device(device).unwrap();
    let mut store = ParamStore::new();
    let gpt = Gpt::new(&mut store, cfg, &mut Rng::new(9), DType::F32).unwrap();
    store.to_device(device).unwrap();
    let mut ddp = comm.map(|c| DataParallel::new(c, &mut store, DdpOptions { bucket_bytes: 4096, root: 0 }).unwrap());
    let mut opt = Adam::new(3e-3);
    let mut losses = Vec::new();
    for step in 0..20 {
        let start = (step * world * rows) % 64 + rank * rows;
        let (x, y) = (ids.narrow(0, start, rows).unwrap(), targets.narrow(0, start, rows).unwrap());
        let (loss, grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let loss = gpt.loss(&p, &x, &y, None)?;
            let value = loss.value()?.clone();
            let grads = match ddp.as_mut() {
                Some(d) => d.grads(&p, loss)?,
                None => p.grads(loss)?,
            };
            Ok::<_, Error>((value, grads))
        })
        .unwrap();
        opt.step(&mut store, &grads).unwrap();
        let mut l = loss;
        if let Some(c) = comm {
            c.all_reduce(&mut l, ReduceOp::Average).unwrap();
        }
        losses.push(l.to_vec_f64()[0]);
    }
    losses
}

/// The mini-GPT over NCCL: 2 and 4 devices with 4 sequences each follow
/// one device with the whole batch for 20 steps, to 1e-5.
#[cuda_test]
fn gpt_data_parallel_over_nccl_follows_one_device() {
    let _s = serial();
    for world in [2, 4] {
        let Some(all) = devices("gpt_data_parallel_over_nccl_follows_one_device", world) else { return };
        let one = train_gpt(None, all[0], world * 4);
        let comms = Communicator::nccl_devices(&all[..world]).unwrap();
        let runs = on_ranks(comms, |r, comm| train_gpt(Some(comm), all[r], 4));
        for (r, losses) in runs.iter().enumerate() {
            assert_close(&format!("gpt losses of rank {r} of {world}"), losses, &one, 1e-5);
        }
        println!("gpt, {world} devices: losses {:?}; one device: {one:?}", runs[0]);
    }
}

#[cuda_test]
fn all_reduce_of_four_mebibytes_on_two_devices_and_its_time() {
    let _s = serial();
    let Some(all) = devices("all_reduce_of_four_mebibytes_on_two_devices_and_its_time", 2) else { return };
    let n = 1 << 20;
    let comms = Communicator::nccl_devices(&all[..2]).unwrap();
    let times = on_ranks(comms, |r, comm| {
        let mut t = Tensor::full_on([n], (r + 1) as f64, DType::F32, all[r]).unwrap();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            tapir_tensor::cuda::synchronize(all[r]).unwrap();
            let t0 = std::time::Instant::now();
            comm.all_reduce(&mut t, ReduceOp::Average).unwrap();
            tapir_tensor::cuda::synchronize(all[r]).unwrap();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        // (1 + 2) / 2, averaged again twice: 1.5 each time.
        assert!(t.to_vec::<f32>().unwrap().iter().all(|&x| x == 1.5));
        best
    });
    for (r, s) in times.iter().enumerate() {
        println!(
            "rank {r}: all_reduce (average) of {n} f32 (4 MiB) over 2 emulated devices: {:.1} ms, best of 3 \
             (the stand-in's host arithmetic, nothing like NCCL's speed)",
            s * 1e3
        );
    }
}
