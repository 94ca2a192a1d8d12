//! Property tests: views, broadcasting, binary ops and reductions on random
//! shapes and random strided layouts agree with a naive reference that
//! works on dense `Vec<f64>`s with explicit index math.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tapir_tensor::prelude::*;

// ----- the reference ---------------------------------------------------------

/// A dense row-major array: the reference every tensor is compared with.
#[derive(Clone, Debug, PartialEq)]
struct Dense {
    dims: Vec<usize>,
    data: Vec<f64>,
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = i % dims[a];
        i /= dims[a];
    }
    idx
}

fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

impl Dense {
    fn from_fn(dims: Vec<usize>, mut f: impl FnMut(&[usize]) -> f64) -> Dense {
        let data = (0..numel(&dims)).map(|i| f(&unravel(i, &dims))).collect();
        Dense { dims, data }
    }
    fn at(&self, idx: &[usize]) -> f64 {
        self.data[ravel(idx, &self.dims)]
    }
    /// out[i_0, .., i_r] = self[i_{inv(perm)}]: axis `a` of the result is
    /// axis `perm[a]` of self.
    fn permute(&self, perm: &[usize]) -> Dense {
        let dims: Vec<usize> = perm.iter().map(|&p| self.dims[p]).collect();
        Dense::from_fn(dims, |idx| {
            let mut src = vec![0; idx.len()];
            for (a, &p) in perm.iter().enumerate() {
                src[p] = idx[a];
            }
            self.at(&src)
        })
    }
    fn narrow(&self, axis: usize, start: usize, len: usize) -> Dense {
        let mut dims = self.dims.clone();
        dims[axis] = len;
        Dense::from_fn(dims, |idx| {
            let mut src = idx.to_vec();
            src[axis] += start;
            self.at(&src)
        })
    }
    fn broadcast_to(&self, target: &[usize]) -> Dense {
        let off = target.len() - self.dims.len();
        Dense::from_fn(target.to_vec(), |idx| {
            let src: Vec<usize> =
                self.dims.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { idx[off + i] }).collect();
            self.at(&src)
        })
    }
    fn reshape(&self, dims: Vec<usize>) -> Dense {
        assert_eq!(numel(&dims), self.data.len());
        Dense { dims, data: self.data.clone() }
    }
    fn binary(&self, o: &Dense, f: impl Fn(f64, f64) -> f64) -> Dense {
        let r = self.dims.len().max(o.dims.len());
        let pad =
            |d: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, r - d.len()).chain(d.iter().copied()).collect() };
        let (a, b) = (pad(&self.dims), pad(&o.dims));
        let out: Vec<usize> = a.iter().zip(&b).map(|(&x, &y)| x.max(y)).collect();
        let (sa, sb) = (self.broadcast_to(&out), o.broadcast_to(&out));
        Dense { dims: out, data: sa.data.iter().zip(&sb.data).map(|(&x, &y)| f(x, y)).collect() }
    }
    fn reduce(&self, axes: &[usize], keepdim: bool, init: f64, f: impl Fn(f64, f64) -> f64) -> Dense {
        let kept: Vec<usize> =
            self.dims.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
        let mut data = vec![init; numel(&kept)];
        for (i, &v) in self.data.iter().enumerate() {
            let mut idx = unravel(i, &self.dims);
            for &a in axes {
                idx[a] = 0;
            }
            let o = ravel(&idx, &kept);
            data[o] = f(data[o], v);
        }
        let dims = if keepdim {
            kept
        } else {
            self.dims.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
        };
        Dense { dims, data }
    }
}

/// A small deterministic generator for values, permutations and paddings,
/// driven by a proptest-chosen seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn perm(&mut self, r: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..r).collect();
        for i in (1..r).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
}

/// Random values: small integers and halves, so f64 arithmetic on them is
/// exact and results can be compared with `==`.
fn values(dims: &[usize], rng: &mut Lcg) -> Dense {
    Dense::from_fn(dims.to_vec(), |_| 0.5 * (rng.below(17) as f64 - 8.0))
}

