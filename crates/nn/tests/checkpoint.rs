//! Checkpoints: a bit-for-bit round trip of parameters and optimizer
//! state, clear errors for truncated and mismatched files (every mismatch
//! listed), and saves interrupted before the rename leaving the old
//! checkpoint loadable.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use tapir_autograd::Graph;
use tapir_nn::checkpoint::{self, Checkpoint};
use tapir_nn::{Adam, CheckpointError, Gpt, GptConfig, Mismatch, Optimizer, ParamStore, Sgd};
use tapir_tensor::prelude::*;

/// A fresh directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("tapir-nn-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(d_model: usize) -> GptConfig {
    GptConfig { vocab: 7, block_size: 6, d_model, n_layer: 2, n_head: 2, mlp_ratio: 2, dropout: 0.0, tie_weights: true }
}

fn model(d_model: usize, seed: u64) -> (ParamStore, Gpt) {
    let mut store = ParamStore::new();
    let gpt = Gpt::new(&mut store, cfg(d_model), &mut Rng::new(seed), DType::F32).unwrap();
    (store, gpt)
}

fn batch(seed: u64) -> (Tensor, Tensor) {
    let mut r = Rng::new(seed);
    (r.randint([4, 6], 7, DType::I64).unwrap(), r.randint([4, 6], 7, DType::I64).unwrap())
}

fn train_step(store: &mut ParamStore, gpt: &Gpt, opt: &mut dyn Optimizer, seed: u64) {
    let (x, y) = batch(seed);
    let grads = Graph::scope(|g| {
        let p = store.bind(g);
        p.grads(gpt.loss(&p, &x, &y, None)?)
    })
    .unwrap();
    opt.step(store, &grads).unwrap();
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

fn same_params(a: &ParamStore, b: &ParamStore) {
    assert_eq!(a.len(), b.len());
    for ((_, na, ta), (_, nb, tb)) in a.iter().zip(b.iter()) {
        assert_eq!(na, nb);
        assert_eq!(bits(ta), bits(tb), "{na}");
    }
}

fn meta(step: usize) -> BTreeMap<String, String> {
    BTreeMap::from([("train.step".to_string(), step.to_string())])
}

#[test]
fn round_trip_is_bit_for_bit_and_training_resumes_identically() {
    let dir = TempDir::new("roundtrip");
    let path = dir.file("model.safetensors");
    let (mut store, gpt) = model(8, 1);
    let mut opt = Adam::adamw(1e-2, 0.1);
    for s in 0..3 {
        train_step(&mut store, &gpt, &mut opt, s);
    }
    checkpoint::save(&path, &store, Some(&opt), &meta(3)).unwrap();

    // Load into a differently initialised model and a fresh optimizer.
    let (mut store2, gpt2) = model(8, 99);
    let mut opt2 = Adam::adamw(1e-2, 0.1);
    let m = checkpoint::load(&path, &mut store2, Some(&mut opt2)).unwrap();
    assert_eq!(m.get("train.step").map(String::as_str), Some("3"));
    same_params(&store, &store2);
    assert_eq!(opt2.steps(), 3);
    for (a, b) in opt.state().iter().zip(opt2.state()) {
        for (x, y) in a.iter().zip(b) {
            assert_eq!(bits(x), bits(y));
        }
    }
    // The next steps are identical too.
    for s in 3..5 {
        train_step(&mut store, &gpt, &mut opt, s);
        train_step(&mut store2, &gpt2, &mut opt2, s);
    }
    same_params(&store, &store2);
    // Other tools see plain tensors under the parameters' names.
    let ck = Checkpoint::read(&path).unwrap();
    assert!(ck.tensors.contains_key("wte.weight") && ck.tensors.contains_key("optim.exp_avg.wte.weight"));
    assert_eq!(ck.metadata.get("optim.kind").map(String::as_str), Some("adam"));
}

#[test]
fn sgd_momentum_round_trip() {
    let dir = TempDir::new("sgd");
    let path = dir.file("sgd.safetensors");
    let (mut store, gpt) = model(8, 1);
    let mut opt = Sgd::with_momentum(0.1, 0.9, true);
    train_step(&mut store, &gpt, &mut opt, 0);
    checkpoint::save(&path, &store, Some(&opt), &BTreeMap::new()).unwrap();
    let (mut store2, gpt2) = model(8, 2);
    let mut opt2 = Sgd::with_momentum(0.1, 0.9, true);
    checkpoint::load(&path, &mut store2, Some(&mut opt2)).unwrap();
    assert_eq!(opt2.state_dict().step, 1);
    train_step(&mut store, &gpt, &mut opt, 1);
    train_step(&mut store2, &gpt2, &mut opt2, 1);
    same_params(&store, &store2);
}

/// Adam keeps f32 state for half-precision parameters; a checkpoint of
/// them loads and training resumes identically.
#[test]
fn half_precision_parameters_with_f32_optimizer_state_round_trip() {
    let dir = TempDir::new("half-adam");
    let path = dir.file("half.safetensors");
    let make = |v: f64| {
        let mut store = ParamStore::new();
        let id = store.add("w", Tensor::full([4], v, DType::BF16).unwrap()).unwrap();
        (store, id)
    };
    let step = |store: &mut ParamStore, opt: &mut Adam, id| {
        let grads = Graph::scope(|g| {
            let b = store.bind(g);
            b.grads(b.var(id)?.cast(DType::F32)?.square()?.sum_all()?)
        })
        .unwrap();
        opt.step(store, &grads).unwrap();
    };
    let (mut store, id) = make(1.5);
    let mut opt = Adam::new(0.1);
    step(&mut store, &mut opt, id);
    checkpoint::save(&path, &store, Some(&opt), &BTreeMap::new()).unwrap();
    let (mut store2, id2) = make(0.0);
    let mut opt2 = Adam::new(0.1);
    checkpoint::load(&path, &mut store2, Some(&mut opt2)).unwrap();
    step(&mut store, &mut opt, id);
    step(&mut store2, &mut opt2, id2);
    assert_eq!(store.get(id).to_vec_f64(), store2.get(id2).to_vec_f64());
    assert_eq!(store2.get(id2).dtype(), DType::BF16);
}

#[test]
fn every_float_dtype_round_trips() {
    let dir = TempDir::new("dtypes");
    let path = dir.file("dtypes.safetensors");
    let mut store = ParamStore::new();
    let mut r = Rng::new(3);
    for (i, d) in [DType::F32, DType::F64, DType::F16, DType::BF16].into_iter().enumerate() {
        store.add(format!("p{i}"), r.randn([2, 3], d).unwrap()).unwrap();
    }
    checkpoint::save(&path, &store, None, &BTreeMap::new()).unwrap();
    let ck = Checkpoint::read(&path).unwrap();
    for (_, name, t) in store.iter() {
        let u = &ck.tensors[name];
        assert_eq!(u.dtype(), t.dtype());
        assert_eq!(u.to_vec_f64(), t.to_vec_f64(), "{name}");
    }
}

#[test]
fn truncated_file_is_a_clear_error() {
    let dir = TempDir::new("truncated");
    let path = dir.file("model.safetensors");
    let (mut store, _) = model(8, 1);
    checkpoint::save(&path, &store, None, &BTreeMap::new()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let before = store.clone();
    for keep in [bytes.len() - 1, bytes.len() / 2, 12, 3, 0] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let err = checkpoint::load(&path, &mut store, None).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, CheckpointError::Format { len, .. } if len == keep), "{msg}");
        assert!(msg.contains("model.safetensors") && msg.contains(&format!("{keep} bytes")), "{msg}");
        if keep > 8 {
            assert!(msg.contains("truncated") || msg.contains("Header"), "{msg}");
        }
    }
    same_params(&before, &store);
    let missing = checkpoint::load(dir.file("absent"), &mut store, None).unwrap_err();
    assert!(matches!(missing, CheckpointError::Io { .. }), "{missing}");
}

