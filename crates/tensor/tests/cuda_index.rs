//! CPU-vs-CUDA parity of the indexing, joining and selection ops
//! (index_select and embedding, index_add, gather, scatter_add, where,
//! concat and stack, pad): every dtype, every axis, strided views, empty
//! tensors, duplicate indices, and bad indices giving the CPU's error with
//! no device memory left behind.
//!
//! Values are small integers, exact in every dtype, so results compare
//! exactly even where atomics add in any order; one test adds real values
//! and compares within the dtype's rounding.
//!
//! Every test needs a CUDA device (a GPU, or the emulated one with
//! `TAPIR_CUDA=emulated`); without one it says so and passes, unless
//! `TAPIR_REQUIRE_CUDA=1` makes the skip a failure.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use tapir_tensor::cuda::memory_summary;
use tapir_tensor::ops::forward;
use tapir_tensor::ops::index::IndexAdd;
use tapir_tensor::ops::shape::Pad;
use tapir_tensor::prelude::*;

#[path = "support/cuda.rs"]
mod support;
use support::cuda;

/// The device's counters are process-wide: the tests that assert live
/// bytes hold this exclusively, the others share it.
static COUNTERS: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    COUNTERS.read().unwrap_or_else(|p| p.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    COUNTERS.write().unwrap_or_else(|p| p.into_inner())
}

const DTYPES: [DType; 6] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];
const INDEX_DTYPES: [DType; 2] = [DType::I32, DType::I64];

/// Integers in `[-20, 20]`, irregular enough to catch a wrong index.
fn ints(n: usize, seed: u64) -> Vec<f64> {
    (0..n).map(|i| ((i as u64 * 7919 + seed * 104_729) % 41) as f64 - 20.0).collect()
}

fn tensor(v: Vec<f64>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v, shape.to_vec()).unwrap().cast(dtype).unwrap()
}

/// An index tensor of `dtype` (i32 or i64).
fn index(v: &[i64], shape: &[usize], dtype: DType) -> Tensor {
    let t = Tensor::from_vec(v.to_vec(), shape.to_vec()).unwrap();
    if dtype == DType::I32 {
        Tensor::from_vec(v.iter().map(|&i| i as i32).collect::<Vec<_>>(), shape.to_vec()).unwrap()
    } else {
        t
    }
}

/// Pseudo-random indices in `0..size` (so with repeats).
fn indices(n: usize, size: usize, seed: u64) -> Vec<i64> {
    (0..n).map(|i| ((i as u64 * 31 + seed * 17 + i as u64 * i as u64) % size as u64) as i64).collect()
}

fn on(dev: Device, t: &Tensor) -> Tensor {
    t.to_device(dev).unwrap()
}

/// The same values with every stride doubled (a column of a wider tensor),
/// made on the tensor's own device: a view with gaps, and an offset when
/// `second` takes the other column.
fn spread(t: &Tensor, second: bool) -> Tensor {
    let u = t.unsqueeze(-1).unwrap();
    let wide = forward(&Pad { axis: t.rank(), start: second as usize, size: 2 }, &[&u]).unwrap();
    let v = wide.narrow(-1, second as usize, 1).unwrap().squeeze(-1).unwrap();
    assert!(t.numel() < 2 || !v.is_contiguous(), "a view with gaps");
    v
}

/// A named view of a tensor, taken the same way on each device.
type View = (&'static str, fn(&Tensor) -> Tensor);

/// A call of one op on tensors it borrows.
type Call<'a> = Box<dyn Fn() -> Result<Tensor> + 'a>;

/// Asserts a CUDA result equals the CPU's exactly, and stays on the device.
fn assert_same(what: &str, cpu: &Tensor, gpu: &Tensor) {
    assert_eq!(cpu.shape(), gpu.shape(), "{what}: shape");
    assert_eq!(cpu.dtype(), gpu.dtype(), "{what}: dtype");
    assert!(matches!(gpu.device(), Device::Cuda(_)), "{what}: the result stays on the device");
    let (a, b) = (cpu.to_vec_f64(), gpu.to_device(Device::Cpu).unwrap().to_vec_f64());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits(), "{what}: element {i}: cpu {x} vs cuda {y}");
    }
}

