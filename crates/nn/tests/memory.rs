//! Exact memory: live bytes at every step boundary of a training loop are
//! identical after the first step (which allocates the optimizer's moments),
//! and everything is returned when the model goes. The allocator's counters
//! are process-wide, so the tests in this file run one at a time.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use tapir_autograd::Graph;
use tapir_nn::{checkpoint, Adam, Gpt, GptConfig, Optimizer, ParamStore};
use tapir_tensor::prelude::*;

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn live() -> usize {
    memory_allocated(Device::Cpu)
}

fn cfg(dropout: f64) -> GptConfig {
    GptConfig { vocab: 11, block_size: 8, d_model: 16, n_layer: 2, n_head: 2, mlp_ratio: 4, dropout, tie_weights: true }
}

/// One step on a fresh random batch; returns the loss.
fn step(store: &mut ParamStore, gpt: &Gpt, opt: &mut Adam, rng: &mut Rng, train: bool) -> f64 {
    let x = rng.randint([4, 8], 11, DType::I64).unwrap();
    let y = rng.randint([4, 8], 11, DType::I64).unwrap();
    let mut drop_rng = Rng::new(rng.next_u64());
    let (loss, mut grads) = Graph::scope(|g| {
        let p = store.bind(g);
        let loss = gpt.loss(&p, &x, &y, train.then_some(&mut drop_rng))?;
        Ok::<_, Error>((loss.item()?, p.grads(loss)?))
    })
    .unwrap();
    grads.clip_global_norm(1.0).unwrap();
    opt.step(store, &grads).unwrap();
    loss
}

#[test]
fn gpt_training_live_bytes_identical_at_every_step_boundary() {
    let _s = serial();
    let base = live();
    for dropout in [0.0, 0.1] {
        let mut rng = Rng::new(7);
        let mut store = ParamStore::new();
        let gpt = Gpt::new(&mut store, cfg(dropout), &mut rng, DType::F32).unwrap();
        assert_eq!(live(), base + store.bytes(), "only the parameters are live");
        let mut opt = Adam::adamw(1e-3, 0.1);
        step(&mut store, &gpt, &mut opt, &mut rng, dropout > 0.0);
        let boundary = live();
        // The moments: two per parameter, allocated once.
        assert_eq!(boundary, base + 3 * store.bytes());
        for i in 0..8 {
            step(&mut store, &gpt, &mut opt, &mut rng, dropout > 0.0);
            assert_eq!(live(), boundary, "dropout {dropout}, step {i}");
        }
        drop((store, gpt, opt));
        assert_eq!(live(), base, "everything returned");
    }
}

#[test]
fn checkpoint_save_and_load_keep_live_bytes() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("tapir-nn-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.safetensors");
    let mut rng = Rng::new(8);
    let mut store = ParamStore::new();
    let gpt = Gpt::new(&mut store, cfg(0.0), &mut rng, DType::F32).unwrap();
    let mut opt = Adam::adamw(1e-3, 0.1);
    step(&mut store, &gpt, &mut opt, &mut rng, false);
    let boundary = live();
    checkpoint::save(&path, &store, Some(&opt as &dyn Optimizer), &BTreeMap::new()).unwrap();
    assert_eq!(live(), boundary, "saving allocates no tensor that stays");
    step(&mut store, &gpt, &mut opt, &mut rng, false);
    checkpoint::load(&path, &mut store, Some(&mut opt)).unwrap();
    assert_eq!(live(), boundary, "loading replaces tensors one for one");
    step(&mut store, &gpt, &mut opt, &mut rng, false);
    assert_eq!(live(), boundary);
    let _ = std::fs::remove_dir_all(&dir);
}