/// A tensor holding `d`'s values through a strided layout: its storage is a
/// padded, permuted array; the tensor is a narrowed and permuted view of it.
fn strided(d: &Dense, rng: &mut Lcg) -> Tensor {
    let r = d.dims.len();
    let perm = rng.perm(r);
    let pads: Vec<usize> = (0..r).map(|_| rng.below(3)).collect();
    let starts: Vec<usize> = pads.iter().map(|&p| rng.below(p + 1)).collect();
    // Storage axis j holds logical axis perm[j].
    let sdims: Vec<usize> = (0..r).map(|j| d.dims[perm[j]] + pads[j]).collect();
    let storage = Dense::from_fn(sdims.clone(), |sidx| {
        let mut li = vec![0; r];
        for j in 0..r {
            if sidx[j] < starts[j] || sidx[j] >= starts[j] + d.dims[perm[j]] {
                return -1234.5; // padding, never read
            }
            li[perm[j]] = sidx[j] - starts[j];
        }
        d.at(&li)
    });
    let mut t = Tensor::from_vec(storage.data, sdims).expect("storage");
    for j in 0..r {
        t = t.narrow(j as isize, starts[j], d.dims[perm[j]]).expect("narrow");
    }
    // Logical axis a sits at storage axis inv[a].
    let mut inv = vec![0; r];
    for (j, &p) in perm.iter().enumerate() {
        inv[p] = j;
    }
    t.permute(&inv).expect("permute")
}

fn assert_same(t: &Tensor, d: &Dense) -> Result<(), TestCaseError> {
    prop_assert_eq!(t.dims(), d.dims.as_slice());
    prop_assert_eq!(t.to_vec_f64(), d.data.clone());
    Ok(())
}

/// Like `assert_same`, with NaN equal to NaN (pow of negative bases).
fn assert_same_nan(t: &Tensor, d: &Dense) -> Result<(), TestCaseError> {
    prop_assert_eq!(t.dims(), d.dims.as_slice());
    let got = t.to_vec_f64();
    for (i, (&a, &b)) in got.iter().zip(&d.data).enumerate() {
        prop_assert!(a == b || (a.is_nan() && b.is_nan()), "element {}: got {}, want {}", i, a, b);
    }
    Ok(())
}

// ----- strategies --------------------------------------------------------------

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=4, 0..=4)
}

/// A chain of view ops, each `(kind, a, b)` interpreted against the shape
/// current at that step.
fn view_ops() -> impl Strategy<Value = Vec<(u8, u32, u32)>> {
    prop::collection::vec((0u8..8, any::<u32>(), any::<u32>()), 1..7)
}

