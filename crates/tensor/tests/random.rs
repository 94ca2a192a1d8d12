//! The Philox 4x32-10 generator: its known answers, the documented layout
//! of a tensor draw on the stream, statistics, reproducibility, and (with a
//! CUDA device) the same numbers generated on the device.
//!
//! The CUDA tests need a device (a GPU, or the emulated one with
//! `TAPIR_CUDA=emulated`); without one they say so and pass, unless
//! `TAPIR_REQUIRE_CUDA=1` makes the skip a failure.

use std::sync::{Mutex, MutexGuard};

use tapir_tensor::prelude::*;

#[path = "support/cuda.rs"]
mod support;

#[path = "support/normal_f32.rs"]
mod normal_f32;

#[path = "support/normal_sfu.rs"]
mod normal_sfu;

static LOCK: Mutex<()> = Mutex::new(());

fn cuda(test: &str) -> Option<(Device, MutexGuard<'static, ()>)> {
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    support::cuda(test).map(|d| (d, guard))
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The Philox4x32-10 lines of Random123's `tests/kat_vectors`
/// (github.com/DEShawResearch/random123; columns: counter, key, result),
/// which the implementation, written from the paper's description of the
/// round function and key schedule, reproduces.
#[test]
fn philox_matches_the_random123_known_answers() {
    let kat: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        ([0, 0, 0, 0], [0, 0], [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]),
        ([u32::MAX; 4], [u32::MAX; 2], [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]),
        (
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
        ),
    ];
    for (ctr, key, want) in kat {
        assert_eq!(Rng::philox(ctr, key), want, "counter {ctr:x?} key {key:x?}");
    }
}

/// Element `i` of an f32 `rand` is lane `i % 4` of block `offset + i / 4`,
/// its top 24 bits over 2^24; an f64 element is two lanes' top 53 bits; a
/// bf16 or f16 element is half a lane (`2j` the high half of lane `j`,
/// `2j + 1` the low half) of block `offset + i / 8`, that half's top 8 or
/// 11 bits over 2^8 or 2^11; the key is the seed's halves.
#[test]
fn a_tensor_draw_reads_the_documented_blocks_and_lanes() {
    let seed = 0x0123_4567_89ab_cdef_u64;
    let key = [seed as u32, (seed >> 32) as u32];
    let block = |b: u64| Rng::philox([b as u32, (b >> 32) as u32, 0, 0], key);
    let mut rng = Rng::new(seed);
    // A scalar draw reads block 0; the tensor draw then starts at block 1.
    let first = rng.next_u64();
    assert_eq!(first, (u64::from(block(0)[0]) << 32) | u64::from(block(0)[1]));
    assert_eq!(rng.offset(), 1);
    let x = rng.rand([3, 3], DType::F32).unwrap().to_vec_f64();
    assert_eq!(rng.offset(), 1 + 3, "9 f32s take ceil(9 / 4) blocks");
    for (i, v) in x.iter().enumerate() {
        let w = block(1 + i as u64 / 4)[i % 4];
        assert_eq!(*v, f64::from((w >> 8) as f32 / (1u32 << 24) as f32), "element {i}");
    }
    let y = rng.rand([3], DType::F64).unwrap().to_vec_f64();
    assert_eq!(rng.offset(), 4 + 2, "3 f64s take ceil(3 / 2) blocks");
    for (i, v) in y.iter().enumerate() {
        let w = block(4 + i as u64 / 2);
        let bits = (u64::from(w[2 * (i % 2)]) << 32) | u64::from(w[2 * (i % 2) + 1]);
        assert_eq!(*v, (bits >> 11) as f64 / (1u64 << 53) as f64, "element {i}");
    }
    // Normal pairs share a block's words: 5 f32 normals take 2 blocks.
    rng.randn([5], DType::F32).unwrap();
    assert_eq!(rng.offset(), 8);
    for (dtype, d) in [(DType::BF16, 8), (DType::F16, 11)] {
        let at = rng.offset();
        let z = rng.uniform([3, 3], -1.0, 3.0, dtype).unwrap().to_vec_f64();
        assert_eq!(rng.offset(), at + 2, "9 {dtype:?}s take ceil(9 / 8) blocks");
        for (i, v) in z.iter().enumerate() {
            let w = block(at + i as u64 / 8)[i % 8 / 2];
            let half = if i % 2 == 0 { w >> 16 } else { w & 0xffff };
            // Exact in the dtype: -1 + 4 x 2^-d has at most d significant bits.
            let want = -1.0 + 4.0 * f64::from(half >> (16 - d)) / f64::from(1u32 << d);
            assert_eq!(*v, want, "{dtype:?} element {i}");
        }
    }
    // Normals of 16-bit dtypes still take a word each: 5 take 2 blocks.
    let at = rng.offset();
    rng.randn([5], DType::BF16).unwrap();
    assert_eq!(rng.offset(), at + 2);
}

