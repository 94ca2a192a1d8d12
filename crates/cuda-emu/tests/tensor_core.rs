//! The tensor-core instructions: `ldmatrix` (x1, x2, x4, with and without
//! `.trans`) loads fragments from shared memory, and `mma.sync` m16n8k16
//! (f16 and bf16 in, f32 accumulators) multiplies them; the results are
//! checked against a scalar product on the host, placed through the PTX
//! ISA's fragment layouts written out independently here. Bit-exact where
//! every partial sum is exact (small integers), within the emulator's
//! documented accumulation bound for random values; a warp that is not
//! converged at either instruction is a fault. Hand-written PTX; no GPU,
//! driver or NVRTC needed.

use half::{bf16, f16};
use tapir_cuda_emu::exec::{self, Class, Fault, Launch};
use tapir_cuda_emu::memory::Memory;
use tapir_cuda_emu::ptx;

const HEAD: &str = ".version 8.8\n.target sm_90\n.address_size 64\n";

/// One warp copies A (16 x 16, row-major), B (16 x 8, row-major: k by n)
/// and B^T (8 x 16) into shared memory, loads A's fragment with
/// `ldmatrix.x4`, A^T's with `ldmatrix.x4.trans`, B's with `.x2.trans`
/// from B and with `.x2` from B^T (and the first matrix again with `.x1`),
/// reads C's fragment (lane l's four values at c[4l..4l+4]) and writes
/// D1 = A B + C, D2 = the same from B^T's fragment, D3 = A^T B + C (each
/// lane's four at out[4l..], out[128 + 4l..], out[256 + 4l..]), the x1
/// register at out[384 + l] and the x2's first at out[416 + l]. A lane
/// whose index is `skip` jumps past the tensor-core instructions.
fn kernel(ty: &str) -> String {
    let mma = format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32");
    format!(
        "{HEAD}.visible .entry t(.param .u64 pa, .param .u64 pb, .param .u64 pbt, .param .u64 pc, .param .u64 pout, \
         .param .u32 skip)\n{{\n.reg .pred %p<4>;\n.reg .b32 %r<64>;\n.reg .b64 %rd<32>;\n.reg .f32 %f<32>;\n\
         .shared .align 16 .b8 sa[512];\n.shared .align 16 .b8 sb[256];\n.shared .align 16 .b8 sbt[256];\n\
         ld.param.u64 %rd1, [pa];\nld.param.u64 %rd2, [pb];\nld.param.u64 %rd3, [pbt];\nld.param.u64 %rd4, [pc];\n\
         ld.param.u64 %rd5, [pout];\nld.param.u32 %r60, [skip];\nmov.u32 %r1, %tid.x;\n\
         mul.wide.u32 %rd6, %r1, 16;\nadd.s64 %rd7, %rd1, %rd6;\nld.global.v4.u32 {{%r2, %r3, %r4, %r5}}, [%rd7];\n\
         mov.u32 %r6, sa;\nmul.lo.u32 %r7, %r1, 16;\nadd.u32 %r8, %r6, %r7;\n\
         st.shared.v4.u32 [%r8], {{%r2, %r3, %r4, %r5}};\n\
         and.b32 %r9, %r1, 15;\nmul.wide.u32 %rd8, %r9, 16;\nsetp.lt.u32 %p1, %r1, 16;\n\
         selp.b64 %rd9, %rd2, %rd3, %p1;\nadd.s64 %rd10, %rd9, %rd8;\n\
         ld.global.v4.u32 {{%r2, %r3, %r4, %r5}}, [%rd10];\nmov.u32 %r10, sb;\nmov.u32 %r11, sbt;\n\
         selp.b32 %r12, %r10, %r11, %p1;\nmul.lo.u32 %r13, %r9, 16;\nadd.u32 %r14, %r12, %r13;\n\
         st.shared.v4.u32 [%r14], {{%r2, %r3, %r4, %r5}};\nbar.sync 0;\n\
         setp.eq.u32 %p2, %r1, %r60;\n@%p2 bra $L_end;\n\
         and.b32 %r15, %r1, 7;\nshr.u32 %r16, %r1, 3;\nand.b32 %r17, %r16, 1;\nshl.b32 %r17, %r17, 3;\n\
         add.u32 %r18, %r15, %r17;\nshl.b32 %r18, %r18, 5;\nshr.u32 %r19, %r1, 4;\nshl.b32 %r19, %r19, 4;\n\
         add.u32 %r20, %r18, %r19;\nadd.u32 %r20, %r20, %r6;\n\
         ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%r21, %r22, %r23, %r24}}, [%r20];\n\
         ldmatrix.sync.aligned.m8n8.x4.trans.shared::cta.b16 {{%r25, %r26, %r27, %r28}}, [%r20];\n\
         shl.b32 %r29, %r9, 4;\nadd.u32 %r29, %r29, %r10;\n\
         ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{%r30, %r31}}, [%r29];\n\
         shl.b32 %r32, %r15, 5;\nshl.b32 %r33, %r17, 1;\nadd.u32 %r34, %r32, %r33;\nadd.u32 %r34, %r34, %r11;\n\
         ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{%r35, %r36}}, [%r34];\n\
         ldmatrix.sync.aligned.m8n8.x1.shared.b16 {{%r37}}, [%r34];\n\
         add.s64 %rd12, %rd4, %rd6;\nld.global.v4.f32 {{%f1, %f2, %f3, %f4}}, [%rd12];\n\
         {mma} {{%f5, %f6, %f7, %f8}}, {{%r21, %r22, %r23, %r24}}, {{%r30, %r31}}, {{%f1, %f2, %f3, %f4}};\n\
         {mma} {{%f9, %f10, %f11, %f12}}, {{%r21, %r22, %r23, %r24}}, {{%r35, %r36}}, {{%f1, %f2, %f3, %f4}};\n\
         {mma} {{%f13, %f14, %f15, %f16}}, {{%r25, %r27, %r26, %r28}}, {{%r30, %r31}}, {{%f1, %f2, %f3, %f4}};\n\
         add.s64 %rd13, %rd5, %rd6;\nst.global.v4.f32 [%rd13], {{%f5, %f6, %f7, %f8}};\n\
         st.global.v4.f32 [%rd13+512], {{%f9, %f10, %f11, %f12}};\n\
         st.global.v4.f32 [%rd13+1024], {{%f13, %f14, %f15, %f16}};\n\
         mul.wide.u32 %rd14, %r1, 4;\nadd.s64 %rd15, %rd5, %rd14;\nst.global.u32 [%rd15+1536], %r37;\n\
         st.global.u32 [%rd15+1664], %r35;\n$L_end:\nret;\n}}\n"
    )
}