/// Applies one view op to both the tensor and the reference. Returns the
/// new pair and whether the op is one that must not copy.
fn apply(t: &Tensor, d: &Dense, (kind, a, b): (u8, u32, u32)) -> (Tensor, Dense, bool) {
    let r = d.dims.len();
    let (a, b) = (a as usize, b as usize);
    match kind {
        0 if r >= 1 => {
            let perm = Lcg(a as u64).perm(r);
            (t.permute(&perm).expect("permute"), d.permute(&perm), true)
        }
        1 if r >= 2 => {
            let (x, y) = (a % r, b % r);
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(x, y);
            let tt = t.transpose(x as isize, y as isize - r as isize).expect("transpose");
            (tt, d.permute(&perm), true)
        }
        2 if r >= 1 => {
            let axis = a % r;
            let size = d.dims[axis];
            let start = b % size;
            let len = 1 + (b / 7) % (size - start);
            let tt = t.narrow(axis as isize, start, len).expect("narrow");
            (tt, d.narrow(axis, start, len), true)
        }
        3 if r < 5 => {
            let axis = a % (r + 1);
            let mut dims = d.dims.clone();
            dims.insert(axis, 1);
            (t.unsqueeze(axis as isize).expect("unsqueeze"), d.reshape(dims), true)
        }
        4 => match d.dims.iter().position(|&s| s == 1) {
            Some(axis) => {
                let mut dims = d.dims.clone();
                dims.remove(axis);
                (t.squeeze(axis as isize).expect("squeeze"), d.reshape(dims), true)
            }
            None => (t.clone(), d.clone(), true),
        },
        5 => {
            // Expand a size-1 axis, or add a leading one.
            let mut target = d.dims.clone();
            match d.dims.iter().position(|&s| s == 1) {
                Some(axis) if a % 2 == 0 => target[axis] = 1 + b % 3,
                _ if r < 5 => target.insert(0, 1 + b % 3),
                _ => {}
            }
            let tt = t.broadcast_to(target.clone()).expect("broadcast_to");
            (tt, d.broadcast_to(&target), true)
        }
        6 if r >= 2 => {
            // Merge two adjacent axes, then maybe split the first back off.
            let i = a % (r - 1);
            let mut dims = d.dims.clone();
            let merged = dims[i] * dims[i + 1];
            dims[i] = merged;
            dims.remove(i + 1);
            if b & 1 == 0 && merged & 1 == 0 {
                dims[i] = merged / 2;
                dims.insert(i + 1, 2);
            }
            (t.reshape(dims.clone()).expect("reshape"), d.reshape(dims), false)
        }
        7 => (t.contiguous().expect("contiguous"), d.clone(), false),
        _ => (t.clone(), d.clone(), true),
    }
}

