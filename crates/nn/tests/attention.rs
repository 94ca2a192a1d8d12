//! Causal attention on every device: the causal softmax with its mask
//! computed in the kernel, and the fused attention (forward and the three
//! input gradients) against the composition of matmuls and the causal
//! softmax, in f32 to 1e-5 and in bf16 and f16 within their rounding, with
//! sequence lengths that are not multiples of the kernels' tiles and head
//! widths of each of the CUDA kernels' register layouts (32, 64, 128).
//! Forward mode and second order go through the composed rules on a graph.

use smallvec::smallvec;
use tapir_autograd::{check_grads, CheckOptions, Graph};
use tapir_nn::{causal_attention, causal_softmax, CausalAttention};
use tapir_tensor::ops::Derivative;
use tapir_tensor::prelude::*;
use tapir_testing::{assert_close, test_device};

fn rnd(shape: &[usize], seed: u64, dtype: DType, device: Device) -> Tensor {
    Rng::new(seed).normal_tensor(shape.to_vec(), 0.0, 1.0, dtype).and_then(|t| t.to_device(device)).expect("input")
}

fn host(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).and_then(|t| t.to_vec::<f64>()).expect("values")
}

/// softmax(scale * s) over keys j <= i + (tk - tq), zero elsewhere, in f64.
fn causal_ref(s: &[f64], tq: usize, tk: usize, scale: f64) -> Vec<f64> {
    s.chunks(tk)
        .enumerate()
        .flat_map(|(r, row)| {
            let n = (r % tq) + 1 + tk - tq;
            let m = row[..n].iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b * scale));
            let z: f64 = row[..n].iter().map(|&v| (v * scale - m).exp()).sum();
            (0..tk).map(move |j| if j < n { (row[j] * scale - m).exp() / z } else { 0.0 }).collect::<Vec<_>>()
        })
        .collect()
}

/// The output and the gradients of q, k, v (upstream `g`) by the fused op
/// (its eager backward) and by the composed rule, both on `q`'s device.
fn fused_and_composed(op: CausalAttention, q: &Tensor, k: &Tensor, v: &Tensor, g: &Tensor) -> [[Vec<f64>; 4]; 2] {
    let y = causal_attention(q, k, v, op.heads).expect("fused forward");
    let yc = op.composed(q, k, v).expect("composed forward");
    let d = op.vjp_eager(smallvec![q.clone(), k.clone(), v.clone()], y.clone(), g.clone()).expect("fused backward");
    let dc = op.vjp(&[q, k, v], &yc, g).expect("composed backward");
    let four = |y: &Tensor, d: &[Option<Tensor>]| {
        [host(y), host(d[0].as_ref().unwrap()), host(d[1].as_ref().unwrap()), host(d[2].as_ref().unwrap())]
    };
    [four(&y, &d), four(&yc, &dc)]
}

const PARTS: [&str; 4] = ["output", "dq", "dk", "dv"];