#[test]
fn the_same_seed_gives_the_same_draws_and_another_seed_others() {
    let draw = |seed| {
        let mut r = Rng::new(seed);
        let mut out = Vec::new();
        for dtype in FLOATS {
            out.extend(r.rand([7], dtype).unwrap().to_vec_f64());
            out.extend(r.randn([7], dtype).unwrap().to_vec_f64());
        }
        out.extend(r.randint([7], 10, DType::I64).unwrap().to_vec_f64());
        out.push(r.normal());
        out.push(r.below(1000) as f64);
        out
    };
    assert_eq!(draw(42), draw(42));
    let (a, b) = (draw(42), draw(43));
    assert!(a.iter().zip(&b).filter(|(x, y)| x != y).count() > a.len() * 3 / 4, "seeds 42 and 43 look alike");
    // A cloned generator continues the same stream.
    let mut r = Rng::new(7);
    r.rand([3], DType::F32).unwrap();
    let mut c = r.clone();
    assert_eq!(r.randn([9], DType::F64).unwrap().to_vec_f64(), c.randn([9], DType::F64).unwrap().to_vec_f64());
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

#[test]
fn draws_have_the_moments_of_their_distributions() {
    let mut rng = Rng::new(2024);
    let n = 200_000;
    // Standard errors at n = 2e5: mean 6.5e-4 (uniform), 2.2e-3 (normal).
    for dtype in FLOATS {
        let u = rng.uniform([n], -1.0, 3.0, dtype).unwrap().to_vec_f64();
        let (m, v) = mean_var(&u);
        // A uniform takes the top d bits: 2^d values whose mean is below the
        // interval's middle by half a step, 4 2^-d / 2 (0.0078 for bf16).
        let d = match dtype {
            DType::BF16 => 8,
            DType::F16 => 11,
            DType::F32 => 24,
            _ => 53,
        };
        let mid = 1.0 - 2.0 * 2f64.powi(-d);
        assert!((m - mid).abs() < 0.01 && (v - 16.0 / 12.0).abs() < 0.02, "{dtype:?} uniform: mean {m} var {v}");
        assert!(u.iter().all(|x| (-1.0..=3.0).contains(x)), "{dtype:?}: a uniform out of range");
        let r = rng.rand([n], dtype).unwrap().to_vec_f64();
        assert!(r.iter().all(|x| (0.0..1.0).contains(x)), "{dtype:?}: rand reaches 1");
        let z = rng.normal_tensor([n], 2.0, 0.5, dtype).unwrap().to_vec_f64();
        let (m, v) = mean_var(&z);
        assert!((m - 2.0).abs() < 0.01 && (v - 0.25).abs() < 0.01, "{dtype:?} normal: mean {m} var {v}");
        // About 4.55% of a normal lies beyond two standard deviations.
        let tails = z.iter().filter(|x| (*x - 2.0).abs() > 1.0).count() as f64 / n as f64;
        assert!((tails - 0.0455).abs() < 0.004, "{dtype:?} normal tails: {tails}");
    }
    let k = rng.randint([n], 10, DType::I32).unwrap().to_vec_f64();
    let mut counts = [0usize; 10];
    for x in &k {
        counts[*x as usize] += 1;
    }
    assert!(counts.iter().all(|&c| (c as f64 - n as f64 / 10.0).abs() < 600.0), "randint counts {counts:?}");
    // Scalar normals too.
    let s: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let (m, v) = mean_var(&s);
    assert!(m.abs() < 0.01 && (v - 1.0).abs() < 0.02, "scalar normal: mean {m} var {v}");
}

#[test]
fn a_failed_draw_consumes_nothing() {
    let mut rng = Rng::new(5);
    let before = rng.offset();
    assert!(matches!(rng.rand([usize::MAX, 2], DType::F32), Err(Error::InvalidShape { .. })));
    assert!(matches!(rng.randn([4], DType::I64), Err(Error::UnsupportedDType { op: "normal", dtype: DType::I64, .. })));
    assert_eq!(rng.offset(), before);
    assert_eq!(
        rng.rand([4], DType::F32).unwrap().to_vec_f64(),
        Rng::new(5).rand([4], DType::F32).unwrap().to_vec_f64()
    );
}

/// Sizes that end inside a block (of 2, 4 or 8 elements), exactly on one,
/// and span many threads.
const SIZES: [usize; 6] = [1, 5, 8, 9, 16, 1027];

#[tapir_testing::cuda_test]
fn cuda_uniform_is_the_cpus_bit_for_bit() {
    let Some((dev, _g)) = cuda("cuda_uniform_is_the_cpus_bit_for_bit") else { return };
    for dtype in FLOATS {
        let (mut c, mut g) = (Rng::new(11), Rng::new(11));
        for n in SIZES {
            let cpu = c.uniform([n], -2.5, 0.75, dtype).unwrap();
            let gpu = g.uniform_on([n], -2.5, 0.75, dtype, dev).unwrap();
            assert_eq!(gpu.device(), dev);
            assert_eq!(gpu.to_device(Device::Cpu).unwrap().to_vec_f64(), cpu.to_vec_f64(), "{dtype:?} n = {n}");
            assert_eq!(g.offset(), c.offset(), "both streams advance alike");
            let (cpu, gpu) = (c.rand([n, 1], dtype).unwrap(), g.rand_on([n, 1], dtype, dev).unwrap());
            assert_eq!(gpu.dims(), &[n, 1]);
            assert_eq!(gpu.to_device(Device::Cpu).unwrap().to_vec_f64(), cpu.to_vec_f64(), "{dtype:?} rand n = {n}");
        }
    }
}

/// `|x - y|` in units in the last place of `dtype` at `x`, or at `floor`
/// when `x` is smaller: a value `mean + std z` that cancels to near zero
/// carries the rounding of its terms, not of itself.
fn ulps(dtype: DType, x: f64, y: f64, floor: f64) -> f64 {
    let bits = match dtype {
        DType::F64 => 52,
        DType::F32 => 23,
        DType::F16 => 10,
        _ => 7,
    };
    let ulp = 2f64.powi(x.abs().max(floor).log2().floor() as i32 - bits);
    (x - y).abs() / ulp
}

/// How far (`ulps`, floor 0.5) a CUDA normal may be from the CPU's. f64
/// computes in f64 on both devices and carries the libraries' differences
/// (CUDA's log, sin and cos are within 2 ulps). f32 computes in f32 on
/// CUDA (kernels/random.cu, `box_muller_f32`: tapir's own polynomials, `r`
/// within 1.102 ulps and `cos` and `sin` within 1.028 over every input,
/// `f32_normal_functions_stay_within_their_exhaustive_bounds`) and in f64
/// on the CPU. For the standard normal that proves 4 ulps of
/// f32 (docs/gpu-model.md, "Normals from tapir's own polynomials": relative
/// errors 1.674 and 1.449 x 2^-24, so within 3.63 ulps of the exact value
/// and 4.13 of the CPU's f32, and the difference is a whole or half ulp);
/// 4 is also the worst of this test's draws at mean 0.5 and std 2, where
/// `mean + std z` cancels (a limit of 3 fails it). f16 and bf16 take the
/// special-function instructions (`box_muller_sfu`), within 2^-16 of the
/// exact value at their documented worst, so at most 1 ulp after
/// rounding. At least half are bitwise equal (f32: 63% here).
fn normal_limit(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 8.0,
        DType::F32 => 4.0,
        _ => 1.0,
    }
}