type BinOp = (&'static str, fn(&Tensor, &Tensor) -> Result<Tensor>, fn(f64, f64) -> f64);

fn binary_ops() -> [BinOp; 10] {
    [
        ("add", |a, b| a.add(b), |a, b| a + b),
        ("sub", |a, b| a.sub(b), |a, b| a - b),
        ("mul", |a, b| a.mul(b), |a, b| a * b),
        ("div", |a, b| a.div(b), |a, b| a / b),
        ("pow", |a, b| a.pow(b), f64::powf),
        ("maximum", |a, b| a.maximum(b), f64::max),
        ("minimum", |a, b| a.minimum(b), f64::min),
        ("lt", |a, b| a.lt(b), |a, b| f64::from(u8::from(a < b))),
        ("eq", |a, b| a.eq(b), |a, b| f64::from(u8::from(a == b))),
        ("ge", |a, b| a.ge(b), |a, b| f64::from(u8::from(a >= b))),
    ]
}

/// An operand shape that broadcasts to `out`: a suffix of it with some dims
/// set to 1.
fn operand_shape(out: &[usize], drop: usize, ones: u8) -> Vec<usize> {
    let drop = drop.min(out.len());
    out[drop..].iter().enumerate().map(|(i, &d)| if ones >> i & 1 == 1 { 1 } else { d }).collect()
}

proptest! {
    // Failing cases are saved beside this file (proptest_views.regressions)
    // and replayed first on the next run.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// Chains of views read the same elements as the reference, and the ops
    /// that are views by contract share storage.
    #[test]
    fn view_chains_match_reference(dims in shape(), ops in view_ops(), seed in any::<u64>()) {
        let mut rng = Lcg(seed);
        let d0 = values(&dims, &mut rng);
        let mut t = strided(&d0, &mut rng);
        let mut d = d0;
        assert_same(&t, &d)?;
        for op in ops {
            let (nt, nd, is_view) = apply(&t, &d, op);
            assert_same(&nt, &nd)?;
            if is_view {
                prop_assert!(nt.same_storage(&t), "op {:?} copied", op);
            }
            if op.0 == 6 && t.is_contiguous() {
                prop_assert!(nt.same_storage(&t), "reshape of a contiguous tensor copied");
            }
            // A contiguous copy has row-major strides and the same values.
            let c = nt.contiguous()?;
            prop_assert!(c.is_contiguous());
            assert_same(&c, &nd)?;
            t = nt;
            d = nd;
        }
    }

    /// Binary ops and comparisons broadcast like numpy, on strided operands,
    /// in either order.
    #[test]
    fn binary_broadcasting_matches_reference(
        out in shape(),
        (drop_a, ones_a, drop_b, ones_b) in (0usize..3, any::<u8>(), 0usize..3, any::<u8>()),
        seed in any::<u64>(),
    ) {
        let mut rng = Lcg(seed);
        let da = values(&operand_shape(&out, drop_a, ones_a), &mut rng);
        let db = values(&operand_shape(&out, drop_b, ones_b), &mut rng);
        let ta = strided(&da, &mut rng);
        let tb = strided(&db, &mut rng);
        assert_same(&ta, &da)?;
        assert_same(&tb, &db)?;
        for (name, op, f) in binary_ops() {
            let got = op(&ta, &tb).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
            assert_same_nan(&got, &da.binary(&db, f))?;
            let rev = op(&tb, &ta).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
            assert_same_nan(&rev, &db.binary(&da, f))?;
        }
        // Explicit broadcast_to the common shape gives the same operands.
        let common = da.binary(&db, |x, _| x).dims;
        assert_same(&ta.broadcast_to(common.clone()).expect("broadcast"), &da.broadcast_to(&common))?;
        // where_ with a mask of the other operand's shape.
        let mask = tb.gt_scalar(0.0).expect("mask");
        let got = ta.where_(&mask, &ta.neg().expect("neg")).expect("where");
        let sel = da.binary(&db, |x, m| if m > 0.0 { x } else { -x });
        assert_same(&got, &sel)?;
    }

    /// Reductions over random axis sets of strided tensors.
    #[test]
    fn reductions_match_reference(
        dims in prop::collection::vec(1usize..=5, 1..=4),
        axes_mask in any::<u8>(),
        keepdim in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = Lcg(seed);
        let d = values(&dims, &mut rng);
        let t = strided(&d, &mut rng);
        let axes: Vec<usize> = (0..dims.len()).filter(|a| axes_mask >> a & 1 == 1).collect();
        let all: Vec<usize> = (0..dims.len()).collect();
        let ref_axes = if axes.is_empty() { &all } else { &axes };
        let ia: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
        assert_same(&t.sum(&ia, keepdim).expect("sum"), &d.reduce(ref_axes, keepdim, 0.0, |a, b| a + b))?;
        assert_same(&t.max(&ia, keepdim).expect("max"), &d.reduce(ref_axes, keepdim, f64::NEG_INFINITY, f64::max))?;
        assert_same(&t.min(&ia, keepdim).expect("min"), &d.reduce(ref_axes, keepdim, f64::INFINITY, f64::min))?;
        // sum_to the kept shape is sum with keepdim.
        let kept = d.reduce(ref_axes, true, 0.0, |a, b| a + b);
        assert_same(&t.sum_to(kept.dims.clone()).expect("sum_to"), &kept)?;
    }

    /// matmul of strided (possibly transposed) operands, with batch dims.
    #[test]
    fn matmul_matches_reference(
        (m, k, n) in (1usize..6, 0usize..6, 1usize..6),
        batch in prop::collection::vec(1usize..3, 0..=2),
        b_batched in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = Lcg(seed);
        let mut ad = batch.clone();
        ad.extend([m, k]);
        let mut bd = if b_batched { batch.clone() } else { vec![] };
        bd.extend([k, n]);
        let da = values(&ad, &mut rng);
        let db = values(&bd, &mut rng);
        let got = strided(&da, &mut rng).matmul(&strided(&db, &mut rng)).expect("matmul");
        let mut od = batch.clone();
        od.extend([m, n]);
        let want = Dense::from_fn(od, |idx| {
            let r = idx.len();
            let (i, j) = (idx[r - 2], idx[r - 1]);
            (0..k)
                .map(|p| {
                    let mut ai = idx[..r - 2].to_vec();
                    ai.extend([i, p]);
                    let mut bi = if b_batched { idx[..r - 2].to_vec() } else { vec![] };
                    bi.extend([p, j]);
                    da.at(&ai) * db.at(&bi)
                })
                .sum()
        });
        assert_same(&got, &want)?;
    }
}