#[test]
fn mismatched_checkpoint_lists_every_mismatch_and_changes_nothing() {
    let dir = TempDir::new("mismatch");
    let path = dir.file("wide.safetensors");
    let (wide, _) = model(8, 1);
    checkpoint::save(&path, &wide, None, &BTreeMap::new()).unwrap();
    let (mut narrow, _) = model(4, 2);
    let before = narrow.clone();
    let err = checkpoint::load(&path, &mut narrow, None).unwrap_err();
    let CheckpointError::Mismatch { mismatches, .. } = &err else { panic!("{err}") };
    // Every parameter's shape differs (all are d_model wide), and each is listed.
    assert_eq!(mismatches.len(), narrow.len(), "{err}");
    assert!(mismatches.iter().all(|m| matches!(m, Mismatch::Shape { .. })));
    let msg = err.to_string();
    assert!(msg.contains(&format!("{} mismatch", narrow.len())), "{msg}");
    assert!(msg.contains("wte.weight: shape [7, 8] in the file, [7, 4] in the model"), "{msg}");
    assert!(msg.contains("h.1.mlp.proj.weight"), "{msg}");
    same_params(&before, &narrow);

    // Missing, unexpected, dtype and optimizer mismatches, all in one error.
    let mut other = ParamStore::new();
    other.add("a", Tensor::zeros([2], DType::F32).expect("alloc")).unwrap();
    other.add("b", Tensor::zeros([3], DType::F64).expect("alloc")).unwrap();
    other.add("extra", Tensor::zeros([1], DType::F32).expect("alloc")).unwrap();
    checkpoint::save(&path, &other, Some(&Sgd::new(0.1)), &BTreeMap::new()).unwrap();
    let mut mine = ParamStore::new();
    mine.add("a", Tensor::zeros([2], DType::F32).expect("alloc")).unwrap();
    mine.add("b", Tensor::zeros([3], DType::F32).expect("alloc")).unwrap();
    mine.add("c", Tensor::zeros([3], DType::F32).expect("alloc")).unwrap();
    let mut adam = Adam::new(0.1);
    let err = checkpoint::load(&path, &mut mine, Some(&mut adam)).unwrap_err();
    let CheckpointError::Mismatch { mismatches, .. } = &err else { panic!("{err}") };
    assert_eq!(
        mismatches,
        &vec![
            Mismatch::DType { name: "b".into(), expected: DType::F32, found: "float64".into() },
            Mismatch::Missing { name: "c".into() },
            Mismatch::Optimizer { expected: "adam".into(), found: "sgd".into() },
            Mismatch::Unexpected { name: "extra".into() },
        ],
        "{err}"
    );
}