#[tapir_testing::cuda_test]
fn cuda_normals_match_the_cpus_within_a_few_ulps() {
    let Some((dev, _g)) = cuda("cuda_normals_match_the_cpus_within_a_few_ulps") else { return };
    for dtype in FLOATS {
        let (mut c, mut g) = (Rng::new(99), Rng::new(99));
        let (mut equal, mut total, mut worst, mut at) = (0, 0, 0f64, (0.0, 0.0));
        // The sizes, then enough draws to meet the worst case of `normal_limit`.
        for n in SIZES.into_iter().chain([1 << 18]) {
            let cpu = c.normal_tensor([n], 0.5, 2.0, dtype).unwrap().to_vec_f64();
            let gpu =
                g.normal_tensor_on([n], 0.5, 2.0, dtype, dev).unwrap().to_device(Device::Cpu).unwrap().to_vec_f64();
            assert_eq!(g.offset(), c.offset());
            for (x, y) in cpu.iter().zip(&gpu) {
                total += 1;
                equal += usize::from(x == y);
                let d = ulps(dtype, *x, *y, 0.5);
                if d > worst {
                    (worst, at) = (d, (*x, *y));
                }
            }
        }
        println!("{dtype:?} normals: {equal} of {total} bitwise equal, worst {worst} ulp (cpu {} cuda {})", at.0, at.1);
        assert!(worst <= normal_limit(dtype), "{dtype:?}: {worst} ulps apart at {at:?}");
        assert!(equal * 2 >= total, "{dtype:?}: only {equal} of {total} equal");
    }
}

