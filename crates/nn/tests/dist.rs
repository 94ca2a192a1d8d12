//! Data parallelism: a world of one process (every build), and real MPI
//! ranks started by `mpirun` (built with `--features mpi`, Open MPI
//! installed).
//!
//! The MPI tests launch this test binary again under `mpirun`, one process
//! per rank, running one `#[ignore]`d worker test (`rank_*`); each rank
//! checks its own assertions, and the launching test asserts that every
//! rank passed. Without the feature or without `mpirun` they say so and
//! pass, unless `TAPIR_REQUIRE_MPI=1`, which makes that a failure (CI sets
//! it).

use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tapir_autograd::Graph;
use tapir_nn::dist::{Communicator, DataParallel, DdpEvent, DdpOptions, ReduceOp, ShardedAdam};
use tapir_nn::{Activation, Adam, DataLoader, Gpt, GptConfig, Grads, Mlp, Optimizer, ParamStore};
use tapir_tensor::prelude::*;

/// Every test that makes tensors holds this: the live-byte checks read a
/// process-wide counter, so another test's tensors made meanwhile (the
/// threads of one test binary) would look like a leak.
static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn live() -> usize {
    memory_allocated(Device::Cpu)
}

/// A regression task: 64 samples of 3 features, a target per sample.
fn data(dtype: DType) -> (Tensor, Tensor) {
    let mut rng = Rng::new(7);
    let x = rng.randn([64, 3], dtype).unwrap();
    let y = x.sum(&[1], true).unwrap().sin().unwrap();
    (x, y)
}

fn mlp(dtype: DType) -> (ParamStore, Mlp) {
    let mut store = ParamStore::new();
    let net = Mlp::new(&mut store, "net", &[3, 16, 16, 1], Activation::Tanh, &mut Rng::new(1), dtype).unwrap();
    (store, net)
}

fn mse_grads(
    ddp: Option<&mut DataParallel<'_>>,
    store: &ParamStore,
    net: &Mlp,
    x: &Tensor,
    y: &Tensor,
) -> (f64, Grads) {
    Graph::scope(|g| {
        let p = store.bind(g);
        let loss = net.forward(&p, g.constant(x.clone()))?.sub(&g.constant(y.clone()))?.square()?.mean_all()?;
        let value = loss.value()?.to_vec_f64()[0];
        let grads = match ddp {
            Some(d) => d.grads(&p, loss)?,
            None => p.grads(loss)?,
        };
        Ok::<_, Error>((value, grads))
    })
    .unwrap()
}

/// What a training run saw: the loss of each step averaged over ranks, the
/// parameters after each step, and the gradients the optimizer got at each
/// step (flat; Adam barely notices a wrong gradient scale, so losses alone
/// would not catch a wrong average).
struct Run {
    losses: Vec<f64>,
    params: Vec<Vec<f64>>,
    grads: Vec<Vec<f64>>,
}

/// How a run shares its gradients.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// No sharing: `Bound::grads` and Adam, the reference.
    Plain,
    /// `DataParallel` and Adam.
    Ddp,
    /// Local gradients into `ShardedAdam`.
    Zero,
}

