//! The kernels of kernels/, compiled by NVRTC and run on the emulator
//! through cudarc, against results computed here on the host: one or more
//! kernels of each family (elementwise, reduce, softmax, cross_entropy,
//! index, cast), including device-function calls and local memory.

mod common;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use half::{bf16, f16};
use tapir_tensor::cuda::{cached_ptx, DEFAULT_ARCH};

fn setup(test: &str) -> Option<Arc<CudaStream>> {
    if !common::emulator_or_skip(test) || !common::nvrtc_or_skip(test) {
        return None;
    }
    Some(CudaContext::new(0).expect("a context").default_stream())
}

fn func(s: &Arc<CudaStream>, file: &str, name: &str) -> CudaFunction {
    let ptx = cached_ptx(file, DEFAULT_ARCH).expect("kernels compile");
    let m = s.context().load_module(Ptx::from_src(ptx.to_string())).expect("the emulator loads the PTX");
    m.load_function(name).unwrap_or_else(|e| panic!("{name}: {e:?}"))
}

fn cfg(grid: u32, block: (u32, u32)) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block.0, block.1, 1), shared_mem_bytes: 0 }
}

#[test]
fn reductions_sum_max_argmax_and_column_sums() {
    let Some(s) = setup("reductions_sum_max_argmax_and_column_sums") else { return };
    let (rows, cols) = (5usize, 300usize);
    let mut x = common::data(rows * cols, 11, 4.0);
    x[2 * cols + 17] = f32::NAN;
    let dx = s.clone_htod(&x).unwrap();
    let (r, c) = (rows as i64, cols as i64);
    for (name, k) in [("sum_last_f32", 0), ("max_last_f32", 1), ("min_last_f32", 2)] {
        let f = func(&s, "reduce.cu", name);
        let mut out = s.alloc_zeros::<f32>(rows).unwrap();
        let mut l = s.launch_builder(&f);
        l.arg(&r).arg(&c).arg(&dx).arg(&mut out);
        // SAFETY: (rows, cols, x, out).
        unsafe { l.launch(cfg(3, (128, 1))) }.unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        for row in 0..rows {
            let xs = &x[row * cols..(row + 1) * cols];
            if row == 2 {
                assert!(got[row].is_nan(), "{name}: a NaN row gives NaN, got {}", got[row]);
                continue;
            }
            let want = match k {
                0 => xs.iter().map(|&v| f64::from(v)).sum::<f64>() as f32,
                1 => xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max),
                _ => xs.iter().cloned().fold(f32::INFINITY, f32::min),
            };
            assert!((got[row] - want).abs() <= 1e-4 * want.abs().max(1.0), "{name} row {row}: {} vs {want}", got[row]);
        }
    }
    let f = func(&s, "reduce.cu", "argmax_last_f32");
    let mut out = s.alloc_zeros::<i64>(rows).unwrap();
    let mut l = s.launch_builder(&f);
    l.arg(&r).arg(&c).arg(&dx).arg(&mut out);
    // SAFETY: (rows, cols, x, out).
    unsafe { l.launch(cfg(rows as u32, (64, 1))) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for row in 0..rows {
        let xs = &x[row * cols..(row + 1) * cols];
        let want = if row == 2 {
            17
        } else {
            let m = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            xs.iter().position(|&v| v == m).unwrap() as i64
        };
        assert_eq!(got[row], want, "argmax row {row}");
    }
    // Column sums with blockDim (32, 8): threads walk columns and rows, shared memory finishes.
    let x: Vec<f32> = common::data(rows * cols, 12, 4.0);
    let dx = s.clone_htod(&x).unwrap();
    let f = func(&s, "reduce.cu", "sum_cols_f32");
    let mut out = s.alloc_zeros::<f32>(cols).unwrap();
    let mut l = s.launch_builder(&f);
    l.arg(&r).arg(&c).arg(&dx).arg(&mut out);
    // SAFETY: (rows, cols, x, out).
    unsafe { l.launch(cfg(cols.div_ceil(32) as u32, (32, 8))) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for col in 0..cols {
        let want: f32 = (0..rows).map(|r| x[r * cols + col]).sum();
        assert!((got[col] - want).abs() < 1e-4, "column {col}: {} vs {want}", got[col]);
    }
}

#[test]
fn cross_entropy_forward_and_backward() {
    let Some(s) = setup("cross_entropy_forward_and_backward") else { return };
    let (rows, v) = (6usize, 700usize);
    let x = common::data(rows * v, 21, 4.0);
    let labels: Vec<i64> = vec![3, 699, -100, 0, 250, 512];
    let dx = s.clone_htod(&x).unwrap();
    let dl = s.clone_htod(&labels).unwrap();
    let mut lse = s.alloc_zeros::<f32>(rows).unwrap();
    let mut loss = s.alloc_zeros::<f32>(rows).unwrap();
    let mut bad = s.alloc_zeros::<u64>(1).unwrap();
    let mut valid = s.alloc_zeros::<u64>(1).unwrap();
    let f = func(&s, "cross_entropy.cu", "ce_fwd_f32_i64");
    let (r, vv, ignore, smooth) = (rows as i64, v as i64, -100i64, 0f64);
    // No bias: the sparse loss's launch passes a null bias pointer.
    let no_bias = 0u64;
    let mut l = s.launch_builder(&f);
    l.arg(&r)
        .arg(&vv)
        .arg(&dx)
        .arg(&no_bias)
        .arg(&dl)
        .arg(&ignore)
        .arg(&smooth)
        .arg(&mut lse)
        .arg(&mut loss)
        .arg(&mut bad)
        .arg(&mut valid);
    // SAFETY: ce_fwd(rows, v, x, bias, labels, ignore_index, smoothing, lse, loss, bad_row, valid).
    unsafe { l.launch(cfg(4, (256, 1))) }.unwrap();
    let (glse, gloss) = (s.clone_dtoh(&lse).unwrap(), s.clone_dtoh(&loss).unwrap());
    assert_eq!(s.clone_dtoh(&bad).unwrap(), vec![0], "no bad label (the word holds !row, 0 for none)");
    assert_eq!(s.clone_dtoh(&valid).unwrap(), vec![5], "five rows are not ignored");
    let mut want_lse = vec![0f64; rows];
    for row in 0..rows {
        let xs = &x[row * v..(row + 1) * v];
        let m = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        want_lse[row] = m + xs.iter().map(|&e| (f64::from(e) - m).exp()).sum::<f64>().ln();
        assert!((f64::from(glse[row]) - want_lse[row]).abs() < 1e-4, "lse row {row}");
        let want = if labels[row] < 0 { 0.0 } else { want_lse[row] - f64::from(xs[labels[row] as usize]) };
        assert!((f64::from(gloss[row]) - want).abs() < 1e-4, "loss row {row}: {} vs {want}", gloss[row]);
    }
    // Backward in place, mean over the valid rows, scalar upstream gradient.
    let g = s.clone_htod(&[1f32]).unwrap();
    let mut dx = dx;
    let f = func(&s, "cross_entropy.cu", "ce_bwd_f32_i64");
    let (gs, scale) = (0i64, 1.0 / 5.0f64);
    let mut l = s.launch_builder(&f);
    l.arg(&r).arg(&vv).arg(&mut dx).arg(&no_bias).arg(&lse).arg(&dl).arg(&ignore).arg(&smooth).arg(&g).arg(&gs);
    l.arg(&scale);
    // SAFETY: ce_bwd(rows, v, x, bias, lse, labels, ignore_index, smoothing, g, g_stride, scale).
    unsafe { l.launch(cfg(4, (256, 1))) }.unwrap();
    let grad = s.clone_dtoh(&dx).unwrap();
    for row in 0..rows {
        for j in 0..v {
            let want = if labels[row] < 0 {
                0.0
            } else {
                let p = (f64::from(x[row * v + j]) - want_lse[row]).exp();
                (p - if j as i64 == labels[row] { 1.0 } else { 0.0 }) * scale
            };
            assert!((f64::from(grad[row * v + j]) - want).abs() < 1e-6, "grad [{row}, {j}]");
        }
    }
    // A label past v is reported in bad_row (the lowest such row, as !row).
    let bad_labels = s.clone_htod(&[0i64, 700, 1, 9999, 2, 3]).unwrap();
    let mut bad = s.alloc_zeros::<u64>(1).unwrap();
    let f = func(&s, "cross_entropy.cu", "ce_fwd_f32_i64");
    let null = 0u64;
    let mut l = s.launch_builder(&f);
    l.arg(&r)
        .arg(&vv)
        .arg(&dx)
        .arg(&no_bias)
        .arg(&bad_labels)
        .arg(&ignore)
        .arg(&smooth)
        .arg(&mut lse)
        .arg(&mut loss)
        .arg(&mut bad)
        .arg(&null);
    // SAFETY: as above, valid null.
    unsafe { l.launch(cfg(2, (128, 1))) }.unwrap();
    assert_eq!(s.clone_dtoh(&bad).unwrap(), vec![!1u64], "row 1, as its complement");
}

#[test]
fn index_and_cast_kernels() {
    let Some(s) = setup("index_and_cast_kernels") else { return };
    // embedding(rows, dim, n, table, ids, out, bad)
    let (rows, dim) = (10usize, 7usize);
    let table = common::data(rows * dim, 31, 4.0);
    let ids: Vec<i64> = vec![3, 0, 9, 3];
    let (dt, di) = (s.clone_htod(&table).unwrap(), s.clone_htod(&ids).unwrap());
    let mut out = s.alloc_zeros::<f32>(ids.len() * dim).unwrap();
    let mut bad = s.clone_htod(&[u64::MAX]).unwrap();
    let f = func(&s, "index.cu", "embedding_f32_i64");
    let (r, d, n) = (rows as i64, dim as i64, ids.len() as i64);
    let mut l = s.launch_builder(&f);
    l.arg(&r).arg(&d).arg(&n).arg(&dt).arg(&di).arg(&mut out).arg(&mut bad);
    // SAFETY: embedding(rows, dim, n, table, ids, out, bad).
    unsafe { l.launch(cfg(1, (64, 1))) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(&got[k * dim..(k + 1) * dim], &table[id as usize * dim..(id as usize + 1) * dim]);
    }
    assert_eq!(s.clone_dtoh(&bad).unwrap(), vec![u64::MAX]);
    // cast f32 -> f16 (rounding, subnormals, overflow) and -> i32 (saturation, NaN).
    let xs = [1.0f32, 65504.0, 70000.0, 1e-7, -2.5, f32::NAN, 3.0e9, -3.0e9, 0.33333334];
    let dx = s.clone_htod(&xs).unwrap();
    let n = xs.len() as i64;
    let mut h = s.alloc_zeros::<u16>(xs.len()).unwrap();
    let f = func(&s, "cast.cu", "cast_f32_f16");
    let mut l = s.launch_builder(&f);
    l.arg(&n).arg(&dx).arg(&mut h);
    // SAFETY: cast(n, x, out).
    unsafe { l.launch(cfg(1, (32, 1))) }.unwrap();
    let got = s.clone_dtoh(&h).unwrap();
    for (k, &v) in xs.iter().enumerate() {
        let want = f16::from_f32(v);
        assert!(
            got[k] == want.to_bits() || (v.is_nan() && f16::from_bits(got[k]).is_nan()),
            "f16({v}) = {:#x}, want {:#x}",
            got[k],
            want.to_bits()
        );
    }
    let mut i = s.alloc_zeros::<i32>(xs.len()).unwrap();
    let f = func(&s, "cast.cu", "cast_f32_i32");
    let mut l = s.launch_builder(&f);
    l.arg(&n).arg(&dx).arg(&mut i);
    // SAFETY: cast(n, x, out).
    unsafe { l.launch(cfg(1, (32, 1))) }.unwrap();
    let got = s.clone_dtoh(&i).unwrap();
    let want: Vec<i32> = xs.iter().map(|&v| v as i32).collect();
    assert_eq!(got, want, "f32 -> i32 truncates and saturates, NaN -> 0, as Rust's `as`");
    let bs: Vec<u16> = xs.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let db = s.clone_htod(&bs).unwrap();
    let mut o = s.alloc_zeros::<f32>(xs.len()).unwrap();
    let f = func(&s, "cast.cu", "cast_bf16_f32");
    let mut l = s.launch_builder(&f);
    l.arg(&n).arg(&db).arg(&mut o);
    // SAFETY: cast(n, x, out).
    unsafe { l.launch(cfg(1, (32, 1))) }.unwrap();
    let got = s.clone_dtoh(&o).unwrap();
    for (k, &b) in bs.iter().enumerate() {
        let w = bf16::from_bits(b).to_f32();
        assert!(got[k] == w || (w.is_nan() && got[k].is_nan()), "bf16 {b:#x} -> {} not {w}", got[k]);
    }
}

#[test]
fn f64_transcendentals_through_device_functions() {
    let Some(s) = setup("f64_transcendentals_through_device_functions") else { return };
    // Large arguments take sin's slow path: a device-function call with a local-memory array.
    let xs = [0.5f64, -3.0, 1.0e10, 123456.789, 1.0e300, 7.0];
    let dx = s.clone_htod(&xs).unwrap();
    let mut out = s.alloc_zeros::<f64>(xs.len()).unwrap();
    let (n, ndim, null, zero, p) = (xs.len() as i64, 1i32, 0u64, 0i64, 0f64);
    for (name, f_host) in [("sin_f64", f64::sin as fn(f64) -> f64), ("cos_f64", f64::cos), ("exp_f64", f64::exp)] {
        let f = func(&s, "elementwise.cu", name);
        let mut l = s.launch_builder(&f);
        l.arg(&n).arg(&ndim).arg(&null).arg(&dx).arg(&zero).arg(&p).arg(&p).arg(&mut out);
        // SAFETY: unary(n, ndim, info, x, x_off, p0, p1, out).
        unsafe { l.launch(cfg(1, (32, 1))) }.unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        for (k, &x) in xs.iter().enumerate() {
            let want = f_host(x);
            let ok = (got[k] - want).abs() <= 4.0 * f64::EPSILON * want.abs().max(1e-300)
                || (want.is_infinite() && got[k] == want);
            assert!(ok, "{name}({x}) = {} not {want}", got[k]);
        }
    }
    // pow calls __internal_accurate_pow.
    let f = func(&s, "elementwise.cu", "powf_f64");
    let p0 = 1.7f64;
    let mut l = s.launch_builder(&f);
    let ys = [0.5f64, 3.0, 10.0, 1.0e-3, 2.0, 7.25];
    let dy = s.clone_htod(&ys).unwrap();
    l.arg(&n).arg(&ndim).arg(&null).arg(&dy).arg(&zero).arg(&p0).arg(&p).arg(&mut out);
    // SAFETY: as above.
    unsafe { l.launch(cfg(1, (32, 1))) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for (k, &y) in ys.iter().enumerate() {
        let want = y.powf(p0);
        assert!((got[k] - want).abs() <= 4.0 * f64::EPSILON * want, "{y}^{p0} = {} not {want}", got[k]);
    }
}