/// A draw larger than one wave of the CUDA launch (1,056 blocks of 256
/// threads, crates/tensor/src/cuda/random.rs), so each thread takes several
/// Philox blocks on its grid stride, after a small draw, so the stream's
/// offset is not a multiple of anything the launch has: f32, bf16 (whose
/// uniforms take eight values a block, so it draws past eight elements a
/// thread) and a two-word dtype.
/// The f32 normals' functions (kernels/random.cu, modeled in
/// support/normal_f32.rs) against f64 on a stratified sample of their
/// inputs: the 2^16 words at each end of the range (`u1` near 2^-32 and
/// near 1; the angle near 0 and a full turn), every 4,093rd word, and 256
/// words either side of each of the 32 binade edges of `x0 + 1` and of
/// each quadrant and octant edge of `x1`. The bounds asserted are the
/// largest errors over every input (examples/normal_f32_bounds.rs, which
/// checks all 2^32 of each; docs/gpu-model.md records its output), so the
/// sample must stay within them.
#[test]
fn f32_normal_functions_stay_within_their_exhaustive_bounds() {
    use normal_f32::{cos_sin_turn, cos_sin_turn_f64, minus_two_log_u1, minus_two_log_u1_f64, ulps};
    let words = stratified_words();
    let (mut log, mut r, mut trig) = (0f64, 0f64, 0f64);
    for &x in &words {
        let (got, want) = (minus_two_log_u1(x), minus_two_log_u1_f64(x));
        if want == 0.0 {
            assert_eq!(got, 0.0, "x0 = {x:#x}");
        } else {
            log = log.max(ulps(got, want));
            r = r.max(ulps(got.sqrt(), want.sqrt()));
        }
        let (got, want) = (cos_sin_turn(x), cos_sin_turn_f64(x));
        for (g, w) in [(got.0, want.0), (got.1, want.1)] {
            if w == 0.0 {
                assert_eq!(g, 0.0, "x1 = {x:#x}");
            } else {
                trig = trig.max(ulps(g, w));
            }
        }
    }
    println!("{} words: -2 ln u1 {log:.4} ulps, r {r:.4}, cos and sin {trig:.4}", words.len());
    assert!(log <= LOG_ULPS && r <= R_ULPS && trig <= TRIG_ULPS, "{log} {r} {trig}");
}