#[tapir_testing::cuda_test]
fn cuda_index_select_matches_the_cpu_on_every_dtype_axis_and_view() {
    let _g = shared();
    let Some(dev) = cuda("cuda_index_select_matches_the_cpu_on_every_dtype_axis_and_view") else { return };
    for dtype in DTYPES {
        let base = tensor(ints(60, 1), &[3, 4, 5], dtype);
        let views: [View; 3] = [
            ("contiguous", |t| t.clone()),
            ("permuted", |t| t.permute(&[2, 0, 1]).unwrap()),
            ("narrowed", |t| t.narrow(1, 1, 3).unwrap()),
        ];
        for (name, view) in views {
            let (x, dx) = (view(&base), view(&on(dev, &base)));
            for axis in 0..3 {
                let size = x.dims()[axis];
                for ld in INDEX_DTYPES {
                    let ids = [size as i64 - 1, 0, size as i64 - 1, 1 % size as i64, 0];
                    let idx = index(&ids, &[5], ld);
                    let what = format!("index_select {dtype:?} {name} axis {axis} {ld:?}");
                    assert_same(
                        &what,
                        &x.index_select(axis as isize, &idx).unwrap(),
                        &dx.index_select(axis as isize, &on(dev, &idx)).unwrap(),
                    );
                }
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_embedding_matches_the_cpu_on_short_and_long_rows_and_strided_ids() {
    let _g = shared();
    let Some(dev) = cuda("cuda_embedding_matches_the_cpu_on_short_and_long_rows_and_strided_ids") else { return };
    // 3 wide rows take the flat kernel, 130 wide the row-per-block one.
    for (dtype, dim) in
        [(DType::F32, 3), (DType::BF16, 130), (DType::I64, 130), (DType::F16, 3), (DType::F64, 130), (DType::I32, 7)]
    {
        let table = tensor(ints(6 * dim, 2), &[6, dim], dtype);
        let dtable = on(dev, &table);
        for ld in INDEX_DTYPES {
            let ids = index(&[1, 5, 1, 0, 2, 5], &[2, 3], ld);
            let what = format!("embedding {dtype:?} dim {dim} {ld:?}");
            assert_same(&what, &table.embedding(&ids).unwrap(), &dtable.embedding(&on(dev, &ids)).unwrap());
            // Strided ids (with gaps and an offset) read the same ids.
            let flat = index(&[4, 0, 3, 3], &[4], ld);
            let (s, ds) = (spread(&flat, true), spread(&on(dev, &flat), true));
            assert_same(&what, &table.index_select(0, &s).unwrap(), &dtable.index_select(0, &ds).unwrap());
        }
    }
}

/// index_select and embedding copy 16 bytes a thread when a row's bytes
/// are a multiple of 16 and both bases are 16-byte aligned, element by
/// element otherwise. Rows of every dtype whose bytes are and are not a
/// multiple of 16, taken by both kernels (rows under 128 elements take
/// index_select's), from a table at an aligned base and from one at an
/// odd offset (a contiguous view one element into a flat tensor), with
/// rows picked along axis 0 and, as runs of a middle axis, along axis 1.
#[tapir_testing::cuda_test]
fn cuda_index_select_and_embedding_match_the_cpu_on_every_alignment() {
    let _g = shared();
    let Some(dev) = cuda("cuda_index_select_and_embedding_match_the_cpu_on_every_alignment") else { return };
    for dtype in DTYPES {
        // Rows of 8 and 136 are whole 16-byte units in every dtype, of 3 in
        // none, of 130 in f64 and i64 only (1,040 bytes); 256 takes the
        // embedding kernel.
        for dim in [3, 8, 130, 136, 256] {
            let rows = 5;
            let flat = tensor(ints(rows * dim + 1, 3), &[rows * dim + 1], dtype);
            // The table starts at the flat tensor's first element, or its second.
            for (name, start) in [("aligned", 0), ("odd offset", 1)] {
                let table = |f: &Tensor| f.narrow(0, start, rows * dim).unwrap().reshape([rows, dim]).unwrap();
                let (t, dt) = (table(&flat), table(&on(dev, &flat)));
                assert!(dt.is_contiguous());
                for ld in INDEX_DTYPES {
                    let what = format!("{dtype:?} dim {dim} {name} {ld:?}");
                    let ids = index(&[4, 0, 3, 3, 1, 4, 2], &[7], ld);
                    let dids = on(dev, &ids);
                    assert_same(&what, &t.embedding(&ids).unwrap(), &dt.embedding(&dids).unwrap());
                    // Runs of dim elements along a middle axis: [1, rows, dim] by axis 1.
                    let (t3, dt3) = (t.unsqueeze(0).unwrap(), dt.unsqueeze(0).unwrap());
                    assert_same(
                        &format!("{what} axis 1"),
                        &t3.index_select(1, &ids).unwrap(),
                        &dt3.index_select(1, &dids).unwrap(),
                    );
                }
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_index_add_matches_the_cpu_with_duplicate_indices() {
    let _g = shared();
    let Some(dev) = cuda("cuda_index_add_matches_the_cpu_with_duplicate_indices") else { return };
    for dtype in DTYPES {
        for axis in 0..3 {
            let mut dims = vec![3, 4, 5];
            dims[axis] = 6;
            let size = 3;
            let g = tensor(ints(dims.iter().product(), 3), &dims, dtype);
            for ld in INDEX_DTYPES {
                // Every entry of the output gets two or more slices added.
                let idx = index(&[2, 0, 2, 1, 0, 0], &[6], ld);
                let op = IndexAdd { axis, idx: idx.clone(), size };
                let dop = IndexAdd { axis, idx: on(dev, &idx), size };
                let cpu = forward(&op, &[&g]).unwrap();
                let what = format!("index_add {dtype:?} axis {axis} {ld:?}");
                assert_same(&what, &cpu, &forward(&dop, &[&on(dev, &g)]).unwrap());
                let (s, ds) = (spread(&g, false), spread(&on(dev, &g), false));
                assert_same(&format!("{what} strided"), &forward(&op, &[&s]).unwrap(), &forward(&dop, &[&ds]).unwrap());
            }
        }
    }
}

/// index_add's row kernel (f32, f16, bf16 rows a multiple of 16 bytes on
/// an aligned base): its two modes (a block owning every output row when
/// ids outnumber few rows; ids in chunks of a few, repeats summed within
/// a chunk, otherwise), rows wider than a block's tile, rows along a
/// middle axis, bad ids among good ones (the CPU's error), and a g one
/// element into its buffer (the element loop). Small integers: exact.
#[tapir_testing::cuda_test]
fn cuda_index_add_rows_match_the_cpu_in_both_modes_and_every_width() {
    let _g = shared();
    let Some(dev) = cuda("cuda_index_add_rows_match_the_cpu_in_both_modes_and_every_width") else { return };
    // (outer, n, inner, size): few targets (owned), many (chunks), one
    // target, rows over two tiles, a middle axis.
    let cases = [(1, 24, 8, 3), (1, 9, 64, 40), (1, 12, 16, 1), (1, 7, 2056, 5), (2, 5, 24, 70), (3, 50, 8, 48)];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (outer, n, inner, size) in cases {
            let g = tensor(ints(outer * n * inner, 5), &[outer, n, inner], dtype);
            for ld in INDEX_DTYPES {
                // Every target hit, and some many times (at most 10: exact sums).
                let ids: Vec<i64> = (0..n).map(|k| ((k * 7 + k / 3) % size.min(n.div_ceil(2)).max(1)) as i64).collect();
                let idx = index(&ids, &[n], ld);
                let op = IndexAdd { axis: 1, idx: idx.clone(), size };
                let dop = IndexAdd { axis: 1, idx: on(dev, &idx), size };
                let what = format!("index_add rows {dtype:?} [{outer}, {n}, {inner}] into {size} {ld:?}");
                assert_same(&what, &forward(&op, &[&g]).unwrap(), &forward(&dop, &[&on(dev, &g)]).unwrap());
                // g one element into its buffer: not 16-byte aligned.
                let flat = tensor(ints(outer * n * inner + 1, 6), &[outer * n * inner + 1], dtype);
                let shifted =
                    |f: &Tensor| f.narrow(0, 1, outer * n * inner).unwrap().reshape([outer, n, inner]).unwrap();
                assert_same(
                    &format!("{what} odd offset"),
                    &forward(&op, &[&shifted(&flat)]).unwrap(),
                    &forward(&dop, &[&shifted(&on(dev, &flat))]).unwrap(),
                );
                // A bad id among good ones: the CPU's error, with its position and value.
                let mut bad_ids = ids.clone();
                bad_ids[n / 2] = size as i64 + 3;
                let bad = index(&bad_ids, &[n], ld);
                let cpu = forward(&IndexAdd { axis: 1, idx: bad.clone(), size }, &[&g]).unwrap_err();
                let gpu = forward(&IndexAdd { axis: 1, idx: on(dev, &bad), size }, &[&on(dev, &g)]).unwrap_err();
                assert_eq!(cpu.to_string(), gpu.to_string(), "{what}: bad id");
                assert!(matches!(gpu, Error::IndexOutOfRange { position, .. } if position == n / 2), "{what}: {gpu}");
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_index_add_and_scatter_add_sum_many_duplicates_within_rounding() {
    let _g = shared();
    let Some(dev) = cuda("cuda_index_add_and_scatter_add_sum_many_duplicates_within_rounding") else { return };
    let n = 600;
    // Real values, added in whatever order the atomics take.
    let v: Vec<f64> = (0..n * 2).map(|i| ((i * 7919) % 1000) as f64 / 997.0 - 0.4).collect();
    let ids: Vec<i64> = (0..n).map(|i| (i % 3) as i64).collect();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12), (DType::F16, 2e-2), (DType::BF16, 1e-1)] {
        let g = tensor(v.clone(), &[n, 2], dtype);
        let idx = index(&ids, &[n], DType::I64);
        let cpu = forward(&IndexAdd { axis: 0, idx: idx.clone(), size: 3 }, &[&g]).unwrap();
        let gpu = forward(&IndexAdd { axis: 0, idx: on(dev, &idx), size: 3 }, &[&on(dev, &g)]).unwrap();
        let idx2 = index(&(0..2 * n).map(|i| (i % 2) as i64).collect::<Vec<_>>(), &[n, 2], DType::I32);
        let base = tensor(vec![0.5; 6], &[3, 2], dtype);
        let cpu2 = base.scatter_add(0, &idx2, &g).unwrap();
        let gpu2 = on(dev, &base).scatter_add(0, &on(dev, &idx2), &on(dev, &g)).unwrap();
        for (what, c, d) in [("index_add", &cpu, &gpu), ("scatter_add", &cpu2, &gpu2)] {
            assert_eq!((c.shape(), c.dtype()), (d.shape(), d.dtype()), "{what} {dtype:?}");
            let (a, b) = (c.to_vec_f64(), d.to_device(Device::Cpu).unwrap().to_vec_f64());
            // Relative to the sum of magnitudes: each row adds ~200 values.
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!((x - y).abs() <= tol * 200.0, "{what} {dtype:?} element {i}: cpu {x} vs cuda {y}");
            }
        }
    }
}

/// Index shapes for gather/scatter on `dims` along `axis`: 4 entries on
/// the axis, one fewer than the input elsewhere (torch allows smaller).
fn gather_dims(dims: &[usize], axis: usize) -> Vec<usize> {
    dims.iter().enumerate().map(|(a, &d)| if a == axis { 4 } else { d - 1 }).collect()
}

#[tapir_testing::cuda_test]
fn cuda_gather_matches_the_cpu_on_every_dtype_axis_and_view() {
    let _g = shared();
    let Some(dev) = cuda("cuda_gather_matches_the_cpu_on_every_dtype_axis_and_view") else { return };
    for dtype in DTYPES {
        let base = tensor(ints(60, 4), &[3, 4, 5], dtype);
        let views: [View; 2] = [("contiguous", |t| t.clone()), ("permuted", |t| t.permute(&[1, 2, 0]).unwrap())];
        for (name, view) in views {
            let (x, dx) = (view(&base), view(&on(dev, &base)));
            for axis in 0..3 {
                let id = gather_dims(x.dims(), axis);
                let n: usize = id.iter().product();
                for ld in INDEX_DTYPES {
                    let idx = index(&indices(n, x.dims()[axis], axis as u64), &id, ld);
                    let what = format!("gather {dtype:?} {name} axis {axis} {ld:?}");
                    let cpu = x.gather(axis as isize, &idx).unwrap();
                    assert_same(&what, &cpu, &dx.gather(axis as isize, &on(dev, &idx)).unwrap());
                    let ds = spread(&on(dev, &idx), false);
                    assert_same(&format!("{what}, strided idx"), &cpu, &dx.gather(axis as isize, &ds).unwrap());
                }
            }
        }
    }
}

/// gather and scatter_add whose index has the input's dims off the axis
/// take the split kernels: every dtype and axis, rows whose length is and
/// is not a multiple of 4 (gather's 4 elements a thread) or of 2 (the
/// 16-bit scatter's pairs), ids equal in runs (whole rows, one vector
/// load of x) or mixed, with repeats, an input one element into its
/// buffer, and a bad id among good ones (the CPU's error).
#[tapir_testing::cuda_test]
fn cuda_gather_and_scatter_add_split_match_the_cpu() {
    let _g = shared();
    let Some(dev) = cuda("cuda_gather_and_scatter_add_split_match_the_cpu") else { return };
    for dtype in DTYPES {
        for dims in [[3usize, 5, 8], [2, 4, 6], [3, 4, 5]] {
            let numel: usize = dims.iter().product();
            let flat = tensor(ints(numel + 1, 8), &[numel + 1], dtype);
            for axis in 0..3 {
                let mut id = dims;
                id[axis] = 7;
                let n: usize = id.iter().product();
                let size = dims[axis];
                let inner: usize = dims[axis + 1..].iter().product();
                // Mixed ids, and ids constant along each run of `inner`.
                let mixed = indices(n, size, 2 + axis as u64);
                let rows: Vec<i64> = (0..n).map(|p| ((p / inner * 5 + 1) % size) as i64).collect();
                for (kind, ids) in [("mixed", mixed), ("rows", rows)] {
                    for ld in INDEX_DTYPES {
                        let what = format!("split {dtype:?} {dims:?} axis {axis} {kind} {ld:?}");
                        let idx = index(&ids, &id, ld);
                        let di = on(dev, &idx);
                        for start in [0, 1] {
                            let view = |f: &Tensor| f.narrow(0, start, numel).unwrap().reshape(dims).unwrap();
                            let (x, dx) = (view(&flat), view(&on(dev, &flat)));
                            assert_same(
                                &format!("gather {what} offset {start}"),
                                &x.gather(axis as isize, &idx).unwrap(),
                                &dx.gather(axis as isize, &di).unwrap(),
                            );
                            let src = tensor(ints(n + 1, 9), &[n + 1], dtype);
                            let sv = |f: &Tensor| f.narrow(0, start, n).unwrap().reshape(id).unwrap();
                            assert_same(
                                &format!("scatter_add {what} offset {start}"),
                                &x.scatter_add(axis as isize, &idx, &sv(&src)).unwrap(),
                                &dx.scatter_add(axis as isize, &di, &sv(&on(dev, &src))).unwrap(),
                            );
                        }
                        let mut bad_ids = ids.clone();
                        bad_ids[n - 3] = -1;
                        bad_ids[n - 2] = size as i64;
                        let (bad, dbad) = (index(&bad_ids, &id, ld), on(dev, &index(&bad_ids, &id, ld)));
                        let x = flat.narrow(0, 0, numel).unwrap().reshape(dims).unwrap();
                        let dx = on(dev, &x);
                        let cpu = x.gather(axis as isize, &bad).unwrap_err();
                        let gpu = dx.gather(axis as isize, &dbad).unwrap_err();
                        assert_eq!(cpu.to_string(), gpu.to_string(), "gather {what}: bad id");
                        assert!(matches!(gpu, Error::IndexOutOfRange { position, .. } if position == n - 3), "{gpu}");
                        let src = on(dev, &tensor(ints(n, 9), &id, dtype));
                        let gpu = dx.scatter_add(axis as isize, &dbad, &src).unwrap_err();
                        assert_eq!(cpu.to_string().replace("gather", "scatter_add"), gpu.to_string(), "{what}");
                    }
                }
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_scatter_add_matches_the_cpu_on_every_dtype_axis_and_view() {
    let _g = shared();
    let Some(dev) = cuda("cuda_scatter_add_matches_the_cpu_on_every_dtype_axis_and_view") else { return };
    for dtype in DTYPES {
        let base = tensor(ints(60, 5), &[3, 4, 5], dtype);
        for axis in 0..3 {
            let id = gather_dims(base.dims(), axis);
            let n: usize = id.iter().product();
            let src = tensor(ints(n, 6), &id, dtype);
            for ld in INDEX_DTYPES {
                let idx = index(&indices(n, base.dims()[axis], 3 + axis as u64), &id, ld);
                let what = format!("scatter_add {dtype:?} axis {axis} {ld:?}");
                let cpu = base.scatter_add(axis as isize, &idx, &src).unwrap();
                let (db, di, ds) = (on(dev, &base), on(dev, &idx), on(dev, &src));
                assert_same(&what, &cpu, &db.scatter_add(axis as isize, &di, &ds).unwrap());
                // Strided base, src and idx, and the input left as it was.
                let sb = spread(&db, true);
                let got = sb.scatter_add(axis as isize, &spread(&di, false), &spread(&ds, true)).unwrap();
                assert_same(&format!("{what} strided"), &cpu, &got);
                assert_same(&format!("{what}: the base is not written"), &base, &sb);
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_where_matches_the_cpu_for_every_mask_and_value_dtype_with_broadcasting() {
    let _g = shared();
    let Some(dev) = cuda("cuda_where_matches_the_cpu_for_every_mask_and_value_dtype_with_broadcasting") else { return };
    for md in DTYPES {
        // Zero, -0.0, a fraction (0 as an int) and, for floats, NaN (non-zero).
        let special = if md.is_float() { f64::NAN } else { 3.0 };
        let mask = tensor(vec![1.0, 0.0, -0.0, special], &[4, 1], md);
        for vd in DTYPES {
            let a = tensor(ints(5, 7), &[1, 5], vd);
            let b = tensor(ints(20, 8), &[5, 4], vd).t().unwrap();
            let what = format!("where mask {md:?} values {vd:?}");
            let cpu = a.where_(&mask, &b).unwrap();
            let (dm, da, db) = (on(dev, &mask), on(dev, &a), on(dev, &tensor(ints(20, 8), &[5, 4], vd)).t().unwrap());
            assert_same(&what, &cpu, &da.where_(&dm, &db).unwrap());
            // A full mask with gaps, and scalars everywhere.
            let full = tensor(ints(20, 9), &[4, 5], md);
            let (f, df) = (spread(&full, true), spread(&on(dev, &full), true));
            assert_same(&format!("{what} strided mask"), &a.where_(&f, &b).unwrap(), &da.where_(&df, &db).unwrap());
            let (s, t) = (Tensor::scalar_of(2.0, vd), Tensor::scalar_of(-3.0, vd));
            let m0 = Tensor::scalar_of(0.0, md);
            assert_same(
                &format!("{what} scalars"),
                &s.where_(&m0, &t).unwrap(),
                &on(dev, &s).where_(&on(dev, &m0), &on(dev, &t)).unwrap(),
            );
        }
    }
    // Operands of two dtypes are promoted as on the CPU.
    let mask = tensor(vec![1.0, 0.0, 1.0], &[3], DType::I64);
    for (da, db) in
        [(DType::F32, DType::F64), (DType::I32, DType::F16), (DType::I32, DType::I64), (DType::BF16, DType::F16)]
    {
        let (a, b) = (tensor(ints(3, 1), &[3], da), tensor(ints(3, 2), &[3], db));
        let cpu = a.where_(&mask, &b).unwrap();
        assert_same(&format!("where {da:?} {db:?}"), &cpu, &on(dev, &a).where_(&on(dev, &mask), &on(dev, &b)).unwrap());
    }
}

#[tapir_testing::cuda_test]
fn cuda_concat_and_stack_match_the_cpu_on_every_dtype_axis_and_view() {
    let _g = shared();
    let Some(dev) = cuda("cuda_concat_and_stack_match_the_cpu_on_every_dtype_axis_and_view") else { return };
    for dtype in DTYPES {
        for axis in 0..3 {
            let part = |len: usize, seed: u64| {
                let mut d = vec![3, 4, 5];
                d[axis] = len;
                tensor(ints(d.iter().product(), seed), &d, dtype)
            };
            let (a, b, c) = (part(3, 1), part(2, 2), part(0, 3));
            let cpu = ShapeOps::concat(&[&a, &b, &c, &a], axis as isize).unwrap();
            let (da, db, dc) = (on(dev, &a), on(dev, &b), on(dev, &c));
            let what = format!("concat {dtype:?} axis {axis}");
            assert_same(&what, &cpu, &ShapeOps::concat(&[&da, &db, &dc, &da], axis as isize).unwrap());
            // Strided parts (gaps, an offset) place the same values.
            let (sa, sb) = (spread(&da, true), spread(&db, false));
            assert_same(
                &format!("{what} strided"),
                &cpu,
                &ShapeOps::concat(&[&sa, &sb, &dc, &da], axis as isize).unwrap(),
            );
            assert_same(&format!("{what} one part"), &a, &ShapeOps::concat(&[&sa], axis as isize).unwrap());
        }
        let (x, y) = (tensor(ints(12, 4), &[3, 4], dtype), tensor(ints(12, 5), &[4, 3], dtype).t().unwrap());
        let dy = on(dev, &tensor(ints(12, 5), &[4, 3], dtype)).t().unwrap();
        for axis in 0..3 {
            let cpu = ShapeOps::stack(&[&x, &y], axis).unwrap();
            assert_same(
                &format!("stack {dtype:?} axis {axis}"),
                &cpu,
                &ShapeOps::stack(&[&on(dev, &x), &dy], axis).unwrap(),
            );
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_pad_matches_the_cpu_on_every_dtype_axis_and_view() {
    let _g = shared();
    let Some(dev) = cuda("cuda_pad_matches_the_cpu_on_every_dtype_axis_and_view") else { return };
    for dtype in DTYPES {
        let base = tensor(ints(60, 6), &[3, 4, 5], dtype);
        let views: [View; 2] = [("contiguous", |t| t.clone()), ("permuted", |t| t.permute(&[2, 1, 0]).unwrap())];
        for (name, view) in views {
            let (x, dx) = (view(&base), view(&on(dev, &base)));
            for axis in 0..3 {
                let d = x.dims()[axis];
                for (start, size) in [(1, d + 3), (0, d), (2, d + 2)] {
                    let op = Pad { axis, start, size };
                    let what = format!("pad {dtype:?} {name} axis {axis} at {start} in {size}");
                    assert_same(&what, &forward(&op, &[&x]).unwrap(), &forward(&op, &[&dx]).unwrap());
                }
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_empty_tensors_index_join_and_select_as_on_the_cpu() {
    let _g = shared();
    let Some(dev) = cuda("cuda_empty_tensors_index_join_and_select_as_on_the_cpu") else { return };
    let x = tensor(vec![], &[0, 4], DType::F32);
    let full = tensor(ints(12, 1), &[3, 4], DType::F32);
    let (dx, dfull) = (on(dev, &x), on(dev, &full));
    for ld in INDEX_DTYPES {
        let two = index(&[1, 3], &[2], ld);
        let none = index(&[], &[0], ld);
        assert_same(
            "select from no rows",
            &x.index_select(1, &two).unwrap(),
            &dx.index_select(1, &on(dev, &two)).unwrap(),
        );
        assert_same(
            "select nothing",
            &full.index_select(0, &none).unwrap(),
            &dfull.index_select(0, &on(dev, &none)).unwrap(),
        );
        let op = IndexAdd { axis: 0, idx: none.clone(), size: 3 };
        let dop = IndexAdd { axis: 0, idx: on(dev, &none), size: 3 };
        let g = tensor(vec![], &[0, 4], DType::F64);
        assert_same("index_add of nothing", &forward(&op, &[&g]).unwrap(), &forward(&dop, &[&on(dev, &g)]).unwrap());
        let op = IndexAdd { axis: 1, idx: two.clone(), size: 5 };
        let dop = IndexAdd { axis: 1, idx: on(dev, &two), size: 5 };
        let g = tensor(vec![], &[0, 2], DType::F64);
        assert_same("index_add into no rows", &forward(&op, &[&g]).unwrap(), &forward(&dop, &[&on(dev, &g)]).unwrap());
        let e = index(&[], &[0, 4], ld);
        assert_same("gather nothing", &full.gather(0, &e).unwrap(), &dfull.gather(0, &on(dev, &e)).unwrap());
        let src = tensor(vec![], &[0, 4], DType::F32);
        assert_same(
            "scatter nothing: a copy of the base",
            &full.scatter_add(0, &e, &src).unwrap(),
            &dfull.scatter_add(0, &on(dev, &e), &on(dev, &src)).unwrap(),
        );
    }
    let m = tensor(vec![], &[0, 1], DType::I32);
    assert_same("where of nothing", &x.where_(&m, &x).unwrap(), &dx.where_(&on(dev, &m), &dx).unwrap());
    assert_same(
        "concat of nothing",
        &ShapeOps::concat(&[&x, &x], 0).unwrap(),
        &ShapeOps::concat(&[&dx, &dx], 0).unwrap(),
    );
    assert_same(
        "concat onto nothing",
        &ShapeOps::concat(&[&x, &full], 0).unwrap(),
        &ShapeOps::concat(&[&dx, &dfull], 0).unwrap(),
    );
    let op = Pad { axis: 0, start: 1, size: 3 };
    assert_same("pad of nothing: zeros", &forward(&op, &[&x]).unwrap(), &forward(&op, &[&dx]).unwrap());
}

/// The allocator's live blocks and their rounded bytes, from
/// `memory_summary`: unlike `memory_stats`, which counts tensors, they
/// also count the buffers an op uses on the way (index flags, kernel dims).
fn blocks(dev: Device) -> (usize, usize) {
    let summary = memory_summary(dev);
    let field = |name: &str| -> usize {
        let line =
            summary.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_else(|| panic!("{name} in {summary}"));
        line[line.find(name).unwrap() + name.len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    (field("active blocks"), field("allocated (rounded blocks)"))
}

/// A request's size in the allocator (512-byte granules).
fn rounded(bytes: usize) -> usize {
    bytes.div_ceil(512) * 512
}

/// One bad call: the CPU's and the CUDA device's result of the same op.
type BadCase = (&'static str, Box<dyn Fn(Device) -> Result<Tensor>>);

fn bad_cases() -> Vec<BadCase> {
    let x = || tensor(ints(24, 1), &[2, 3, 4], DType::F32);
    let on = |t: Tensor, dev: Device| t.to_device(dev).unwrap();
    let mut cases: Vec<BadCase> = Vec::new();
    for ld in INDEX_DTYPES {
        let i = move |v: &[i64], s: &[usize]| index(v, s, ld);
        cases.push(("select: too large", Box::new(move |d| on(x(), d).index_select(1, &on(i(&[0, 3, 1], &[3]), d)))));
        cases.push(("select: negative", Box::new(move |d| on(x(), d).index_select(2, &on(i(&[0, -1], &[2]), d)))));
        // Several bad: the first position is the one named.
        cases.push((
            "select: the first of many",
            Box::new(move |d| on(x(), d).index_select(0, &on(i(&[0, 1, 1, 9, 0, -4, 7, 2], &[8]), d))),
        ));
        cases.push((
            "select: long rows",
            Box::new(move |d| {
                on(tensor(ints(600, 2), &[4, 150], DType::BF16), d).index_select(0, &on(i(&[3, 4], &[2]), d))
            }),
        ));
        cases.push(("select: 2-D indices", Box::new(move |d| on(x(), d).index_select(1, &on(i(&[0, 1], &[1, 2]), d)))));
        cases.push((
            "select: no rows",
            Box::new(move |d| on(tensor(vec![], &[0, 3], DType::F64), d).index_select(1, &on(i(&[1, 3], &[2]), d))),
        ));
        cases.push((
            "embedding",
            Box::new(move |d| {
                on(tensor(ints(12, 3), &[4, 3], DType::F16), d).embedding(&on(i(&[1, 2, 3, 0, 4, 1], &[2, 3]), d))
            }),
        ));
        cases.push((
            "index_add: too large",
            Box::new(move |d| forward(&IndexAdd { axis: 1, idx: on(i(&[0, 2, 3], &[3]), d), size: 3 }, &[&on(x(), d)])),
        ));
        cases.push((
            "index_add: negative",
            Box::new(move |d| forward(&IndexAdd { axis: 0, idx: on(i(&[-2, 0], &[2]), d), size: 3 }, &[&on(x(), d)])),
        ));
        // A count mismatch with a bad index: the CPU names the index first.
        cases.push((
            "index_add: mismatch and bad",
            Box::new(move |d| forward(&IndexAdd { axis: 0, idx: on(i(&[0, 5, 1], &[3]), d), size: 3 }, &[&on(x(), d)])),
        ));
        cases.push((
            "index_add: mismatch",
            Box::new(move |d| forward(&IndexAdd { axis: 0, idx: on(i(&[0, 1, 1], &[3]), d), size: 3 }, &[&on(x(), d)])),
        ));
        cases.push((
            "gather: too large",
            Box::new(move |d| on(x(), d).gather(2, &on(i(&[0, 1, 4, 3, 2, 1], &[1, 2, 3]), d))),
        ));
        cases
            .push(("gather: negative", Box::new(move |d| on(x(), d).gather(0, &on(i(&[0, 1, 1, -1], &[2, 2, 1]), d)))));
        cases.push((
            "gather: too big an index tensor",
            Box::new(move |d| on(x(), d).gather(0, &on(i(&[0; 8], &[1, 4, 2]), d))),
        ));
        cases.push(("gather: rank", Box::new(move |d| on(x(), d).gather(0, &on(i(&[0; 2], &[2]), d)))));
        let s = move |d: Device| on(tensor(ints(6, 4), &[1, 2, 3], DType::F32), d);
        cases.push((
            "scatter_add: too large",
            Box::new(move |d| on(x(), d).scatter_add(1, &on(i(&[0, 1, 2, 2, 3, 0], &[1, 2, 3]), d), &s(d))),
        ));
        cases.push((
            "scatter_add: negative",
            Box::new(move |d| on(x(), d).scatter_add(2, &on(i(&[0, -1, 2, 2, 3, 0], &[1, 2, 3]), d), &s(d))),
        ));
        cases.push((
            "scatter_add: src shape",
            Box::new(move |d| on(x(), d).scatter_add(2, &on(i(&[0, 1], &[1, 2, 1]), d), &s(d))),
        ));
    }
    let f = move |d: Device| on(tensor(vec![0.0, 1.0], &[2], DType::F32), d);
    cases.push(("select: float indices", Box::new(move |d| on(x(), d).index_select(0, &f(d)))));
    cases.push((
        "gather: float indices",
        Box::new(move |d| on(x(), d).gather(0, &on(tensor(vec![0.0], &[1, 1, 1], DType::F32), d))),
    ));
    cases.push((
        "scatter_add: dtypes",
        Box::new(move |d| {
            on(x(), d).scatter_add(
                0,
                &on(index(&[0], &[1, 1, 1], DType::I64), d),
                &on(tensor(vec![1.0], &[1, 1, 1], DType::F64), d),
            )
        }),
    ));
    cases.push((
        "where: shapes",
        Box::new(move |d| on(x(), d).where_(&on(tensor(vec![1.0; 5], &[5], DType::F32), d), &on(x(), d))),
    ));
    cases.push((
        "concat: shapes",
        Box::new(move |d| ShapeOps::concat(&[&on(x(), d), &on(tensor(ints(6, 2), &[2, 3], DType::F32), d)], 0)),
    ));
    cases.push((
        "concat: dtypes",
        Box::new(move |d| ShapeOps::concat(&[&on(x(), d), &on(x().cast(DType::F16).unwrap(), d)], 1)),
    ));
    cases.push(("stack: shapes", Box::new(move |d| ShapeOps::stack(&[&on(x(), d), &on(x().t().unwrap(), d)], 0))));
    cases.push(("pad: does not fit", Box::new(move |d| forward(&Pad { axis: 1, start: 2, size: 4 }, &[&on(x(), d)]))));
    cases
}

#[tapir_testing::cuda_test]
fn cuda_bad_indices_and_shapes_give_the_cpus_error_and_free_everything() {
    let _g = exclusive();
    let Some(dev) = cuda("cuda_bad_indices_and_shapes_give_the_cpus_error_and_free_everything") else { return };
    for (name, call) in bad_cases() {
        let cpu = call(Device::Cpu).expect_err(name);
        // The inputs are made inside the call: they are freed with the rest.
        let (before, blocks_before) = (memory_stats(dev).allocated, blocks(dev));
        let gpu = call(dev).expect_err(name);
        assert_eq!(gpu, cpu, "{name}");
        assert_eq!(memory_stats(dev).allocated, before, "{name}: live bytes after the error");
        assert_eq!(blocks(dev), blocks_before, "{name}: allocator blocks after the error");
    }
}

#[tapir_testing::cuda_test]
fn cuda_index_join_and_select_free_their_temporaries() {
    let _g = exclusive();
    let Some(dev) = cuda("cuda_index_join_and_select_free_their_temporaries") else { return };
    let x = on(dev, &tensor(ints(60, 1), &[3, 4, 5], DType::F32)).permute(&[2, 0, 1]).unwrap();
    let idx = on(dev, &index(&[1, 0, 1], &[3], DType::I32)).unsqueeze(0).unwrap().unsqueeze(2).unwrap();
    let before = memory_stats(dev).allocated;
    let flat = idx.reshape([3]).unwrap();
    let out = x.index_select(1, &flat).unwrap();
    // Only the output stays: the contiguous copy, the flag and the info are freed.
    assert_eq!(memory_stats(dev).allocated, before + out.numel() * 4, "index_select");
    drop(out);
    let calls: Vec<(&str, Call<'_>)> = vec![
        ("gather", Box::new(|| x.gather(1, &idx.broadcast_to([2, 3, 2]).unwrap()))),
        (
            "scatter_add",
            Box::new(|| {
                x.scatter_add(1, &idx, &x.narrow(1, 0, 3).unwrap().narrow(0, 0, 1).unwrap().narrow(2, 0, 1).unwrap())
            }),
        ),
        (
            "index_add",
            Box::new(|| forward(&IndexAdd { axis: 1, idx: flat.clone(), size: 2 }, &[&x.narrow(1, 0, 3).unwrap()])),
        ),
        ("where", Box::new(|| x.where_(&x.gt_scalar(0.0).unwrap(), &x.t().unwrap().t().unwrap()))),
        ("concat", Box::new(|| ShapeOps::concat(&[&x, &x], 1))),
        ("pad", Box::new(|| forward(&Pad { axis: 2, start: 1, size: 6 }, &[&x]))),
    ];
    for (name, call) in calls {
        let before = memory_stats(dev).allocated;
        let blocks_before = blocks(dev);
        let out = call().unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = out.numel() * out.dtype().size_in_bytes();
        assert!(out.is_contiguous(), "{name}");
        assert_eq!(memory_stats(dev).allocated, before + bytes, "{name}: only the output is live");
        assert_eq!(
            blocks(dev),
            (blocks_before.0 + 1, blocks_before.1 + rounded(bytes)),
            "{name}: one block, the output's"
        );
        drop(out);
        assert_eq!(memory_stats(dev).allocated, before, "{name}: live bytes back");
        assert_eq!(blocks(dev), blocks_before, "{name}: every block back");
    }
}