test_device! {
    /// The kernel computes the mask from the row and column (no mask
    /// tensor): masked entries are exact zeros, the rest match the f64
    /// reference, for square and for query-block scores, short rows (a
    /// warp a row) and long ones (a block a row).
    fn causal_softmax_masks_in_the_kernel(device: Device) -> Result<()> {
        for (tq, tk) in [(5, 5), (3, 7), (70, 70), (20, 90)] {
            for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-12), (DType::BF16, 1e-2)] {
                let s = rnd(&[2, 3, tq, tk], 4, DType::F64, device).mul_scalar(3.0)?;
                let want = causal_ref(&host(&s), tq, tk, 0.6);
                let s = s.cast(dtype)?;
                let y = causal_softmax(&s, 0.6)?;
                assert_eq!((y.device(), y.dtype(), y.dims()), (device, dtype, s.dims()));
                let got = host(&y);
                // Against the reference of the rounded inputs.
                let want_rounded = causal_ref(&host(&s), tq, tk, 0.6);
                assert_close(&format!("causal softmax {tq}x{tk} {dtype}"), &got, &want_rounded, tol);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    if *b == 0.0 {
                        assert_eq!(*a, 0.0, "masked entry {i} is an exact zero");
                    }
                }
            }
            // A strided view of the scores (a transpose of a transpose).
            let s = rnd(&[2, tk, tq], 5, DType::F32, device).transpose(1, 2)?;
            let got = host(&causal_softmax(&s, 0.6)?);
            assert_close("strided scores", &got, &causal_ref(&host(&s.contiguous()?), tq, tk, 0.6), 1e-6);
        }
        assert!(matches!(
            causal_softmax(&rnd(&[5, 3], 1, DType::F32, device), 1.0),
            Err(Error::InvalidShape { op: "causal_softmax", .. })
        ));
        Ok(())
    }

    /// The fused op against the composed rule on the same device in f32:
    /// the output and all three gradients to 1e-5, with T = 37 and 70 (not
    /// multiples of the 16-row, 8-row or 32-key tiles) and heads 32, 48 and
    /// 128 wide.
    fn fused_attention_matches_the_composition_f32(device: Device) -> Result<()> {
        for (b, t, c, heads) in [(2, 37, 64, 2), (1, 70, 96, 2), (1, 19, 128, 1)] {
            let d = c / heads;
            let op = CausalAttention { heads, scale: 1.0 / (d as f64).sqrt() };
            let [q, k, v, g] = [1, 2, 3, 4].map(|s| rnd(&[b, t, c], s, DType::F32, device));
            let [fused, composed] = fused_and_composed(op, &q, &k, &v, &g);
            for (i, name) in PARTS.iter().enumerate() {
                assert_close(&format!("[{b}, {t}, {c}] / {heads} {name}"), &fused[i], &composed[i], 1e-5);
                assert!(fused[i].iter().any(|&x| x != 0.0), "{name} is not all zero");
            }
        }
        Ok(())
    }

    /// bf16 and f16 inputs (f32 accumulation in the kernel) against the
    /// f32 composition of the same rounded inputs, within the rounding of
    /// the output dtype; the bf16 composition, which rounds the scores and
    /// probabilities too, is no closer.
    fn fused_attention_matches_the_composition_half(device: Device) -> Result<()> {
        let (b, t, c, heads) = (2, 37, 64, 2);
        let op = CausalAttention { heads, scale: 1.0 / 32f64.sqrt() };
        for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 4e-3)] {
            let [q, k, v, g] = [1, 2, 3, 4].map(|s| rnd(&[b, t, c], s, dtype, device));
            let up = |x: &Tensor| x.cast(DType::F32).expect("cast");
            let [fused, low] = fused_and_composed(op, &q, &k, &v, &g);
            let [_, reference] = fused_and_composed(op, &up(&q), &up(&k), &up(&v), &up(&g));
            for (i, name) in PARTS.iter().enumerate() {
                assert_close(&format!("{dtype} {name}"), &fused[i], &reference[i], tol);
                let err = |x: &[f64]| x.iter().zip(&reference[i]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(
                    err(&fused[i]) <= err(&low[i]) * 1.5 + 1e-6,
                    "{dtype} {name}: fused error {} against the {dtype} composition's {}",
                    err(&fused[i]),
                    err(&low[i])
                );
            }
        }
        Ok(())
    }

    /// The f16/bf16 forward's tensor-core path (on CUDA devices of compute
    /// capability 8.0 and newer, the emulated one included) at its
    /// boundaries: several 64-row blocks with T not a multiple of the
    /// 64-row block or the 32-key tile (warps whose rows see only part of
    /// a tile, and warps past T), heads padded to the fragment width (48 in
    /// 64, 30 in 32, the latter with rows not 16-byte aligned: the
    /// element-wise tile loads) and 128 wide, against the f32 composition
    /// of the same rounded inputs within the output's rounding.
    fn fused_attention_half_at_the_tensor_core_boundaries(device: Device) -> Result<()> {
        for (b, t, c, heads) in [(1, 150, 96, 2), (2, 45, 60, 2), (1, 70, 128, 1)] {
            let d = c / heads;
            let op = CausalAttention { heads, scale: 1.0 / (d as f64).sqrt() };
            for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 4e-3)] {
                let [q, k, v, g] = [1, 2, 3, 4].map(|s| rnd(&[b, t, c], s, dtype, device));
                let up = |x: &Tensor| x.cast(DType::F32).expect("cast");
                // The gradients come from the backward, which reads the forward's output.
                let [fused, reference] = [
                    fused_and_composed(op, &q, &k, &v, &g)[0].clone(),
                    fused_and_composed(op, &up(&q), &up(&k), &up(&v), &up(&g))[1].clone(),
                ];
                for (i, name) in PARTS.iter().enumerate() {
                    assert_close(&format!("[{b}, {t}, {c}] / {heads} {dtype} {name}"), &fused[i], &reference[i], tol);
                }
            }
        }
        Ok(())
    }

    /// The f16/bf16 backward's tensor-core kernels (on CUDA devices of
    /// compute capability 8.0 and newer, the emulated one included; the CPU
    /// runs the same checks on its own kernels): all three gradients
    /// against the f32 composition of the same rounded inputs, for heads 32,
    /// 64 and 128 wide (DR 1, 2, 4) and T = 1, 17, 100, 129 (one row; less
    /// than one 32-query chunk; several 64-key blocks with a partial last
    /// one; one past two 64-row blocks), over B * H = 4 (batch, head)
    /// pairs. The kernels round P and dS to the input dtype before their
    /// products, as FlashAttention does, besides the output's own rounding:
    /// each gradient is then a sum of terms each off by a few units of
    /// rounding u (2^-8 for bf16, 2^-11 for f16) of its size, and the bound
    /// is 2e-2 (5 u) for bf16 and 4e-3 (8 u) for f16 of 1 + |reference|,
    /// the existing half tests' bound; the observed worst on the emulated
    /// device is 6.7e-3 (bf16) and 9.4e-4 (f16), printed per case. The
    /// gradients are the same bits on a second run (no atomics).
    fn fused_attention_backward_half_on_the_tensor_cores(device: Device) -> Result<()> {
        for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 4e-3)] {
            for d in [32, 64, 128] {
                for t in [1, 17, 100, 129] {
                    let (b, heads) = (2, 2);
                    let c = heads * d;
                    let op = CausalAttention { heads, scale: 1.0 / (d as f64).sqrt() };
                    let [q, k, v, g] = [1, 2, 3, 4].map(|s| rnd(&[b, t, c], s, dtype, device));
                    let up = |x: &Tensor| x.cast(DType::F32).expect("cast");
                    let y = causal_attention(&q, &k, &v, heads)?;
                    let grads = || op.vjp_eager(smallvec![q.clone(), k.clone(), v.clone()], y.clone(), g.clone());
                    let (first, second) = (grads()?, grads()?);
                    let (qf, kf, vf, gf) = (up(&q), up(&k), up(&v), up(&g));
                    let yc = op.composed(&qf, &kf, &vf)?;
                    let want = op.vjp(&[&qf, &kf, &vf], &yc, &gf)?;
                    for i in 0..3 {
                        let what = format!("[{b}, {t}, {c}] / {heads} {dtype} {}", PARTS[i + 1]);
                        let got = first[i].as_ref().expect("grad");
                        assert_eq!(got.dtype(), dtype, "{what}");
                        let (got, want) = (host(got), host(want[i].as_ref().expect("grad")));
                        assert_eq!(got, host(second[i].as_ref().expect("grad")), "{what}: a second run's bits");
                        assert_close(&what, &got, &want, tol);
                        // With one key the softmax is constant: dq and dk are zero (up to rounding).
                        if t > 1 || i == 2 {
                            assert!(got.iter().any(|&x| x != 0.0), "{what} is not all zero");
                        }
                        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max);
                        println!("{device:?} {what}: worst |error| / (1 + |reference|) {worst:.2e}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Recording through the fused op uses the composed rules: forward mode
    /// (a JVP) and second order (the gradient of a gradient's norm) match
    /// the composition's on the same device, and the gradient checker
    /// passes at orders 1 and 2 (f64 heads run the fused kernels on CUDA).
    fn fused_attention_forward_mode_and_second_order(device: Device) -> Result<()> {
        let (b, t, c, heads) = (1, 11, 8, 2);
        let op = CausalAttention { heads, scale: 0.5 };
        let [q, k, v] = [5, 6, 7].map(|s| rnd(&[b, t, c], s, DType::F64, device));
        let [tq, tk, tv] = [8, 9, 10].map(|s| rnd(&[b, t, c], s, DType::F64, device));
        let run = |fused: bool| {
            Graph::scope(|g| {
                let xs = [g.leaf(q.clone()), g.leaf(k.clone()), g.leaf(v.clone())];
                let y = if fused {
                    causal_attention(&xs[0], &xs[1], &xs[2], heads)?
                } else {
                    op.composed(&xs[0], &xs[1], &xs[2])?
                };
                let jv = g.jvp(&[y], &xs, &[tq.clone(), tk.clone(), tv.clone()])?;
                let s = y.square()?.sum_all()?;
                let gr = g.grad_graph(s, &xs)?;
                let n = gr[0].square()?.sum_all()?.add(&gr[1].square()?.sum_all()?)?;
                let gg = g.grad(n, &xs)?;
                Ok::<_, Error>((host(&jv[0]), gg.iter().map(host).collect::<Vec<_>>()))
            })
        };
        let (jf, gf) = run(true)?;
        let (jc, gc) = run(false)?;
        assert_close("jvp", &jf, &jc, 1e-12);
        for (a, b) in gf.iter().zip(&gc) {
            assert_close("grad of grad", a, b, 1e-10);
        }
        check_grads(&|_g, x| causal_attention(&x[0], &x[1], &x[2], heads), &[q, k, v], &CheckOptions::default())
            .expect("gradient check");
        Ok(())
    }
}

/// On the CPU, bf16 and f16 attention and causal softmax compute in f32
/// head by head (or block by block) and round once: bit for bit what the
/// f32 kernels give on the widened inputs, rounded to the input's dtype.
#[test]
fn cpu_half_attention_is_the_f32_kernel_rounded_once() -> Result<()> {
    let (b, t, c, heads) = (2, 21, 48, 3);
    let op = CausalAttention { heads, scale: 0.3 };
    let bits = |t: &Tensor| host(t).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for dtype in [DType::BF16, DType::F16] {
        let [q, k, v, g] = [1, 2, 3, 4].map(|s| rnd(&[b, t, c], s, dtype, Device::Cpu));
        let up = |x: &Tensor| x.cast(DType::F32).expect("cast");
        let y = causal_attention(&q, &k, &v, heads)?;
        let yf = causal_attention(&up(&q), &up(&k), &up(&v), heads)?;
        assert_eq!(bits(&y), bits(&yf.cast(dtype)?), "{dtype} output");
        let d = op.vjp_eager(smallvec![q.clone(), k.clone(), v.clone()], y.clone(), g.clone())?;
        let df = op.vjp_eager(smallvec![up(&q), up(&k), up(&v)], up(&y), up(&g))?;
        for (i, (a, f)) in d.iter().zip(&df).enumerate() {
            let (a, f) = (a.as_ref().expect("grad"), f.as_ref().expect("grad"));
            assert_eq!(a.dtype(), dtype);
            assert_eq!(bits(a), bits(&f.cast(dtype)?), "{dtype} {}", PARTS[i + 1]);
        }
        let s = rnd(&[2, 3, 9, 14], 5, dtype, Device::Cpu);
        let p = causal_softmax(&s, 0.7)?;
        assert_eq!(bits(&p), bits(&causal_softmax(&up(&s), 0.7)?.cast(dtype)?), "{dtype} causal softmax");
    }
    Ok(())
}