/// `steps` Adam steps of the MLP over `loader`'s batches on `comm`.
fn train_mlp(comm: &Communicator, loader: &DataLoader, dtype: DType, steps: usize, mode: Mode) -> Run {
    let (mut store, net) = mlp(dtype);
    let mut ddp = DataParallel::new(comm, &mut store, DdpOptions { bucket_bytes: 512, root: 0 }).unwrap();
    let mut adam = Adam::new(1e-2);
    let mut sharded = (mode == Mode::Zero).then(|| ShardedAdam::new(comm, Adam::new(1e-2), &store).unwrap());
    let (mut losses, mut params, mut seen) = (Vec::new(), Vec::new(), Vec::new());
    let mut boundary = None;
    'outer: for epoch in 0.. {
        for batch in loader.epoch(epoch) {
            let batch = batch.unwrap();
            let (loss, grads) = match mode {
                // ZeRO-1 takes the local gradients and averages them itself.
                Mode::Plain | Mode::Zero => mse_grads(None, &store, &net, &batch[0], &batch[1]),
                Mode::Ddp => mse_grads(Some(&mut ddp), &store, &net, &batch[0], &batch[1]),
            };
            seen.push(grads.iter().flat_map(|(_, g)| g.to_vec_f64()).collect());
            match &mut sharded {
                Some(s) => s.step(&mut store, &grads).unwrap(),
                None => adam.step(&mut store, &grads).unwrap(),
            }
            drop(grads);
            let mut l = Tensor::from_vec(vec![loss], [1]).unwrap();
            comm.all_reduce(&mut l, ReduceOp::Average).unwrap();
            losses.push(l.to_vec::<f64>().unwrap()[0]);
            params.push(store.iter().flat_map(|(_, _, t)| t.to_vec_f64()).collect());
            // Live bytes identical at every step boundary after the first
            // (which makes the optimizer's moments).
            if losses.len() >= 2 {
                let now = live();
                assert_eq!(
                    *boundary.get_or_insert(now),
                    now,
                    "rank {}: live bytes changed at step {}",
                    comm.rank(),
                    losses.len()
                );
            }
            if losses.len() == steps {
                break 'outer;
            }
        }
    }
    Run { losses, params, grads: seen }
}

// ----- one process ---------------------------------------------------------