/// Bits of a 16-bit float type.
trait Half: Copy {
    const PTX: &'static str;
    fn from_f32(v: f32) -> Self;
    fn bits(self) -> u16;
    fn value(self) -> f64;
}

impl Half for f16 {
    const PTX: &'static str = "f16";
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn value(self) -> f64 {
        f64::from(self.to_f32())
    }
}

impl Half for bf16 {
    const PTX: &'static str = "bf16";
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn value(self) -> f64 {
        f64::from(self.to_f32())
    }
}

/// The PTX ISA's C/D fragment: lane l's value i is at (row, column).
fn cd_at(l: usize, i: usize) -> (usize, usize) {
    let (g, t) = (l / 4, l % 4);
    (g + 8 * (i / 2), 2 * t + (i % 2))
}

/// What one launch wrote.
struct Out {
    d1: [[f32; 8]; 16],
    d2: [[f32; 8]; 16],
    d3: [[f32; 8]; 16],
    x1: Vec<u32>,
    x2: Vec<u32>,
    counters: exec::Counters,
}

/// Runs the kernel over A [16][16], B [16][8] and C [16][8] with `threads`
/// threads, lane `skip` jumping past the tensor-core instructions.
fn launch<H: Half>(
    a: &[[H; 16]; 16],
    b: &[[H; 8]; 16],
    c: &[[f32; 8]; 16],
    threads: u32,
    skip: u32,
) -> Result<Out, Fault> {
    let src = kernel(H::PTX);
    let module = ptx::load(&src, &|_| Vec::new()).unwrap_or_else(|e| panic!("the test PTX parses: {e}\n{src}"));
    assert!(module.unsupported.is_empty(), "unsupported: {:?}", module.unsupported);
    let mem = Memory::new(1 << 20);
    let put = |bytes: &[u8]| {
        let p = mem.alloc(bytes.len() as u64).unwrap();
        let h = mem.host_ptr(p, bytes.len() as u64).unwrap();
        // SAFETY: the allocation holds the bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), h, bytes.len()) };
        p
    };
    let halves = |v: &mut dyn Iterator<Item = H>| v.flat_map(|h| h.bits().to_le_bytes()).collect::<Vec<u8>>();
    let pa = put(&halves(&mut a.iter().flatten().copied()));
    let pb = put(&halves(&mut b.iter().flatten().copied()));
    let pbt = put(&halves(&mut (0..8).flat_map(|n| (0..16).map(move |k| b[k][n]))));
    let mut cf = vec![0u8; 512];
    for l in 0..32 {
        for i in 0..4 {
            let (r, col) = cd_at(l, i);
            cf[(4 * l + i) * 4..][..4].copy_from_slice(&c[r][col].to_le_bytes());
        }
    }
    let pc = put(&cf);
    let pout = put(&[0u8; 1792]);
    let mut params = Vec::new();
    for p in [pa, pb, pbt, pc, pout] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    params.extend_from_slice(&skip.to_le_bytes());
    let l = Launch {
        module: &module,
        func: 0,
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        dyn_shared: 0,
        params: &params,
        mem: &mem.snapshot(),
        racecheck: true,
        workers: 1,
    };
    let stats = exec::run(&l)?;
    let h = mem.host_ptr(pout, 1792).unwrap();
    // SAFETY: the output holds 448 words.
    let word = |k: usize| unsafe { h.cast::<u32>().add(k).read_unaligned() };
    let mut d = [[[0f32; 8]; 16]; 3];
    for (m, dm) in d.iter_mut().enumerate() {
        for l in 0..32 {
            for i in 0..4 {
                let (r, col) = cd_at(l, i);
                dm[r][col] = f32::from_bits(word(128 * m + 4 * l + i));
            }
        }
    }
    Ok(Out {
        d1: d[0],
        d2: d[1],
        d3: d[2],
        x1: (0..32).map(|l| word(384 + l)).collect(),
        x2: (0..32).map(|l| word(416 + l)).collect(),
        counters: stats.counters,
    })
}