/// Loads `path` and returns its parameters' bits.
fn load_bits(path: &Path) -> Vec<Vec<u32>> {
    let (mut store, _) = model(8, 123);
    checkpoint::load(path, &mut store, None).unwrap();
    store.iter().map(|(_, _, t)| bits(t)).collect()
}

#[test]
fn interrupted_save_leaves_the_old_checkpoint_loadable() {
    let dir = TempDir::new("interrupted");
    let path = dir.file("ck.safetensors");
    let (mut store, gpt) = model(8, 1);
    let mut opt = Adam::new(1e-2);
    checkpoint::save(&path, &store, Some(&opt), &meta(0)).unwrap();
    let old = load_bits(&path);
    train_step(&mut store, &gpt, &mut opt, 0);

    // The process "dies" after writing the temporary file, before the rename.
    let mut seen = None;
    let err = checkpoint::save_with_hook(&path, &store, Some(&opt), &meta(1), |tmp| {
        // The new file is complete and synced at this point...
        assert!(Checkpoint::read(tmp).is_ok());
        assert_eq!(tmp.parent(), path.parent(), "the temporary file is beside the target");
        seen = Some(tmp.to_path_buf());
        Err(std::io::Error::other("simulated crash before rename"))
    })
    .unwrap_err();
    assert!(err.to_string().contains("simulated crash"), "{err}");
    // ...but the checkpoint at `path` is still the old one, whole.
    assert_eq!(load_bits(&path), old);
    assert_eq!(dir.entries(), vec!["ck.safetensors"], "the failed save cleaned up after itself");

    // A real crash leaves its temporary file behind: simulate with a panic.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = checkpoint::save_with_hook(&path, &store, Some(&opt), &meta(1), |_| panic!("killed"));
    }));
    assert!(r.is_err());
    assert_eq!(dir.entries().len(), 2, "a stray temporary file: {:?}", dir.entries());
    assert_eq!(load_bits(&path), old, "the old checkpoint is untouched");

    // The next save succeeds and replaces it.
    checkpoint::save(&path, &store, Some(&opt), &meta(1)).unwrap();
    let new = load_bits(&path);
    assert_ne!(new, old);
    assert_eq!(new, store.iter().map(|(_, _, t)| bits(t)).collect::<Vec<_>>());
    assert!(seen.is_some());
}

#[test]
fn a_write_failing_halfway_leaves_the_old_checkpoint_intact() {
    let dir = TempDir::new("halfway");
    let path = dir.file("ck.safetensors");
    let (mut store, gpt) = model(8, 2);
    let mut opt = Adam::new(1e-2);
    checkpoint::save(&path, &store, Some(&opt), &meta(0)).unwrap();
    let old = load_bits(&path);
    let old_bytes = std::fs::read(&path).unwrap();
    train_step(&mut store, &gpt, &mut opt, 0);
    let mut written = 0;
    let err = checkpoint::save_with_io(
        &path,
        &store,
        Some(&opt),
        &meta(1),
        |f, bytes| {
            // Half the file reaches the disk, then the device fills up.
            written = bytes.len() / 2;
            f.write_all(&bytes[..written])?;
            f.sync_all()?;
            Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "injected: no space left"))
        },
        |_| panic!("a failed write never reaches the rename"),
    )
    .unwrap_err();
    assert!(written > 0);
    assert!(err.to_string().contains("no space left"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), old_bytes, "the old file, byte for byte");
    assert_eq!(load_bits(&path), old);
    assert_eq!(dir.entries(), vec!["ck.safetensors"], "the half-written temporary file is gone");
}
