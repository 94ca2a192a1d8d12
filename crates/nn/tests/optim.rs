//! Each optimizer against steps computed by hand with torch.optim's update
//! rules (written out below, element by element), plus clipping and the
//! learning-rate schedules.

use tapir_nn::{Adam, Grads, Optimizer, ParamStore, Schedule, Sgd};
use tapir_tensor::prelude::*;

const P0: [f64; 3] = [0.5, -1.0, 2.0];
const G1: [f64; 3] = [0.1, -0.2, 0.3];
const G2: [f64; 3] = [-0.4, 0.5, 0.05];

fn store(group: &str) -> (ParamStore, tapir_nn::ParamId) {
    let mut s = ParamStore::new();
    let id = s.add_to_group("p", group, Tensor::from_vec(P0.to_vec(), [3]).unwrap()).unwrap();
    (s, id)
}

fn grads(g: &[f64]) -> Grads {
    Grads::from_tensors(vec![Tensor::from_vec(g.to_vec(), [3]).unwrap()])
}

/// Two steps of `opt` from P0 with gradients G1 then G2.
fn two_steps(mut opt: impl Optimizer, group: &str) -> Vec<f64> {
    let (mut s, id) = store(group);
    opt.step(&mut s, &grads(&G1)).unwrap();
    opt.step(&mut s, &grads(&G2)).unwrap();
    s.get(id).to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64]) {
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-14, "{a:?} vs {b:?}");
    }
}

/// torch.optim.SGD: d = g + wd p; buf = d (first step) else mu buf + d;
/// d = d + mu buf (nesterov) or buf; p -= lr d.
fn sgd_ref(lr: f64, mu: f64, nesterov: bool, wd: f64) -> Vec<f64> {
    let mut p = P0.to_vec();
    let mut buf = [0.0; 3];
    for (t, g) in [G1, G2].iter().enumerate() {
        for i in 0..3 {
            let mut d = g[i] + wd * p[i];
            if mu != 0.0 {
                buf[i] = if t == 0 { d } else { mu * buf[i] + d };
                d = if nesterov { d + mu * buf[i] } else { buf[i] };
            }
            p[i] -= lr * d;
        }
    }
    p
}

#[test]
fn sgd_plain() {
    close(&two_steps(Sgd::new(0.1), "default"), &sgd_ref(0.1, 0.0, false, 0.0));
    // By hand: 0.5 - 0.1 * 0.1 - 0.1 * -0.4 = 0.53.
    assert!((two_steps(Sgd::new(0.1), "default")[0] - 0.53).abs() < 1e-15);
}

#[test]
fn sgd_momentum() {
    close(&two_steps(Sgd::with_momentum(0.1, 0.9, false), "default"), &sgd_ref(0.1, 0.9, false, 0.0));
    // By hand, element 0: buf = 0.1, p = 0.49; buf = 0.9*0.1 - 0.4 = -0.31, p = 0.49 + 0.031.
    assert!((two_steps(Sgd::with_momentum(0.1, 0.9, false), "default")[0] - 0.521).abs() < 1e-15);
}

#[test]
fn sgd_nesterov() {
    close(&two_steps(Sgd::with_momentum(0.1, 0.9, true), "default"), &sgd_ref(0.1, 0.9, true, 0.0));
}

#[test]
fn sgd_weight_decay() {
    let mut opt = Sgd::with_momentum(0.1, 0.9, true);
    opt.weight_decay = 0.01;
    close(&two_steps(opt, "default"), &sgd_ref(0.1, 0.9, true, 0.01));
}

/// torch.optim.Adam / AdamW: (AdamW) p *= 1 - lr wd, or (Adam) g += wd p;
/// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
fn adam_ref(lr: f64, wd: f64, decoupled: bool) -> Vec<f64> {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
    let mut p = P0.to_vec();
    let (mut m, mut v) = ([0.0; 3], [0.0; 3]);
    for (k, g) in [G1, G2].iter().enumerate() {
        let t = k as i32 + 1;
        for i in 0..3 {
            let mut gi = g[i];
            if decoupled {
                p[i] *= 1.0 - lr * wd;
            } else {
                gi += wd * p[i];
            }
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            let denom = v[i].sqrt() / (1.0 - b2.powi(t)).sqrt() + eps;
            p[i] -= lr / (1.0 - b1.powi(t)) * m[i] / denom;
        }
    }
    p
}

#[test]
fn adam() {
    close(&two_steps(Adam::new(0.01), "default"), &adam_ref(0.01, 0.0, false));
    // The first Adam step moves each element by lr * sign(g) (up to eps).
    let (mut s, id) = store("default");
    Adam::new(0.01).step(&mut s, &grads(&G1)).unwrap();
    for (x, y) in s.get(id).to_vec::<f64>().unwrap().iter().zip([0.49, -0.99, 1.99]) {
        assert!((x - y).abs() < 1e-8, "{x} vs {y}");
    }
}

#[test]
fn adam_with_l2_weight_decay() {
    let mut opt = Adam::new(0.01);
    opt.weight_decay = 0.1;
    close(&two_steps(opt, "default"), &adam_ref(0.01, 0.1, false));
}

#[test]
fn adamw_decays_except_no_decay_group() {
    close(&two_steps(Adam::adamw(0.01, 0.1), "default"), &adam_ref(0.01, 0.1, true));
    close(&two_steps(Adam::adamw(0.01, 0.1), "no_decay"), &adam_ref(0.01, 0.0, true));
}

