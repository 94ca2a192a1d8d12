//! A training loop: an MLP classifier on generated data, with Adam,
//! shuffled mini-batches, and a checkpoint saved and loaded to resume
//! training exactly where it stopped.
//!
//! Run: `cargo run --release --example 02_train_classifier` (add
//! `-- --device cuda` for CUDA).

use std::collections::BTreeMap;

use tapir::prelude::*;

mod common;

const CLASSES: usize = 3;

/// Three interleaved spiral arms in the plane, `n` points each, with
/// labels 0, 1, 2.
fn spirals(n: usize, rng: &mut Rng, device: Device) -> Result<(Tensor, Tensor)> {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for class in 0..CLASSES {
        for i in 0..n {
            let r = i as f64 / n as f64;
            let angle = class as f64 * 2.1 + 4.0 * r + 0.2 * rng.normal();
            xs.extend([(r * angle.sin()) as f32, (r * angle.cos()) as f32]);
            ys.push(class as i64);
        }
    }
    Ok((
        Tensor::from_vec(xs, [CLASSES * n, 2])?.to_device(device)?,
        Tensor::from_vec(ys, [CLASSES * n])?.to_device(device)?,
    ))
}

/// The model on `device`: parameters in a store, a network that holds their ids.
fn model(seed: u64, device: Device) -> Result<(ParamStore, Mlp)> {
    let mut store = ParamStore::new();
    let net = Mlp::new(&mut store, "mlp", &[2, 64, 64, CLASSES], Activation::Relu, &mut Rng::new(seed), DType::F32)?;
    store.to_device(device)?;
    Ok((store, net))
}

/// One epoch of training; returns the mean loss over its batches.
fn train_epoch(store: &mut ParamStore, net: &Mlp, opt: &mut Adam, loader: &DataLoader, epoch: u64) -> Result<f64> {
    let mut total = 0.0;
    for batch in loader.epoch(epoch) {
        let batch = batch?;
        // The step's graph lives exactly as long as this scope.
        let (loss, grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let logits = net.forward(&p, g.constant(batch[0].clone()))?;
            let loss = logits.sparse_cross_entropy(&batch[1])?; // no one-hot
            Ok::<_, Error>((loss.item()?, p.grads(loss)?))
        })?; // the arena is freed here
        opt.step(store, &grads)?;
        total += loss;
    }
    Ok(total / loader.num_batches() as f64)
}

/// Fraction of points whose largest logit is their label.
fn accuracy(store: &ParamStore, net: &Mlp, x: &Tensor, y: &Tensor) -> Result<f64> {
    let logits = Graph::scope(|g| net.forward(&store.bind(g), g.constant(x.clone()))?.value())?;
    let predicted = logits.argmax(-1, false)?.to_vec_f64();
    let labels = y.to_vec::<i64>()?;
    let right = predicted.iter().zip(&labels).filter(|(p, l)| **p as i64 == **l).count();
    Ok(right as f64 / labels.len() as f64)
}

fn main() -> anyhow::Result<()> {
    let device = common::device()?;
    let mut rng = Rng::new(42);
    let (x, y) = spirals(200, &mut rng, device)?;
    let (test_x, test_y) = spirals(100, &mut rng, device)?;
    println!("data: {} training points {}, labels {}", x.dims()[0], x.shape(), y.shape());

    let (mut store, net) = model(0, device)?;
    println!("model: MLP 2-64-64-{CLASSES} (ReLU), {} parameters", store.numel());
    let mut opt = Adam::new(1e-2);
    let loader = DataLoader::new(&[&x, &y], 32)?.shuffle(7);

    let epochs = 30;
    let halfway = epochs / 2;
    for epoch in 0..halfway {
        let loss = train_epoch(&mut store, &net, &mut opt, &loader, epoch)?;
        if epoch % 5 == 4 {
            println!(
                "epoch {:>2}  loss {loss:.4}  test accuracy {:.3}",
                epoch + 1,
                accuracy(&store, &net, &test_x, &test_y)?
            );
        }
    }

    // Save the model and the optimizer's state halfway, then resume in a
    // fresh model and optimizer, as a new process would.
    let path = std::env::temp_dir().join(format!("tapir-example-{}.safetensors", std::process::id()));
    let meta = BTreeMap::from([("epoch".to_string(), halfway.to_string())]);
    checkpoint::save(&path, &store, Some(&opt), &meta)?;
    println!("saved {} ({} bytes)", path.display(), std::fs::metadata(&path)?.len());

    let (mut resumed, net2) = model(123, device)?; // different initial weights: all overwritten by the load
    let mut opt2 = Adam::new(1e-2);
    let meta2 = checkpoint::load(&path, &mut resumed, Some(&mut opt2))?;
    std::fs::remove_file(&path)?;
    let start: u64 = meta2["epoch"].parse()?;
    println!("loaded it into a fresh model: resuming at epoch {start}, Adam at step {}", opt2.steps());

    for epoch in start..epochs {
        let a = train_epoch(&mut store, &net, &mut opt, &loader, epoch)?;
        let b = train_epoch(&mut resumed, &net2, &mut opt2, &loader, epoch)?;
        anyhow::ensure!(a == b, "the resumed run diverged at epoch {epoch}: {a} vs {b}");
        if epoch % 5 == 4 {
            println!(
                "epoch {:>2}  loss {b:.4}  test accuracy {:.3}  (the uninterrupted run: same loss, bit for bit)",
                epoch + 1,
                accuracy(&resumed, &net2, &test_x, &test_y)?
            );
        }
    }
    for (id, name, value) in store.iter() {
        anyhow::ensure!(value.to_vec::<f32>()? == resumed.get(id).to_vec::<f32>()?, "{name} differs");
    }
    let acc = accuracy(&resumed, &net2, &test_x, &test_y)?;
    println!("final test accuracy {acc:.3}; both runs hold identical parameters");
    anyhow::ensure!(acc > 0.8, "the classifier did not learn the spirals (accuracy {acc})");
    Ok(())
}