/// The f16 and bf16 normals' special-function path (kernels/random.cu,
/// `box_muller_sfu`, modeled in support/normal_sfu.rs) with `lg2`, `sqrt`,
/// `sin` and `cos` each at the edge of its documented error, in every
/// combination of directions, on the same stratified words as above: the
/// standard normal `r cos t` (and `r sin t`) stays within 2^-16 of its
/// exact value, 32 times inside f16's ulp at 0.5 (bf16's is 8 times
/// wider), so rounded to either dtype it is within 1 ulp of the CPU's.
/// The words from 0xFFC00000 on (`u1` within 2^-10 of 1) take the kernel's
/// `2 v + v^2`; with `lg2` there the error would reach 2^-10.8.
#[test]
fn sfu_normals_stay_within_their_bound_at_the_documented_worst() {
    use normal_sfu::{cos_sin, cos_sin_f64, every_worst, radius, radius_f64};
    let words = stratified_words();
    let (mut r_err, mut trig_err) = (0f64, 0f64);
    for &x in &words {
        let (r, (c, s)) = (radius_f64(x), cos_sin_f64(x));
        for w in every_worst() {
            r_err = r_err.max((f64::from(radius(x, w)) - r).abs());
            let (gc, gs) = cos_sin(x, w);
            trig_err = trig_err.max((f64::from(gc) - c).abs()).max((f64::from(gs) - s).abs());
        }
    }
    // |r' c' - r c| <= |r' - r| |c'| + r |c' - c|, plus the fma's rounding.
    let r_max = radius_f64(0);
    let bound = r_err * (1.0 + trig_err) + r_max * trig_err + r_max * 2f64.powi(-24);
    println!(
        "{} words: r within 2^{:.2}, cos and sin within 2^{:.2}, r cos t within 2^{:.2}",
        words.len(),
        r_err.log2(),
        trig_err.log2(),
        bound.log2()
    );
    assert!(bound <= 2f64.powi(-16), "the 16-bit normals' bound is 2^{:.2}", bound.log2());
}

/// The words both normal-function tests sample: the 2^16 at each end of
/// the range, every 4,093rd, and 256 either side of each binade edge of
/// `x0 + 1` and each quadrant and octant edge of `x1`.
fn stratified_words() -> Vec<u32> {
    let mut words: Vec<u32> = (0..1 << 16).chain(u32::MAX - (1 << 16)..=u32::MAX).collect();
    words.extend((0..=u32::MAX / 4093).map(|k| k * 4093));
    for edge in (0..32).map(|b| 1u32 << b).chain((1..8).map(|k| k << 29)) {
        words.extend((0..512).map(|d| edge.wrapping_sub(256).wrapping_add(d)));
    }
    words
}

/// The largest errors, in ulps of f32, of `-2 ln u1`, of `r`, and of `cos t`
/// and `sin t` over all 2^32 inputs each (examples/normal_f32_bounds.rs).
const LOG_ULPS: f64 = 1.1595;
const R_ULPS: f64 = 1.1018;
const TRIG_ULPS: f64 = 1.0280;