#[test]
fn one_rank_data_parallel_gives_the_plain_gradients() {
    let _s = serial();
    let comm = Communicator::single();
    let (x, y) = data(DType::F64);
    let (mut store, net) = mlp(DType::F64);
    let mut ddp = DataParallel::new(&comm, &mut store, DdpOptions { bucket_bytes: 300, root: 0 }).unwrap();
    assert!(ddp.num_buckets() > 1, "small buckets split the model");
    let (l1, plain) = mse_grads(None, &store, &net, &x, &y);
    let (l2, shared) = mse_grads(Some(&mut ddp), &store, &net, &x, &y);
    assert_eq!(l1, l2);
    for ((_, a), (_, b)) in plain.iter().zip(shared.iter()) {
        assert_eq!(a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
    }
}

#[test]
fn buckets_are_reduced_before_the_backward_ends() {
    let _s = serial();
    let comm = Communicator::single();
    let (x, y) = data(DType::F32);
    let (mut store, net) = mlp(DType::F32);
    let mut ddp = DataParallel::new(&comm, &mut store, DdpOptions { bucket_bytes: 300, root: 0 }).unwrap();
    mse_grads(Some(&mut ddp), &store, &net, &x, &y);
    let events = ddp.events();
    let first_reduce = events.iter().position(|e| matches!(e, DdpEvent::AllReduce { .. })).unwrap();
    let last_ready = events.iter().rposition(|e| matches!(e, DdpEvent::GradReady(_))).unwrap();
    assert!(first_reduce < last_ready, "the first all-reduce was issued after the last gradient: {events:?}");
    let reduces: Vec<usize> = events
        .iter()
        .filter_map(|e| if let DdpEvent::AllReduce { bucket } = e { Some(*bucket) } else { None })
        .collect();
    assert_eq!(reduces, (0..ddp.num_buckets()).collect::<Vec<_>>(), "every bucket once, in order");
}

#[test]
fn accumulated_micro_batches_equal_one_large_batch() {
    let _s = serial();
    let comm = Communicator::single();
    let (x, y) = data(DType::F64);
    let (mut store, net) = mlp(DType::F64);
    let mut ddp = DataParallel::new(&comm, &mut store, DdpOptions::default()).unwrap();
    let (_, whole) = mse_grads(None, &store, &net, &x, &y);
    // Two halves, each loss halved: the mean over the whole batch.
    let mut acc = None;
    let mut last = None;
    for (k, (lo, n)) in [(0, 32), (32, 32)].into_iter().enumerate() {
        Graph::scope(|g| {
            let p = store.bind(g);
            let xs = g.constant(x.narrow(0, lo, n)?);
            let loss =
                net.forward(&p, xs)?.sub(&g.constant(y.narrow(0, lo, n)?))?.square()?.mean_all()?.mul_scalar(0.5)?;
            if k == 0 {
                ddp.accumulate(&p, loss, &mut acc)?;
            } else {
                last = Some(ddp.grads_with(&p, loss, acc.take())?);
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    }
    for ((_, a), (_, b)) in whole.iter().zip(last.unwrap().iter()) {
        for (u, v) in a.to_vec::<f64>().unwrap().iter().zip(b.to_vec::<f64>().unwrap()) {
            assert!((u - v).abs() < 1e-14, "{u} vs {v}");
        }
    }
}

#[test]
fn one_rank_sharded_adam_is_adam() {
    let _s = serial();
    let comm = Communicator::single();
    let loader = DataLoader::new(&[&data(DType::F32).0, &data(DType::F32).1], 16).unwrap();
    let ddp = train_mlp(&comm, &loader, DType::F32, 6, Mode::Ddp);
    let zero = train_mlp(&comm, &loader, DType::F32, 6, Mode::Zero);
    assert_eq!(ddp.losses, zero.losses);
    assert_eq!(ddp.params, zero.params);
}

#[test]
fn collectives_check_their_arguments() {
    let _s = serial();
    let comm = Communicator::single();
    let mut t = Tensor::from_vec(vec![1i64, 2], [2]).unwrap();
    assert!(matches!(comm.all_reduce(&mut t, ReduceOp::Sum), Err(Error::UnsupportedDType { .. })));
    let mut f = Tensor::from_vec(vec![1f32, 2.0, 3.0], [3]).unwrap();
    assert!(comm.broadcast(&mut f, 1).is_err(), "root 1 in a world of one");
    let gathered = comm.all_gather(&f).unwrap();
    assert_eq!(gathered.dims(), &[1, 3]);
    let half = f.cast(DType::BF16).unwrap();
    let scattered = comm.reduce_scatter(&half, ReduceOp::Average).unwrap();
    assert_eq!((scattered.dims(), scattered.dtype()), (&[3][..], DType::BF16));
    let scalar = Tensor::scalar(1.0f32);
    assert!(comm.reduce_scatter(&scalar, ReduceOp::Sum).is_err());
}

#[test]
fn shards_of_an_epoch_are_disjoint_and_cover_it() {
    let _s = serial();
    let x = Tensor::from_vec((0..10).map(|i| i as f32).collect(), [10]).unwrap();
    let whole = DataLoader::new(&[&x], 4).unwrap().shuffle(3);
    for world in [1, 2, 3, 4] {
        let mut seen = Vec::new();
        for rank in 0..world {
            let shard = DataLoader::new(&[&x], 2).unwrap().shuffle(3).shard(rank, world).unwrap();
            assert_eq!(shard.shard_len(), 10usize.div_ceil(world));
            let again = DataLoader::new(&[&x], 2).unwrap().shuffle(3).shard(rank, world).unwrap();
            assert_eq!(shard.indices(5), again.indices(5), "the same for a given seed");
            seen.extend(shard.indices(5));
        }
        seen.sort();
        let padded = 10usize.div_ceil(world) * world;
        assert_eq!(seen.len(), padded);
        seen.dedup();
        assert_eq!(seen.len(), 10, "world {world}: every sample, none twice beyond the padding");
    }
    // Batch b of two ranks with batch 2 holds batch b of one rank with batch 4.
    let order = whole.indices(5);
    let r0 = DataLoader::new(&[&x], 2).unwrap().shuffle(3).shard(0, 2).unwrap().indices(5);
    let r1 = DataLoader::new(&[&x], 2).unwrap().shuffle(3).shard(1, 2).unwrap().indices(5);
    let mut b0: Vec<usize> = r0[..2].iter().chain(&r1[..2]).copied().collect();
    let mut w0 = order[..4].to_vec();
    b0.sort();
    w0.sort();
    assert_eq!(b0, w0);
    assert!(DataLoader::new(&[&x], 2).unwrap().shard(2, 2).is_err());
}

// ----- MPI ranks -------------------------------------------------------------

/// Runs worker test `worker` on `np` ranks under mpirun; `None` (after
/// saying why) when this build or machine cannot.
fn mpirun(worker: &str, np: usize, extra_env: &[(&str, &str)]) -> Option<(std::process::Output, Duration)> {
    let required = std::env::var("TAPIR_REQUIRE_MPI").is_ok_and(|v| v == "1");
    if !cfg!(feature = "mpi") {
        assert!(!required, "TAPIR_REQUIRE_MPI=1 but this test binary was built without the `mpi` feature");
        println!("{worker}: skipped, built without the `mpi` feature (cargo test -p tapir-nn --features mpi)");
        return None;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        assert!(!required, "TAPIR_REQUIRE_MPI=1 but mpirun is not on the PATH");
        println!("{worker}: skipped, no mpirun on the PATH (apt-get install openmpi-bin libopenmpi-dev)");
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    // Each rank's stdout in a file of its own: through mpirun the ranks'
    // writes interleave mid-line, and libtest writes its summary in pieces.
    let outputs = std::env::temp_dir().join(format!("tapir-dist-{worker}-{np}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outputs);
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np", &np.to_string()])
        .arg("--output-filename")
        .arg(&outputs)
        .arg(exe)
        .args([worker, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        // Containers often refuse the cross-memory-attach copy that Open
        // MPI's shared-memory transport tries first.
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .env("TAPIR_DIST_WORLD", np.to_string());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut out = cmd.output().expect("mpirun runs");
    let took = t0.elapsed();
    // The ranks' stdout, whole and in rank order (mpirun's own is the
    // same text, interleaved).
    out.stdout = (0..np)
        .flat_map(|r| std::fs::read(outputs.join("1").join(format!("rank.{r}")).join("stdout")).unwrap_or_default())
        .collect();
    let _ = std::fs::remove_dir_all(&outputs);
    Some((out, took))
}

fn assert_ranks_passed(worker: &str, np: usize) {
    let _s = serial();
    let Some((out, _)) = mpirun(worker, np, &[]) else { return };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{worker} on {np} ranks failed:\n{stdout}\n{stderr}");
    // Each rank's test harness reports its one test as passed.
    assert_eq!(stdout.matches("test result: ok. 1 passed").count(), np, "{stdout}\n{stderr}");
}

#[test]
fn mpi_two_ranks_follow_one_rank_with_twice_the_batch() {
    assert_ranks_passed("rank_ddp_follows_one_rank", 2);
}

#[test]
fn mpi_four_ranks_follow_one_rank_with_four_times_the_batch() {
    assert_ranks_passed("rank_ddp_follows_one_rank", 4);
}

#[test]
fn mpi_sharded_adam_matches_data_parallel_with_a_quarter_of_the_state() {
    assert_ranks_passed("rank_zero1_matches_ddp", 2);
}

#[test]
fn mpi_gpt_two_ranks_follow_one_rank() {
    assert_ranks_passed("rank_gpt_follows_one_rank", 2);
}

#[test]
fn mpi_mismatched_shapes_are_an_error_naming_them() {
    assert_ranks_passed("rank_mismatched_shapes", 2);
}

#[test]
fn mpi_a_failing_rank_ends_the_others_promptly() {
    let _s = serial();
    for mode in ["abort", "exit"] {
        let Some((out, took)) = mpirun("rank_fails_mid_training", 2, &[("TAPIR_DIST_FAIL", mode)]) else { return };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{mode}: the job succeeded although rank 1 failed");
        assert!(took < Duration::from_secs(30), "{mode}: the other rank took {took:?} to end");
        if mode == "abort" {
            assert!(stderr.contains("rank 1 of 2 aborting the job: step 3 failed"), "{stderr}");
        }
    }
}

/// The world this worker runs in, or `None` outside mpirun.
fn world() -> Option<Communicator> {
    std::env::var("TAPIR_DIST_WORLD").ok()?;
    #[cfg(feature = "mpi")]
    {
        Some(Communicator::mpi().expect("MPI initializes"))
    }
    #[cfg(not(feature = "mpi"))]
    {
        None
    }
}

#[test]
#[ignore = "a rank of an MPI job, run by mpi_*_follow_one_rank_* under mpirun"]
fn rank_ddp_follows_one_rank() {
    let Some(comm) = world() else { return };
    let (rank, n) = (comm.rank(), comm.world_size());
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        let (x, y) = data(dtype);
        let before = live();
        {
            let one = Communicator::single();
            let whole = DataLoader::new(&[&x, &y], 4 * n).unwrap().shuffle(11);
            let mine = DataLoader::new(&[&x, &y], 4).unwrap().shuffle(11).shard(rank, n).unwrap();
            let reference = train_mlp(&one, &whole, dtype, 20, Mode::Plain);
            let ddp = train_mlp(&comm, &mine, dtype, 20, Mode::Ddp);
            for (s, (a, b)) in reference.losses.iter().zip(&ddp.losses).enumerate() {
                assert!((a - b).abs() <= tol * (1.0 + a.abs()), "rank {rank} {dtype} step {s}: loss {b} vs {a}");
            }
            // The averaged gradients are the big batch's gradients.
            for (s, (a, b)) in reference.grads.iter().zip(&ddp.grads).enumerate() {
                let scale = a.iter().fold(0f64, |m, x| m.max(x.abs()));
                for (u, v) in a.iter().zip(b) {
                    assert!((u - v).abs() <= tol * (1.0 + scale), "rank {rank} {dtype} step {s}: gradient {v} vs {u}");
                }
            }
            // Identical on every rank: rank 0's parameters broadcast match.
            for p in &ddp.params {
                let mut mine = Tensor::from_vec(p.clone(), [p.len()]).unwrap();
                let own = mine.clone();
                comm.broadcast(&mut mine, 0).unwrap();
                assert_eq!(
                    mine.to_vec::<f64>().unwrap(),
                    own.to_vec::<f64>().unwrap(),
                    "rank {rank}: parameters differ"
                );
            }
            assert_eq!(reference.params.len(), ddp.params.len());
        }
        assert_eq!(live(), before, "rank {rank}: bytes left after the run");
    }
}

#[test]
#[ignore = "a rank of an MPI job, run by mpi_sharded_adam_* under mpirun"]
fn rank_zero1_matches_ddp() {
    let Some(comm) = world() else { return };
    let n = comm.world_size();
    let (x, y) = data(DType::F32);
    let mine = DataLoader::new(&[&x, &y], 8).unwrap().shuffle(5).shard(comm.rank(), n).unwrap();
    let ddp = train_mlp(&comm, &mine, DType::F32, 10, Mode::Ddp);
    let zero = train_mlp(&comm, &mine, DType::F32, 10, Mode::Zero);
    for (a, b) in ddp.losses.iter().zip(&zero.losses) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "ZeRO-1 loss {b} vs DDP {a}");
    }
    // Optimizer state per rank: exactly 1/N of Adam's on the whole model.
    let (store, _) = mlp(DType::F32);
    let mut sharded = ShardedAdam::new(&comm, Adam::new(1e-2), &store).unwrap();
    let mut store = store;
    let zeros = Grads::from_tensors(
        store.iter().map(|(_, _, t)| Tensor::zeros(t.dims().to_vec(), t.dtype()).unwrap()).collect(),
    );
    sharded.step(&mut store, &zeros).unwrap();
    let mut full = Adam::new(1e-2);
    full.step(&mut store, &zeros).unwrap();
    let full_bytes: usize = full.state().iter().flatten().map(|t| t.numel() * 4).sum();
    let padded = store.numel().div_ceil(n) * n;
    assert_eq!(sharded.state_bytes() * n, padded * 2 * 4);
    assert_eq!(full_bytes, store.numel() * 2 * 4);
}

#[test]
#[ignore = "a rank of an MPI job, run by mpi_gpt_two_ranks_follow_one_rank under mpirun"]
fn rank_gpt_follows_one_rank() {
    let Some(comm) = world() else { return };
    let (rank, n) = (comm.rank(), comm.world_size());
    let cfg = GptConfig {
        vocab: 11,
        block_size: 8,
        d_model: 16,
        n_layer: 2,
        n_head: 2,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: true,
    };
    let mut rng = Rng::new(3);
    let ids = rng.randint([32, 8], 11, DType::I64).unwrap();
    let targets = rng.randint([32, 8], 11, DType::I64).unwrap();
    let run = |comm: &Communicator, loader: &DataLoader| -> Vec<f64> {
        let mut store = ParamStore::new();
        let gpt = Gpt::new(&mut store, cfg.clone(), &mut Rng::new(9), DType::F32).unwrap();
        let mut ddp = DataParallel::new(comm, &mut store, DdpOptions { bucket_bytes: 4096, root: 0 }).unwrap();
        let mut opt = Adam::new(3e-3);
        let mut losses = Vec::new();
        for epoch in 0..10 {
            for batch in loader.epoch(epoch) {
                let batch = batch.unwrap();
                let (loss, grads) = Graph::scope(|g| {
                    let p = store.bind(g);
                    let loss = gpt.loss(&p, &batch[0], &batch[1], None)?;
                    let value = loss.value()?.to_vec_f64()[0];
                    Ok::<_, Error>((value, ddp.grads(&p, loss)?))
                })
                .unwrap();
                opt.step(&mut store, &grads).unwrap();
                let mut l = Tensor::from_vec(vec![loss], [1]).unwrap();
                comm.all_reduce(&mut l, ReduceOp::Average).unwrap();
                losses.push(l.to_vec::<f64>().unwrap()[0]);
            }
        }
        losses.truncate(20);
        losses
    };
    let whole = DataLoader::new(&[&ids, &targets], 16).unwrap().shuffle(1);
    let mine = DataLoader::new(&[&ids, &targets], 16 / n).unwrap().shuffle(1).shard(rank, n).unwrap();
    let want = run(&Communicator::single(), &whole);
    let got = run(&comm, &mine);
    assert_eq!(want.len(), 20);
    for (s, (a, b)) in want.iter().zip(&got).enumerate() {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "rank {rank} step {s}: loss {b} vs {a}");
    }
}

#[test]
#[ignore = "a rank of an MPI job, run by mpi_mismatched_shapes_are_an_error_naming_them under mpirun"]
fn rank_mismatched_shapes() {
    let Some(comm) = world() else { return };
    let mut t = Tensor::zeros([3 + comm.rank()], DType::F32).unwrap();
    let err = comm.all_reduce(&mut t, ReduceOp::Sum).unwrap_err().to_string();
    assert!(err.contains("rank 0: float32 [3]") && err.contains("rank 1: float32 [4]"), "{err}");
    // A model that differs between ranks is refused by name.
    let mut store = ParamStore::new();
    store.add("w", Tensor::zeros([2, 2 + comm.rank()], DType::F32).unwrap()).unwrap();
    let err = DataParallel::new(&comm, &mut store, DdpOptions::default()).unwrap_err().to_string();
    assert!(err.contains("parameter 'w'"), "{err}");
    // The world is still usable after a detected mismatch.
    let mut ok = Tensor::ones([2], DType::F32).unwrap();
    comm.all_reduce(&mut ok, ReduceOp::Sum).unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), vec![comm.world_size() as f32; 2]);
}

#[test]
#[ignore = "a rank of an MPI job, run by mpi_a_failing_rank_ends_the_others_promptly under mpirun"]
fn rank_fails_mid_training() {
    let Some(comm) = world() else { return };
    let mode = std::env::var("TAPIR_DIST_FAIL").unwrap_or_default();
    let mut t = Tensor::ones([1000], DType::F32).unwrap();
    for step in 0..1_000_000 {
        if comm.rank() == 1 && step == 3 {
            match mode.as_str() {
                "abort" => comm.abort("step 3 failed"),
                // Dies without finalizing MPI, as a crashed process would.
                _ => std::process::exit(7),
            }
        }
        comm.all_reduce(&mut t, ReduceOp::Average).unwrap();
    }
    unreachable!("rank {} outlived its failed peer", comm.rank());
}