#[test]
fn optimizers_reject_mismatched_gradients() {
    let (mut s, _) = store("default");
    let bad = Grads::from_tensors(vec![Tensor::zeros([4], DType::F64).expect("alloc")]);
    assert!(matches!(Adam::new(0.1).step(&mut s, &bad), Err(Error::ShapeMismatch { .. })));
    assert!(Sgd::new(0.1).step(&mut s, &Grads::from_tensors(vec![])).is_err());
}

#[test]
fn optimizer_state_is_allocated_once() {
    let (mut s, _) = store("default");
    let mut opt = Adam::new(0.01);
    opt.step(&mut s, &grads(&G1)).unwrap();
    let ptrs: Vec<_> = opt.state()[0].iter().map(|t| t.storage_ptr()).collect();
    for _ in 0..3 {
        opt.step(&mut s, &grads(&G2)).unwrap();
    }
    let after: Vec<_> = opt.state()[0].iter().map(|t| t.storage_ptr()).collect();
    assert_eq!(ptrs, after, "moments are updated in place");
    assert_eq!(opt.steps(), 4);
}

#[test]
fn clip_global_norm_like_torch() {
    let mut g = Grads::from_tensors(vec![
        Tensor::from_vec(vec![3.0f64, 0.0], [2]).unwrap(),
        Tensor::from_vec(vec![0.0f64, 4.0], [2]).unwrap(),
    ]);
    let norm = g.clip_global_norm(1.0).unwrap();
    assert_eq!(norm, 5.0);
    let k = 1.0 / (5.0 + 1e-6); // torch: max_norm / (norm + 1e-6)
    close(&g.get(first_id()).to_vec::<f64>().unwrap(), &[3.0 * k, 0.0]);
    assert!((g.global_norm() - 5.0 * k).abs() < 1e-12);
    // Below the limit nothing changes.
    assert_eq!(g.clip_global_norm(10.0).unwrap(), g.global_norm());
}

fn first_id() -> tapir_nn::ParamId {
    store("default").1
}

#[test]
fn warmup_cosine_schedule() {
    let s = Schedule::WarmupCosine { warmup: 10, total: 110, min_factor: 0.1 };
    assert!((s.lr(1.0, 0) - 0.1).abs() < 1e-15, "linear warm-up from lr / warmup");
    assert!((s.lr(1.0, 9) - 1.0).abs() < 1e-15);
    assert!((s.lr(1.0, 10) - 1.0).abs() < 1e-15, "cosine starts at the peak");
    assert!((s.lr(1.0, 60) - 0.55).abs() < 1e-12, "half way: the mean of peak and floor");
    assert!((s.lr(1.0, 110) - 0.1).abs() < 1e-12);
    assert!((s.lr(1.0, 500) - 0.1).abs() < 1e-12, "stays at the floor");
    assert_eq!(Schedule::Constant.lr(0.3, 1000), 0.3);
}

/// Two Adam (and SGD with momentum) steps on a half-precision parameter:
/// the state is f32 and the update is the f32 update of the widened
/// parameter, rounded once per step.
#[test]
fn half_precision_parameters_keep_f32_state() {
    for dtype in [DType::F16, DType::BF16] {
        for adam in [true, false] {
            let mut s = ParamStore::new();
            let id = s.add("p", Tensor::from_vec(P0.to_vec(), [3]).unwrap().cast(dtype).unwrap()).unwrap();
            let g =
                |v: &[f64]| Grads::from_tensors(vec![Tensor::from_vec(v.to_vec(), [3]).unwrap().cast(dtype).unwrap()]);
            let mut reference = ParamStore::new();
            let rid = reference.add("p", s.get(id).cast(DType::F32).unwrap()).unwrap();
            let gr = |v: &[f64]| {
                Grads::from_tensors(vec![Tensor::from_vec(v.to_vec(), [3])
                    .unwrap()
                    .cast(dtype)
                    .unwrap()
                    .cast(DType::F32)
                    .unwrap()])
            };
            let (mut opt, mut ref_opt): (Box<dyn Optimizer>, Box<dyn Optimizer>) = if adam {
                (Box::new(Adam::new(1e-2)), Box::new(Adam::new(1e-2)))
            } else {
                (Box::new(Sgd::with_momentum(0.1, 0.9, false)), Box::new(Sgd::with_momentum(0.1, 0.9, false)))
            };
            for grad in [&G1, &G2] {
                opt.step(&mut s, &g(grad)).unwrap();
                ref_opt.step(&mut reference, &gr(grad)).unwrap();
                // The reference keeps f32 weights; round them as the half
                // parameter is rounded after each step.
                let rounded = reference.get(rid).cast(dtype).unwrap().cast(DType::F32).unwrap();
                reference.set(rid, rounded).unwrap();
            }
            assert_eq!(s.get(id).dtype(), dtype);
            assert_eq!(
                s.get(id).to_vec_f64(),
                reference.get(rid).to_vec_f64(),
                "{dtype} {}",
                if adam { "adam" } else { "sgd" }
            );
            let state = opt.state_dict();
            assert!(state.slots[0].iter().all(|t| t.dtype() == DType::F32), "{dtype}: state is {:?}", state.slots);
            // The update moved the parameter.
            assert_ne!(
                s.get(id).to_vec_f64(),
                Tensor::from_vec(P0.to_vec(), [3]).unwrap().cast(dtype).unwrap().to_vec_f64()
            );
        }
    }
}