/// The device's f32 normals are the model's (support/normal_f32.rs) bit
/// for bit, so the model's exhaustive bounds are the kernel's: each
/// block's words from `Rng::philox`, each pair through the model. (The f16
/// and bf16 normals take the special-function instructions, whose results
/// differ between the emulated device and hardware within their bounds:
/// `sfu_normals_stay_within_their_bound_at_the_documented_worst`.)
#[tapir_testing::cuda_test]
fn cuda_f32_normals_are_the_models_bit_for_bit() {
    let Some((dev, _g)) = cuda("cuda_f32_normals_are_the_models_bit_for_bit") else { return };
    let seed = 31_u64;
    let key = [seed as u32, (seed >> 32) as u32];
    {
        let dtype = DType::F32;
        for (mean, std) in [(0.0, 1.0), (0.5, 2.0), (-3.0, 0.3)] {
            let mut g = Rng::new(seed);
            let n = 40_001;
            let gpu =
                g.normal_tensor_on([n], mean, std, dtype, dev).unwrap().to_device(Device::Cpu).unwrap().to_vec_f64();
            let model: Vec<f64> = (0..n)
                .map(|i| {
                    let w = Rng::philox([(i / 4) as u32, 0, 0, 0], key);
                    let p = (i % 4) / 2;
                    let z = normal_f32::box_muller_f32(w[2 * p], w[2 * p + 1], mean as f32, std as f32);
                    f64::from(if i % 2 == 0 { z.0 } else { z.1 })
                })
                .collect();
            let differ = gpu.iter().zip(&model).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{dtype:?} ({mean}, {std}): {differ} of {n} differ from the model");
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_draws_past_one_wave_of_threads_are_the_cpus() {
    let Some((dev, _g)) = cuda("cuda_draws_past_one_wave_of_threads_are_the_cpus") else { return };
    let wave = 1056 * 256;
    let (mut c, mut g) = (Rng::new(2024), Rng::new(2024));
    for (dtype, n) in [(DType::F32, 4 * wave + 9), (DType::BF16, 8 * wave + 2), (DType::F64, 2 * wave + 3)] {
        let (cpu, gpu) = (c.rand([3], dtype).unwrap(), g.rand_on([3], dtype, dev).unwrap());
        assert_eq!(gpu.to_device(Device::Cpu).unwrap().to_vec_f64(), cpu.to_vec_f64());
        let cpu = c.uniform([n], -1.0, 3.0, dtype).unwrap().to_vec_f64();
        let gpu = g.uniform_on([n], -1.0, 3.0, dtype, dev).unwrap().to_device(Device::Cpu).unwrap().to_vec_f64();
        assert!(
            cpu == gpu,
            "{dtype:?} uniform n = {n}: {} values differ",
            cpu.iter().zip(&gpu).filter(|(x, y)| x != y).count()
        );
        let cpu = c.normal_tensor([n], 0.0, 1.0, dtype).unwrap().to_vec_f64();
        let gpu = g.normal_tensor_on([n], 0.0, 1.0, dtype, dev).unwrap().to_device(Device::Cpu).unwrap().to_vec_f64();
        let worst = cpu.iter().zip(&gpu).map(|(x, y)| ulps(dtype, *x, *y, 0.5)).fold(0.0, f64::max);
        let equal = cpu.iter().zip(&gpu).filter(|(x, y)| x == y).count();
        println!("{dtype:?} normals n = {n}: {equal} bitwise equal, worst {worst} ulp");
        assert!(worst <= normal_limit(dtype), "{dtype:?} normal n = {n}: {worst} ulps apart");
        assert!(equal * 2 >= n, "{dtype:?} normal n = {n}: only {equal} equal");
        assert_eq!(g.offset(), c.offset(), "both streams advance alike");
    }
    let cpu = c.randint([2 * wave + 1], 1000, DType::I64).unwrap().to_vec_f64();
    let gpu = g.randint_on([2 * wave + 1], 1000, DType::I64, dev).unwrap().to_device(Device::Cpu).unwrap().to_vec_f64();
    assert!(cpu == gpu, "randint past a wave");
}

#[tapir_testing::cuda_test]
fn cuda_randint_is_the_cpus_and_live_bytes_return() {
    let Some((dev, _g)) = cuda("cuda_randint_is_the_cpus_and_live_bytes_return") else { return };
    let before = memory_stats(dev).allocated;
    for dtype in [DType::I64, DType::I32, DType::F32, DType::F64] {
        let (mut c, mut g) = (Rng::new(3), Rng::new(3));
        for (n, range) in [(5usize, 10u64), (1027, 3), (64, u64::MAX)] {
            let cpu = c.randint([n], range, dtype).unwrap();
            let gpu = g.randint_on([n], range, dtype, dev).unwrap();
            assert_eq!((gpu.device(), gpu.dtype()), (dev, dtype));
            assert_eq!(gpu.to_device(Device::Cpu).unwrap().to_vec_f64(), cpu.to_vec_f64(), "{dtype:?} 0..{range}");
        }
    }
    {
        let mut g = Rng::new(1);
        let x = g.randn_on([1000], DType::F32, dev).unwrap();
        assert_eq!(memory_stats(dev).allocated - before, 4000, "the tensor's bytes, no more");
        // A failed draw allocates nothing and draws nothing.
        let at = g.offset();
        assert!(g.rand_on([4], DType::I32, dev).is_err());
        assert_eq!((g.offset(), memory_stats(dev).allocated - before), (at, 4000));
        drop(x);
    }
    assert_eq!(memory_stats(dev).allocated, before);
}