/// c + sum_k a[i][k] b[k][j], summed in double-double (error far below
/// f32's), and sum |terms| for the bound.
fn reference<H: Half>(
    a: &[[H; 16]; 16],
    b: &[[H; 8]; 16],
    c: &[[f32; 8]; 16],
    transpose_a: bool,
) -> [[(f64, f64); 8]; 16] {
    let mut out = [[(0.0, 0.0); 8]; 16];
    for i in 0..16 {
        for j in 0..8 {
            let (mut hi, mut lo) = (f64::from(c[i][j]), 0.0);
            let mut mag = hi.abs();
            for k in 0..16 {
                let av = if transpose_a { a[k][i] } else { a[i][k] };
                let p = av.value() * b[k][j].value();
                mag += p.abs();
                let s = hi + p;
                let bb = s - hi;
                lo += (hi - (s - bb)) + (p - bb);
                hi = s;
            }
            out[i][j] = (hi + lo, mag);
        }
    }
    out
}

/// A deterministic sequence in [-1, 1).
fn uniform(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// A [16][16], B [16][8] and C [16][8].
type Operands<H> = ([[H; 16]; 16], [[H; 8]; 16], [[f32; 8]; 16]);

fn inputs<H: Half>(seed: u64, integers: bool) -> Operands<H> {
    let mut s = seed;
    let mut draw = |scale: f32| {
        let u = uniform(&mut s);
        if integers {
            (u * scale).round()
        } else {
            u * scale
        }
    };
    let mut a = [[H::from_f32(0.0); 16]; 16];
    let mut b = [[H::from_f32(0.0); 8]; 16];
    let mut c = [[0f32; 8]; 16];
    a.iter_mut().flatten().for_each(|x| *x = H::from_f32(draw(if integers { 8.0 } else { 3.0 })));
    b.iter_mut().flatten().for_each(|x| *x = H::from_f32(draw(if integers { 8.0 } else { 3.0 })));
    c.iter_mut().flatten().for_each(|x| *x = draw(if integers { 1000.0 } else { 5.0 }));
    (a, b, c)
}

fn check<H: Half>(seed: u64, integers: bool) {
    let (a, b, c) = inputs::<H>(seed, integers);
    let out = launch(&a, &b, &c, 32, 99).unwrap_or_else(|f| panic!("{}", f.message));
    let want = reference(&a, &b, &c, false);
    let want_t = reference(&a, &b, &c, true);
    for (name, got, want) in
        [("A B + C", &out.d1, &want), ("A B + C from B^T", &out.d2, &want), ("A^T B + C", &out.d3, &want_t)]
    {
        for i in 0..16 {
            for j in 0..8 {
                let (r, mag) = want[i][j];
                let g = f64::from(got[i][j]);
                if integers {
                    // Every partial sum is an integer below 2^24: exact.
                    assert_eq!(g, r, "{} {name} [{i}][{j}]: {g} != exact {r}", H::PTX);
                } else {
                    // The emulator's rule: exact products, an f64 sum
                    // (error at most 16 * 2^-53 * mag), rounded once to f32.
                    let sum_err = 16.0 * f64::powi(2.0, -53) * mag;
                    let bound = f64::powi(2.0, -24) * (r.abs() + sum_err) + sum_err;
                    assert!((g - r).abs() <= bound, "{} {name} [{i}][{j}]: {g} vs {r}, bound {bound}", H::PTX);
                    // And it is the nearest f32 to the reference but for a tie.
                    assert!((g - r).abs() <= f64::from((r as f32).abs()) * f64::powi(2.0, -23), "{name}");
                }
            }
        }
    }
    // `.x1` gives `.x2`'s first matrix; lane l holds B^T's row l / 4,
    // columns 2 (l % 4) and 2 (l % 4) + 1 (that is B's [2t][g], [2t + 1][g]).
    assert_eq!(out.x1, out.x2, "{}", H::PTX);
    for (l, &w) in out.x1.iter().enumerate() {
        let (g, t) = (l / 4, l % 4);
        let want = u32::from(b[2 * t][g].bits()) | u32::from(b[2 * t + 1][g].bits()) << 16;
        assert_eq!(w, want, "{} ldmatrix.x1 lane {l}", H::PTX);
    }
    assert!(out.counters.warp_instructions > 0);
}

#[test]
fn mma_of_small_integers_is_exact_f16_and_bf16() {
    for seed in 1..4 {
        check::<f16>(seed, true);
        check::<bf16>(seed, true);
    }
}

#[test]
fn mma_of_random_values_is_within_the_documented_bound() {
    for seed in 10..16 {
        check::<f16>(seed, false);
        check::<bf16>(seed, false);
    }
}

/// Special values go through as IEEE arithmetic on exact products says:
/// an infinity in A makes its row infinite (or NaN against a zero of B).
#[test]
fn mma_propagates_infinity_and_nan() {
    let (mut a, mut b, c) = inputs::<f16>(3, true);
    a[2][5] = f16::INFINITY;
    b[5].iter_mut().for_each(|x| *x = f16::from_f32(1.0));
    b[5][3] = f16::from_f32(0.0);
    let out = launch(&a, &b, &c, 32, 99).unwrap_or_else(|f| panic!("{}", f.message));
    for j in 0..8 {
        let v = out.d1[2][j];
        if j == 3 {
            assert!(v.is_nan(), "inf * 0 is NaN, got {v}");
        } else {
            assert_eq!(v, f32::INFINITY, "column {j}");
        }
    }
    assert!(out.d1[3].iter().all(|v| v.is_finite()), "other rows are untouched");
}

#[test]
fn tensor_core_instructions_are_profiled() {
    exec::set_profiling(true);
    let (a, b, c) = inputs::<bf16>(5, true);
    let out = launch(&a, &b, &c, 32, 99).unwrap_or_else(|f| panic!("{}", f.message));
    assert_eq!(out.counters.of(Class::Tensor), 3, "three mma");
    assert_eq!(out.counters.tensor_flops(), 3 * 4096);
    // Five ldmatrix and one st.shared... two st.shared: seven shared requests.
    assert_eq!(out.counters.of(Class::LdShared), 5);
    assert_eq!(out.counters.shared_requests, 7);
}

#[test]
fn a_divergent_warp_at_ldmatrix_is_reported() {
    let (a, b, c) = inputs::<f16>(1, true);
    let err = launch(&a, &b, &c, 32, 5).err().expect("lane 5 skips the ldmatrix");
    assert!(
        err.message.contains("synccheck")
            && err.message.contains("ldmatrix.sync.aligned")
            && err.message.contains("0xffffffdf"),
        "{}",
        err.message
    );
}

#[test]
fn a_partial_warp_at_mma_is_reported() {
    // 16 threads: the warp's other 16 lanes do not exist.
    let (a, b, c) = inputs::<bf16>(1, true);
    let err = launch(&a, &b, &c, 16, 99).err().expect("a half warp cannot run ldmatrix or mma");
    assert!(err.message.contains("synccheck") && err.message.contains("0x0000ffff"), "{}", err.message);
}

/// A guard false for some lanes of a converged warp is divergence too.
#[test]
fn a_guarded_mma_is_reported() {
    let src = format!(
        "{HEAD}.visible .entry t()\n{{\n.reg .pred %p<2>;\n.reg .b32 %r<8>;\n.reg .f32 %f<8>;\n\
         mov.u32 %r1, %tid.x;\nmov.b32 %r2, 0;\nmov.f32 %f1, 0f00000000;\nsetp.lt.u32 %p1, %r1, 31;\n\
         @%p1 mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%f2, %f3, %f4, %f5}}, {{%r2, %r2, %r2, %r2}}, \
         {{%r2, %r2}}, {{%f1, %f1, %f1, %f1}};\nret;\n}}\n"
    );
    let module = ptx::load(&src, &|_| Vec::new()).unwrap();
    assert!(module.unsupported.is_empty(), "{:?}", module.unsupported);
    let mem = Memory::new(1 << 16);
    let l = Launch {
        module: &module,
        func: 0,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dyn_shared: 0,
        params: &[],
        mem: &mem.snapshot(),
        racecheck: true,
        workers: 1,
    };
    let err = exec::run(&l).expect_err("lane 31's guard is false");
    assert!(err.message.contains("mma.sync.aligned") && err.message.contains("0x7fffffff"), "{}", err.message);
}

/// Shapes, types and layouts the interpreter does not have are listed as
/// unsupported, not run wrong.
#[test]
fn other_mma_shapes_are_unsupported() {
    let src = format!(
        "{HEAD}.visible .entry t()\n{{\n.reg .b32 %r<8>;\n.reg .f32 %f<8>;\n\
         mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {{%f1, %f2, %f3, %f4}}, {{%r1, %r2}}, {{%r3}}, {{%f1, %f2, %f3, %f4}};\n\
         mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {{%r1, %r2}}, {{%r1, %r2, %r3, %r4}}, {{%r3, %r4}}, {{%r1, %r2}};\n\
         ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {{%r1}}, [%r2];\nret;\n}}\n"
    );
    let m = ptx::load(&src, &|_| Vec::new()).unwrap();
    assert_eq!(
        m.unsupported,
        vec![
            "ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8",
            "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16",
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"
        ]
    );
}
