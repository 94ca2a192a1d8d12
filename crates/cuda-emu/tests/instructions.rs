//! Instruction families on small hand-written PTX programs with known
//! results, edge cases included: NaN and infinity through min/max/setp,
//! integer overflow, shifts past the width, rounding modes, f16/bf16
//! subnormals, bit operations, carry chains, warp collectives, shared
//! atomics and device-function calls. No GPU, driver or NVRTC needed.

use tapir_cuda_emu::exec::{self, Fault, Launch};
use tapir_cuda_emu::memory::Memory;
use tapir_cuda_emu::ptx;

const HEAD: &str = ".version 8.8\n.target sm_90\n.address_size 64\n";
const REGS: &str = ".reg .pred %p<16>;\n.reg .b16 %h<16>;\n.reg .b32 %r<64>;\n.reg .b64 %rd<64>;\n\
                    .reg .f32 %f<32>;\n.reg .f64 %fd<32>;\n";

/// Runs `body` as kernel `t(.param .u64 out)` with `threads` threads in one
/// block; `%rd0` holds the output buffer's address (`words` u64 words,
/// zeroed). Returns the words.
fn run_with(extra: &str, body: &str, threads: u32, words: usize) -> Result<Vec<u64>, Fault> {
    launch(extra, body, threads, words).map(|(w, _)| w)
}

/// `run_with`, with the launch's statistics.
fn launch(extra: &str, body: &str, threads: u32, words: usize) -> Result<(Vec<u64>, exec::Stats), Fault> {
    let src = format!(
        "{HEAD}{extra}\n.visible .entry t(.param .u64 out)\n{{\n{REGS}ld.param.u64 %rd0, [out];\n{body}\nret;\n}}\n"
    );
    let mem = Memory::new(1 << 20);
    let module = ptx::load(&src, &|g| g.iter().map(|_| mem.alloc(4096).unwrap()).collect())
        .unwrap_or_else(|e| panic!("the test PTX parses: {e}\n{src}"));
    assert!(module.unsupported.is_empty(), "unsupported: {:?}", module.unsupported);
    let out = mem.alloc(words as u64 * 8).unwrap();
    let func = module.funcs.iter().position(|f| f.name == "t").unwrap();
    let l = Launch {
        module: &module,
        func,
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        dyn_shared: 0,
        params: &out.to_le_bytes(),
        mem: &mem.snapshot(),
        racecheck: true,
        workers: 1,
    };
    let stats = exec::run(&l)?;
    let p = mem.host_ptr(out, words as u64 * 8).unwrap();
    // SAFETY: the buffer holds `words` words.
    Ok(((0..words).map(|k| unsafe { p.cast::<u64>().add(k).read() }).collect(), stats))
}

fn run(body: &str, words: usize) -> Vec<u64> {
    run_with("", body, 1, words).unwrap_or_else(|f| panic!("{}", f.message))
}

/// `st.global.b64 [%rd0+8k], reg` for each register, in order.
fn stores(regs: &[&str]) -> String {
    stores_at(0, regs)
}

/// The same from word `first` on.
fn stores_at(first: usize, regs: &[&str]) -> String {
    regs.iter().enumerate().map(|(k, r)| format!("st.global.b64 [%rd0+{}], {r};\n", 8 * (first + k))).collect()
}

/// `st.global.b32` into the low half of word k.
fn stores32(regs: &[&str]) -> String {
    regs.iter().enumerate().map(|(k, r)| format!("st.global.b32 [%rd0+{}], {r};\n", 8 * k)).collect()
}

fn stores32_at(first: usize, regs: &[&str]) -> String {
    regs.iter().enumerate().map(|(k, r)| format!("st.global.b32 [%rd0+{}], {r};\n", 8 * (first + k))).collect()
}

#[test]
fn float_min_max_with_nan_infinity_and_signed_zero() {
    let body = format!(
        "mov.f32 %f1, 0f7FC00000;\nmov.f32 %f2, 0f3F800000;\nmov.f32 %f3, 0f80000000;\nmov.f32 %f4, 0f00000000;\n\
         mov.f32 %f5, 0f7F800000;\n\
         min.f32 %f10, %f1, %f2;\nmax.f32 %f11, %f2, %f1;\nmin.f32 %f12, %f1, %f1;\nmin.f32 %f13, %f3, %f4;\n\
         max.f32 %f14, %f3, %f4;\nmax.f32 %f15, %f5, %f2;\nsub.f32 %f16, %f5, %f5;\n{}",
        stores32(&["%f10", "%f11", "%f12", "%f13", "%f14", "%f15", "%f16"])
    );
    let r = run(&body, 7);
    assert_eq!(r[0], 0x3F80_0000, "min(NaN, 1) = 1");
    assert_eq!(r[1], 0x3F80_0000, "max(1, NaN) = 1");
    assert_eq!(r[2], 0x7FFF_FFFF, "min(NaN, NaN) is the canonical NaN");
    assert_eq!(r[3], 0x8000_0000, "min(-0, +0) = -0");
    assert_eq!(r[4], 0x0000_0000, "max(-0, +0) = +0");
    assert_eq!(r[5], 0x7F80_0000, "max(inf, 1) = inf");
    assert!(f32::from_bits(r[6] as u32).is_nan(), "inf - inf is NaN");
    // f64 too.
    let body = format!(
        "mov.f64 %fd1, 0d7FF8000000000000;\nmov.f64 %fd2, 0dC000000000000000;\nmin.f64 %fd3, %fd1, %fd2;\n\
         max.f64 %fd4, %fd2, %fd1;\n{}",
        stores(&["%fd3", "%fd4"])
    );
    assert_eq!(run(&body, 2), vec![(-2f64).to_bits(), (-2f64).to_bits()]);
}

#[test]
fn setp_ordered_and_unordered_comparisons() {
    // For each comparison of (NaN, 1), (1, 1), (inf, 3.4e38): a bit.
    let cmps = ["eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"];
    let mut body = String::from("mov.f32 %f1, 0f7FC00000;\nmov.f32 %f2, 0f3F800000;\nmov.f32 %f3, 0f7F800000;\nmov.f32 %f4, 0f7F7FFFFF;\nmov.u64 %rd1, 0;\n");
    for (k, c) in cmps.iter().enumerate() {
        for (j, (a, b)) in [("%f1", "%f2"), ("%f2", "%f2"), ("%f3", "%f4")].iter().enumerate() {
            let bit = 3 * k + j;
            body += &format!(
                "setp.{c}.f32 %p1, {a}, {b};\nselp.u64 %rd2, {}, 0, %p1;\nor.b64 %rd1, %rd1, %rd2;\n",
                1u64 << bit
            );
        }
    }
    body += &stores(&["%rd1"]);
    let got = run(&body, 1)[0];
    let want: [[bool; 3]; 14] = [
        [false, true, false],  // eq
        [false, false, true],  // ne: ordered, false with NaN
        [false, false, false], // lt
        [false, true, false],  // le
        [false, false, true],  // gt
        [false, true, true],   // ge
        [true, true, false],   // equ
        [true, false, true],   // neu
        [true, false, false],  // ltu
        [true, true, false],   // leu
        [true, false, true],   // gtu
        [true, true, true],    // geu
        [false, true, true],   // num
        [true, false, false],  // nan
    ];
    for (k, row) in want.iter().enumerate() {
        for (j, &w) in row.iter().enumerate() {
            assert_eq!(got >> (3 * k + j) & 1 == 1, w, "setp.{} case {j}", cmps[k]);
        }
    }
    // Integer comparisons by signedness, and setp with a combining predicate.
    let body = format!(
        "mov.u32 %r1, -1;\nmov.u32 %r2, 1;\nsetp.lt.s32 %p1, %r1, %r2;\nsetp.lt.u32 %p2, %r1, %r2;\n\
         setp.gt.u32.and %p3, %r1, %r2, %p1;\nsetp.eq.s32 %p4|%p5, %r1, %r1;\n\
         selp.u32 %r10, 1, 0, %p1;\nselp.u32 %r11, 1, 0, %p2;\nselp.u32 %r12, 1, 0, %p3;\nselp.u32 %r13, 1, 0, %p5;\n{}",
        stores32(&["%r10", "%r11", "%r12", "%r13"])
    );
    assert_eq!(run(&body, 4), vec![1, 0, 1, 0]);
}

#[test]
fn integer_overflow_division_and_carry_chains() {
    let body = format!(
        "mov.u32 %r1, 0x7fffffff;\nadd.s32 %r2, %r1, 1;\nmul.lo.s32 %r3, %r1, 2;\nmov.u32 %r4, -1;\n\
         mul.hi.u32 %r5, %r4, %r4;\nmov.u32 %r6, -2;\nmul.wide.s32 %rd1, %r6, 3;\nmul.wide.u32 %rd2, %r4, %r4;\n\
         mov.u32 %r7, 0x80000000;\ndiv.s32 %r8, %r7, %r4;\nmov.u32 %r9, -7;\nrem.s32 %r10, %r9, 3;\n\
         div.u32 %r11, %r9, 0;\nmul.hi.s32 %r12, %r6, %r1;\n\
         add.cc.u32 %r13, %r4, 1;\naddc.u32 %r14, 5, 0;\nsub.cc.u32 %r15, 0, 1;\nsubc.u32 %r16, 5, 0;\n\
         mad.lo.s32 %r17, %r1, 2, 3;\nmad.wide.u32 %rd3, %r4, 2, %rd2;\nneg.s32 %r18, %r7;\nabs.s32 %r19, %r6;\n\
         max.s32 %r20, %r4, 1;\nmax.u32 %r21, %r4, 1;\nmov.u64 %rd4, 0x7fffffffffffffff;\nadd.s64 %rd5, %rd4, 1;\n{}",
        stores(&["%rd1", "%rd2", "%rd3", "%rd5"])
            + &stores32_at(
                4,
                &[
                    "%r2", "%r3", "%r5", "%r8", "%r10", "%r11", "%r12", "%r13", "%r14", "%r15", "%r16", "%r17", "%r18",
                    "%r19", "%r20", "%r21"
                ]
            )
    );
    let r = run(&body, 20);
    assert_eq!(r[0] as i64, -6, "mul.wide.s32 sign-extends");
    assert_eq!(r[1], 0xffff_fffe_0000_0001, "mul.wide.u32");
    assert_eq!(r[2], 0xffff_fffe_0000_0001u64.wrapping_add(0x1_ffff_fffe), "mad.wide.u32");
    assert_eq!(r[3], 0x8000_0000_0000_0000, "add.s64 wraps");
    let w: Vec<u32> = r[4..].iter().map(|&x| x as u32).collect();
    assert_eq!(w[0], 0x8000_0000, "add.s32 wraps");
    assert_eq!(w[1], 0xffff_fffe, "mul.lo keeps the low half");
    assert_eq!(w[2], 0xffff_fffe, "mul.hi.u32");
    assert_eq!(w[3], 0x8000_0000, "INT_MIN / -1 wraps");
    assert_eq!(w[4] as i32, -1, "rem.s32 takes the dividend's sign");
    assert_eq!(w[5], 0xffff_ffff, "unsigned division by zero gives all ones");
    assert_eq!(w[6] as i32, ((-2i64 * 0x7fff_ffff) >> 32) as i32, "mul.hi.s32");
    assert_eq!((w[7], w[8]), (0, 6), "add.cc then addc carries one");
    assert_eq!((w[9], w[10]), (0xffff_ffff, 4), "sub.cc then subc borrows one");
    assert_eq!(w[11], 0x7fff_ffffu32.wrapping_mul(2).wrapping_add(3), "mad.lo");
    assert_eq!(w[12], 0x8000_0000, "neg INT_MIN = INT_MIN");
    assert_eq!(w[13], 2, "abs");
    assert_eq!((w[14], w[15]), (1, 0xffff_ffff), "max by signedness");
}

/// A signed load sign-extends to its destination register's width: NVRTC
/// folds `(long long)x[i]` of an `int` into `ld.global.s32` into a 64-bit
/// register. A 32-bit destination keeps its upper half clear (what the
/// 32-bit instructions expect), and an unsigned load zero-extends.
#[test]
fn signed_loads_sign_extend_to_the_destination_width() {
    let body = format!(
        "mov.u32 %r1, -5;\nst.global.b32 [%rd0+48], %r1;\nld.global.s32 %rd1, [%rd0+48];\n\
         ld.global.u32 %rd2, [%rd0+48];\nld.global.s32 %r2, [%rd0+48];\ncvt.u64.u32 %rd3, %r2;\n\
         mov.u16 %h1, -3;\nst.global.b16 [%rd0+56], %h1;\nld.global.s16 %rd4, [%rd0+56];\n{}",
        stores(&["%rd1", "%rd2", "%rd3", "%rd4"])
    );
    let w = run(&body, 8);
    assert_eq!(w[0] as i64, -5, "ld.s32 into a 64-bit register");
    assert_eq!(w[1], 0xffff_fffb, "ld.u32 into a 64-bit register");
    assert_eq!(w[2], 0xffff_fffb, "ld.s32 into a 32-bit register");
    assert_eq!(w[3] as i64, -3, "ld.s16 into a 64-bit register");
}

#[test]
fn shifts_past_the_width_clamp() {
    let body = format!(
        "mov.u32 %r1, 1;\nshl.b32 %r2, %r1, 31;\nshl.b32 %r3, %r1, 32;\nshl.b32 %r4, %r1, 40;\nmov.u32 %r5, -8;\n\
         shr.s32 %r6, %r5, 1;\nshr.s32 %r7, %r5, 40;\nshr.u32 %r8, %r5, 33;\nshr.u32 %r9, %r5, 28;\n\
         mov.u64 %rd1, 1;\nshl.b64 %rd2, %rd1, 63;\nshl.b64 %rd3, %rd1, 64;\nshr.s64 %rd4, %rd2, 70;\nshr.u64 %rd5, %rd2, 63;\n{}{}",
        stores32(&["%r2", "%r3", "%r4", "%r6", "%r7", "%r8", "%r9"]),
        stores_at(7, &["%rd2", "%rd3", "%rd4", "%rd5"])
    );
    let r = run(&body, 11);
    assert_eq!(r[..7], [0x8000_0000, 0, 0, 0xffff_fffc, 0xffff_ffff, 0, 0xf]);
    assert_eq!(r[7..], [1 << 63, 0, u64::MAX, 1]);
}

#[test]
fn rounding_modes_of_arithmetic_and_conversions() {
    // 1 + 2^-30 is between 1 and the next f32.
    let body = format!(
        "mov.f32 %f1, 0f3F800000;\nmov.f32 %f2, 0f30800000;\nadd.rn.f32 %f3, %f1, %f2;\nadd.rz.f32 %f4, %f1, %f2;\n\
         add.rp.f32 %f5, %f1, %f2;\nadd.rm.f32 %f6, %f1, %f2;\nneg.f32 %f7, %f1;\nsub.rm.f32 %f8, %f7, %f2;\n\
         sub.rz.f32 %f9, %f7, %f2;\nmov.f32 %f10, 0f3F800001;\nmul.rz.f32 %f11, %f10, %f10;\nmul.rp.f32 %f12, %f10, %f10;\n\
         fma.rm.f32 %f13, %f10, %f10, %f2;\nfma.rp.f32 %f14, %f10, %f10, %f2;\nmov.f32 %f15, 0f40400000;\n\
         div.rz.f32 %f16, %f1, %f15;\ndiv.rp.f32 %f17, %f1, %f15;\ndiv.rn.f32 %f18, %f1, %f15;\n{}",
        stores32(&["%f3", "%f4", "%f5", "%f6", "%f8", "%f9", "%f11", "%f12", "%f13", "%f14", "%f16", "%f17", "%f18"])
    );
    let r: Vec<u32> = run(&body, 13).iter().map(|&x| x as u32).collect();
    assert_eq!(r[0], 0x3F80_0000, "rn rounds 1 + 2^-30 down");
    assert_eq!(r[1], 0x3F80_0000, "rz");
    assert_eq!(r[2], 0x3F80_0001, "rp goes up one ulp");
    assert_eq!(r[3], 0x3F80_0000, "rm");
    assert_eq!(r[4], 0xBF80_0001, "rm of -1 - 2^-30 goes down (away from zero)");
    assert_eq!(r[5], 0xBF80_0000, "rz of -1 - 2^-30 goes toward zero");
    // (1 + 2^-23)^2 = 1 + 2^-22 + 2^-46.
    assert_eq!(r[6], 0x3F80_0002, "mul.rz drops 2^-46");
    assert_eq!(r[7], 0x3F80_0003, "mul.rp rounds it up");
    assert_eq!(r[8], 0x3F80_0002, "fma.rm");
    assert_eq!(r[9], 0x3F80_0003, "fma.rp");
    let third = 1.0f32 / 3.0;
    assert_eq!(r[12], third.to_bits(), "div.rn");
    assert_eq!(r[10], third.to_bits() - 1, "1/3 rounded to nearest is above it, so rz is one ulp below");
    assert_eq!(r[11], third.to_bits(), "div.rp agrees with nearest");
    // Conversions.
    let body = format!(
        "mov.f32 %f1, 0f40200000;\nmov.f32 %f2, 0f40600000;\nmov.f32 %f3, 0fC02CCCCD;\nmov.f32 %f4, 0f7FC00000;\n\
         mov.f32 %f5, 0f4F32D05E;\n\
         cvt.rni.s32.f32 %r1, %f1;\ncvt.rni.s32.f32 %r2, %f2;\ncvt.rzi.s32.f32 %r3, %f3;\ncvt.rmi.s32.f32 %r4, %f3;\n\
         cvt.rpi.s32.f32 %r5, %f3;\ncvt.rni.s32.f32 %r6, %f4;\ncvt.rzi.s32.f32 %r7, %f5;\nneg.f32 %f6, %f5;\n\
         cvt.rzi.u32.f32 %r8, %f6;\ncvt.rmi.f32.f32 %f7, %f3;\ncvt.rni.f32.f32 %f8, %f1;\n\
         mov.f64 %fd1, 0d3FF0000004000000;\ncvt.rn.f32.f64 %f9, %fd1;\ncvt.rp.f32.f64 %f10, %fd1;\n\
         cvt.rz.f32.f64 %f11, %fd1;\ncvt.sat.f32.f32 %f12, %f2;\ncvt.sat.f32.f32 %f13, %f4;\ncvt.rzi.s64.f64 %rd1, %fd1;\n\
         mov.u64 %rd2, -3;\ncvt.rn.f64.s64 %fd2, %rd2;\ncvt.u16.u32 %h1, %r8;\nmov.u32 %r9, 70000;\ncvt.u16.u32 %h2, %r9;\n\
         cvt.u32.u16 %r10, %h2;\ncvt.s64.s32 %rd3, %r3;\n{}",
        stores32(&["%r1", "%r2", "%r3", "%r4", "%r5", "%r6", "%r7", "%r8", "%f7", "%f8", "%f9", "%f10", "%f11", "%f12", "%f13", "%r10"])
            + &stores_at(16, &["%rd1", "%fd2", "%rd3"])
    );
    let r = run(&body, 19);
    let w: Vec<u32> = r[..16].iter().map(|&x| x as u32).collect();
    assert_eq!(w[0] as i32, 2, "rni: 2.5 to even");
    assert_eq!(w[1] as i32, 4, "rni: 3.5 to even");
    assert_eq!(w[2] as i32, -2, "rzi -2.7");
    assert_eq!(w[3] as i32, -3, "rmi -2.7");
    assert_eq!(w[4] as i32, -2, "rpi -2.7");
    assert_eq!(w[5], 0, "NaN converts to 0");
    assert_eq!(w[6] as i32, i32::MAX, "3e9 saturates");
    assert_eq!(w[7], 0, "negative to unsigned saturates to 0");
    assert_eq!(f32::from_bits(w[8]), -3.0, "cvt.rmi.f32.f32");
    assert_eq!(f32::from_bits(w[9]), 2.0, "cvt.rni.f32.f32");
    assert_eq!(w[10], 0x3F80_0000, "cvt.rn.f32.f64 of 1 + 2^-28");
    assert_eq!(w[11], 0x3F80_0001, "cvt.rp.f32.f64");
    assert_eq!(w[12], 0x3F80_0000, "cvt.rz.f32.f64");
    assert_eq!(f32::from_bits(w[13]), 1.0, "sat clamps 3.5 to 1");
    assert_eq!(w[14], 0, "sat turns NaN into 0");
    assert_eq!(w[15], 70000 & 0xffff, "cvt.u16.u32 truncates, cvt.u32.u16 zero-extends");
    assert_eq!(r[16], 1, "cvt.rzi.s64.f64");
    assert_eq!(f64::from_bits(r[17]), -3.0, "cvt.rn.f64.s64");
    assert_eq!(r[18] as i64, -2, "cvt.s64.s32 sign-extends");
}

#[test]
fn half_precision_conversions_keep_subnormals() {
    // 2^-24 (the least f16 subnormal), 2^-25 (a tie, to even: 0), 1.5 * 2^-24
    // (a tie, to even: 2 * 2^-24), 65520 (overflows to inf), and back.
    let body = format!(
        "mov.f32 %f1, 0f33800000;\nmov.f32 %f2, 0f33000000;\nmov.f32 %f3, 0f33C00000;\nmov.f32 %f4, 0f477FF000;\n\
         cvt.rn.f16.f32 %h1, %f1;\ncvt.rn.f16.f32 %h2, %f2;\ncvt.rn.f16.f32 %h3, %f3;\ncvt.rn.f16.f32 %h4, %f4;\n\
         mov.b16 %h5, 0x8201;\ncvt.f32.f16 %f5, %h5;\ncvt.f32.f16 %f6, %h1;\n\
         mov.f32 %f7, 0f3F808000;\ncvt.rn.bf16.f32 %h6, %f7;\nmov.f32 %f8, 0f3F818000;\ncvt.rn.bf16.f32 %h7, %f8;\n\
         mov.b16 %h8, 0x0001;\ncvt.f32.bf16 %f9, %h8;\ncvt.f64.f32 %fd1, %f9;\n\
         cvt.u32.u16 %r1, %h1;\ncvt.u32.u16 %r2, %h2;\ncvt.u32.u16 %r3, %h3;\ncvt.u32.u16 %r4, %h4;\n\
         cvt.u32.u16 %r5, %h6;\ncvt.u32.u16 %r6, %h7;\n{}",
        stores32(&["%r1", "%r2", "%r3", "%r4", "%f5", "%f6", "%r5", "%r6", "%f9"])
    );
    let r: Vec<u32> = run(&body, 9).iter().map(|&x| x as u32).collect();
    assert_eq!(r[0], 0x0001, "2^-24 is the least subnormal");
    assert_eq!(r[1], 0x0000, "2^-25 ties to even: zero");
    assert_eq!(r[2], 0x0002, "1.5 * 2^-24 ties to even: 2 * 2^-24");
    assert_eq!(r[3], 0x7C00, "65520 rounds to infinity");
    assert_eq!(f32::from_bits(r[4]), -(513.0 * 2f32.powi(-24)), "a negative subnormal f16 widens exactly");
    assert_eq!(r[5], 0x3380_0000, "2^-24 widens back exactly");
    assert_eq!(r[6], 0x3F80, "bf16: 1 + 2^-8 ties to even (down)");
    assert_eq!(r[7], 0x3F82, "bf16: 1 + 3 * 2^-8 ties to even (up)");
    assert_eq!(f32::from_bits(r[8]), f32::from_bits(0x0001_0000), "a bf16 subnormal widens exactly");
}

#[test]
fn ftz_and_approximate_instructions() {
    let body = format!(
        "mov.f32 %f1, 0f00000010;\nmov.f32 %f2, 0f3F800000;\nmul.f32 %f3, %f1, %f2;\nmul.ftz.f32 %f4, %f1, %f2;\n\
         mov.f32 %f5, 0f3F800000;\nex2.approx.ftz.f32 %f6, %f5;\nmov.f32 %f7, 0f40400000;\nrcp.approx.ftz.f32 %f8, %f7;\n\
         mov.f32 %f9, 0f40000000;\nsqrt.rn.f32 %f10, %f9;\nrsqrt.approx.f32 %f11, %f9;\nlg2.approx.f32 %f12, %f9;\n\
         mov.f32 %f13, 0fC2FE0000;\nex2.approx.ftz.f32 %f14, %f13;\nabs.f32 %f15, %f13;\nneg.f32 %f16, %f1;\n{}",
        stores32(&["%f3", "%f4", "%f6", "%f8", "%f10", "%f11", "%f12", "%f14", "%f15", "%f16"])
    );
    let r: Vec<u32> = run(&body, 10).iter().map(|&x| x as u32).collect();
    assert_eq!(r[0], 0x10, "without ftz a subnormal survives");
    assert_eq!(r[1], 0, "ftz flushes it");
    assert_eq!(f32::from_bits(r[2]), 2.0, "ex2(1)");
    assert!((f32::from_bits(r[3]) - 1.0 / 3.0).abs() <= f32::EPSILON / 3.0, "rcp.approx within an ulp");
    assert_eq!(r[4], 2f32.sqrt().to_bits(), "sqrt.rn correctly rounded");
    assert!((f32::from_bits(r[5]) - std::f32::consts::FRAC_1_SQRT_2).abs() <= 2.0 * f32::EPSILON, "rsqrt.approx");
    assert_eq!(f32::from_bits(r[6]), 1.0, "lg2(2)");
    assert_eq!(r[7], 0, "ex2(-127) is subnormal, flushed under ftz");
    assert_eq!(f32::from_bits(r[8]), 127.0, "abs");
    assert_eq!(r[9], 0x8000_0010, "neg flips the sign bit only");
}

#[test]
fn bit_operations_and_vector_moves() {
    let body = format!(
        "mov.u32 %r1, 0x33221100;\nmov.u32 %r2, 0x77665544;\nprmt.b32 %r3, %r1, %r2, 0x0123;\nprmt.b32 %r4, %r1, %r2, 0x7654;\n\
         prmt.b32 %r5, %r1, %r2, 0x4180;\nmov.u32 %r6, 1;\nclz.b32 %r7, %r6;\nmov.u64 %rd1, 0;\nclz.b64 %r8, %rd1;\n\
         mov.u32 %r9, 0xf0f0;\npopc.b32 %r10, %r9;\nbrev.b32 %r11, %r6;\nmov.u64 %rd2, 0xab;\nmov.u64 %rd3, 0xffff;\n\
         bfi.b64 %rd4, %rd2, %rd3, 8, 8;\nbfe.u32 %r12, %r2, 8, 8;\nmov.u32 %r13, 0x80;\nbfe.s32 %r14, %r13, 4, 4;\n\
         mov.b64 %rd5, 0x1111111122222222;\nmov.b64 {{%r15, %r16}}, %rd5;\nmov.b64 %rd6, {{%r16, %r15}};\n\
         not.b32 %r17, %r6;\nxor.b32 %r18, %r1, %r2;\n{}",
        stores32(&["%r3", "%r4", "%r5", "%r7", "%r8", "%r10", "%r11", "%r12", "%r14", "%r15", "%r16", "%r17", "%r18"])
            + &stores_at(13, &["%rd4", "%rd6"])
    );
    let r = run(&body, 15);
    let w: Vec<u32> = r[..13].iter().map(|&x| x as u32).collect();
    assert_eq!(w[0], 0x0011_2233, "prmt reverses bytes");
    assert_eq!(w[1], 0x7766_5544, "prmt selects b");
    assert_eq!(w[2], 0x4411_0000, "prmt 0x4180: a.byte0, sign of a.byte0, a.byte1, b.byte0");
    assert_eq!((w[3], w[4], w[5], w[6]), (31, 64, 8, 0x8000_0000));
    assert_eq!(w[7], 0x55, "bfe.u32");
    assert_eq!(w[8], 0xffff_fff8, "bfe.s32 sign-extends the field");
    assert_eq!((w[9], w[10]), (0x2222_2222, 0x1111_1111), "unpack: element 0 is the low half");
    assert_eq!(w[11], 0xffff_fffe);
    assert_eq!(w[12], 0x3322_1100 ^ 0x7766_5544);
    assert_eq!(r[13], 0xabff, "bfi inserts 8 bits at 8");
    assert_eq!(r[14], 0x2222_2222_1111_1111, "pack");
}

#[test]
fn lop3_applies_its_truth_table_bit_by_bit_as_one_integer_instruction() {
    // Truth tables from the PTX ISA's rule: lut = f(0xF0, 0xCC, 0xAA).
    let (a, b, c) = (0xF0F0_A5A5u32, 0xCCCC_0FF0u32, 0xAAAA_3C3Cu32);
    type Bitwise = fn(u32, u32, u32) -> u32;
    let luts: [(u32, Bitwise); 7] = [
        (0x96, |a, b, c| a ^ b ^ c),
        (0xE8, |a, b, c| (a & b) | (a & c) | (b & c)),
        (0x80, |a, b, c| a & b & c),
        (0xFE, |a, b, c| a | b | c),
        (0xCA, |a, b, c| (a & b) | (!a & c)),
        (0xF0, |a, _, _| a),
        (0x00, |_, _, _| 0),
    ];
    let mut body = format!("mov.u32 %r1, {a};\nmov.u32 %r2, {b};\nmov.u32 %r3, {c};\n");
    for (k, (lut, _)) in luts.iter().enumerate() {
        body += &format!("lop3.b32 %r{}, %r1, %r2, %r3, {lut};\n", 10 + k);
    }
    // An immediate input, as NVRTC emits for a constant operand.
    body += "lop3.b32 %r20, %r1, 0x0000FFFF, %r3, 0x96;\n";
    let regs: Vec<String> = (10..10 + luts.len()).map(|r| format!("%r{r}")).chain(["%r20".into()]).collect();
    let regs: Vec<&str> = regs.iter().map(|s| s.as_str()).collect();
    body += &stores32(&regs);
    tapir_cuda_emu::exec::set_profiling(true);
    let (r, stats) = launch("", &body, 32, regs.len()).unwrap_or_else(|f| panic!("{}", f.message));
    for (k, (lut, f)) in luts.iter().enumerate() {
        assert_eq!(r[k] as u32, f(a, b, c), "lop3 with table {lut:#04x}");
    }
    assert_eq!(r[luts.len()] as u32, a ^ 0x0000_FFFF ^ c, "lop3 with an immediate operand");
    // Each lop3 is one integer warp-instruction, like the xor it replaces.
    let int = stats.counters.of(tapir_cuda_emu::exec::Class::Int);
    assert_eq!(
        int,
        3 + luts.len() as u64 + 1,
        "integer warp-instructions: 3 moves and 8 lop3 (ld.param is its own class)"
    );
}

#[test]
fn warp_shuffles_votes_and_shared_atomics() {
    // Each lane: bfly-sum of its lane id, down by 1, up by 1, idx from lane 5,
    // ballot of odd lanes, and an atomic add to shared memory.
    let extra = ".shared .align 4 .u32 total;\n";
    let body = "mov.u32 %r1, %tid.x;\nmov.u32 %r2, %r1;\n\
                shfl.sync.bfly.b32 %r3, %r2, 16, 31, -1;\nadd.s32 %r2, %r2, %r3;\nshfl.sync.bfly.b32 %r3, %r2, 8, 31, -1;\n\
                add.s32 %r2, %r2, %r3;\nshfl.sync.bfly.b32 %r3, %r2, 4, 31, -1;\nadd.s32 %r2, %r2, %r3;\n\
                shfl.sync.bfly.b32 %r3, %r2, 2, 31, -1;\nadd.s32 %r2, %r2, %r3;\nshfl.sync.bfly.b32 %r3, %r2, 1, 31, -1;\n\
                add.s32 %r2, %r2, %r3;\n\
                shfl.sync.down.b32 %r4|%p1, %r1, 1, 31, -1;\nshfl.sync.up.b32 %r5|%p2, %r1, 1, 0, -1;\n\
                shfl.sync.idx.b32 %r6, %r1, 5, 31, -1;\nand.b32 %r7, %r1, 1;\nsetp.ne.u32 %p3, %r7, 0;\n\
                vote.sync.ballot.b32 %r8, %p3, -1;\nvote.sync.all.pred %p4, %p3, -1;\nvote.sync.any.pred %p5, %p3, -1;\n\
                selp.u32 %r9, 1, 0, %p1;\nselp.u32 %r10, 1, 0, %p2;\nselp.u32 %r11, 1, 0, %p4;\nselp.u32 %r12, 1, 0, %p5;\n\
                setp.eq.u32 %p6, %r1, 0;\n@%p6 st.shared.u32 [total], 0;\nbar.sync 0;\natom.shared.add.u32 %r13, [total], %r1;\n\
                bar.sync 0;\nld.shared.u32 %r14, [total];\n\
                mul.wide.u32 %rd1, %r1, 64;\nadd.s64 %rd2, %rd0, %rd1;\n\
                st.global.u32 [%rd2], %r2;\nst.global.u32 [%rd2+4], %r4;\nst.global.u32 [%rd2+8], %r5;\n\
                st.global.u32 [%rd2+12], %r6;\nst.global.u32 [%rd2+16], %r8;\nst.global.u32 [%rd2+20], %r9;\n\
                st.global.u32 [%rd2+24], %r10;\nst.global.u32 [%rd2+28], %r11;\nst.global.u32 [%rd2+32], %r12;\n\
                st.global.u32 [%rd2+36], %r14;\n";
    let r = run_with(extra, body, 32, 32 * 8).unwrap_or_else(|f| panic!("{}", f.message));
    let word = |lane: usize, k: usize| (r[lane * 8 + k / 2] >> (32 * (k % 2))) as u32;
    for lane in 0..32 {
        assert_eq!(word(lane, 0), 496, "lane {lane}: the butterfly sums 0..32");
        assert_eq!(word(lane, 1), if lane < 31 { lane as u32 + 1 } else { 31 }, "down");
        assert_eq!(word(lane, 5), u32::from(lane < 31), "down's predicate");
        assert_eq!(word(lane, 2), if lane > 0 { lane as u32 - 1 } else { 0 }, "up");
        assert_eq!(word(lane, 6), u32::from(lane > 0), "up's predicate");
        assert_eq!(word(lane, 3), 5, "idx");
        assert_eq!(word(lane, 4), 0xaaaa_aaaa, "ballot of odd lanes");
        assert_eq!((word(lane, 7), word(lane, 8)), (0, 1), "all / any");
        assert_eq!(word(lane, 9), 496, "shared atomics add up");
    }
}

#[test]
fn device_function_calls_with_params_and_local_memory() {
    let extra = ".func (.param .b64 ret) twice_plus(.param .b64 a, .param .b32 b)\n{\n\
                 .local .align 8 .b8 __local_depot0[16];\n.reg .b64 %SPL;\n.reg .b64 %x<4>;\n.reg .b32 %y<2>;\n\
                 mov.u64 %SPL, __local_depot0;\nld.param.u64 %x1, [a];\nld.param.u32 %y1, [b];\n\
                 st.local.u64 [%SPL+8], %x1;\nld.local.u64 %x2, [%SPL+8];\nadd.s64 %x2, %x2, %x2;\ncvt.u64.u32 %x3, %y1;\n\
                 add.s64 %x2, %x2, %x3;\nst.param.b64 [ret], %x2;\nret;\n}\n";
    let body = "mov.u64 %rd1, 20;\n{\n.param .b64 param0;\n.param .b32 param1;\n.param .b64 retval0;\n\
                st.param.b64 [param0], %rd1;\nst.param.b32 [param1], 2;\ncall.uni (retval0), twice_plus, (param0, param1);\n\
                ld.param.b64 %rd2, [retval0];\n}\nst.global.u64 [%rd0], %rd2;\n";
    assert_eq!(run_with(extra, body, 1, 1).unwrap_or_else(|f| panic!("{}", f.message)), vec![42]);
}

#[test]
fn a_shuffle_whose_lane_has_exited_is_reported() {
    let body = "mov.u32 %r1, %tid.x;\nsetp.eq.u32 %p1, %r1, 3;\n@%p1 bra $L_end;\n\
                shfl.sync.bfly.b32 %r2, %r1, 1, 31, -1;\n$L_end:\n";
    let err = run_with("", body, 32, 1).expect_err("lane 3 never arrives");
    assert!(err.message.contains("lane 3") && err.message.contains("exited"), "{}", err.message);
}

#[test]
fn blocks_on_several_workers_report_the_lowest_failing_block() {
    // Block b stores b at out[b]; the buffer holds 5 words, so blocks 5.. fault.
    let src = format!(
        "{HEAD}.visible .entry t(.param .u64 out)\n{{\n{REGS}ld.param.u64 %rd0, [out];\nmov.u32 %r1, %ctaid.x;\n\
         mul.wide.u32 %rd1, %r1, 8;\nadd.s64 %rd2, %rd0, %rd1;\ncvt.u64.u32 %rd3, %r1;\nst.global.u64 [%rd2], %rd3;\nret;\n}}\n"
    );
    let module = ptx::load(&src, &|_| Vec::new()).unwrap();
    for workers in [1, 2, 4, 8] {
        let mem = Memory::new(1 << 20);
        let out = mem.alloc(5 * 8).unwrap();
        let snap = mem.snapshot();
        let l = Launch {
            module: &module,
            func: 0,
            grid: [64, 1, 1],
            block: [32, 1, 1],
            dyn_shared: 0,
            params: &out.to_le_bytes(),
            mem: &snap,
            racecheck: true,
            workers,
        };
        let err = exec::run(&l).expect_err("blocks 5 and up write past the buffer");
        assert!(err.message.contains("block (5, 0, 0)"), "{workers} workers: {}", err.message);
        let p = mem.host_ptr(out, 40).unwrap();
        // SAFETY: five words.
        let got: Vec<u64> = (0..5).map(|k| unsafe { p.cast::<u64>().add(k).read() }).collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4], "{workers} workers");
        // Without the faulting blocks, all workers agree on the result and the count.
        let l = Launch { grid: [5, 1, 1], ..l };
        let stats = exec::run(&l).unwrap();
        assert_eq!(stats.instructions, 5 * 32 * 7, "{workers} workers: seven instructions a thread");
    }
}

#[test]
fn what_the_interpreter_lacks_is_listed_not_run() {
    let src = format!(
        "{HEAD}.visible .entry t(.param .u64 out)\n{{\n{REGS}mov.u32 %r1, %clock;\nadd.rn.f16x2 %r2, %r1, %r1;\n\
         add.f16 %h1, %h2, %h3;\nfma.rn.bf16 %h1, %h2, %h3, %h4;\ntestp.finite.f32 %p1, %f1;\n\
         atom.global.cas.b16 %h1, [%rd0], %h2, %h3;\nret;\n}}\n"
    );
    let m = ptx::load(&src, &|_| Vec::new()).unwrap();
    assert_eq!(
        m.unsupported,
        vec!["add.f16", "add.rn.f16x2", "atom.global.cas.b16", "fma.rn.bf16", "mov.u32", "testp.finite.f32"]
    );
}

#[test]
fn signed_loads_extend_to_the_destination_register_width() {
    // Word 0 holds 0xffff_fff6 (-10 as s32) in its low half and 0x80 in
    // byte 4: a signed load sign-extends into a 64-bit register (the
    // i32 -> i64 cast kernel compiles to `ld.global.s32 %rd, ...`) and to
    // 32 bits in a 32-bit one; an unsigned load zero-extends.
    let body = "mov.u64 %rd1, 0x00000080fffffff6;\nst.global.b64 [%rd0], %rd1;\n\
                ld.global.s32 %rd2, [%rd0];\nld.global.u32 %rd3, [%rd0];\nld.global.s8 %rd4, [%rd0+4];\n\
                ld.global.s16 %r1, [%rd0];\nmov.u64 %rd5, 0;\nmov.b64 {%r2, %r3}, %rd5;\n\
                ld.global.v2.s32 {%rd6, %rd7}, [%rd0];\n"
        .to_string()
        + &stores_at(1, &["%rd2", "%rd3", "%rd4", "%rd6", "%rd7"])
        + &stores32_at(6, &["%r1"]);
    let r = run(&body, 7);
    assert_eq!(r[1] as i64, -10, "ld.s32 into a 64-bit register sign-extends");
    assert_eq!(r[2], 0xffff_fff6, "ld.u32 zero-extends");
    assert_eq!(r[3] as i64, -128, "ld.s8 into a 64-bit register");
    assert_eq!((r[4] as i64, r[5]), (-10, 0x80), "vector loads extend each element");
    assert_eq!(r[6] as u32, 0xffff_fff6, "ld.s16 into a 32-bit register stays 32 bits");
}

/// Whether `r` is `1 / sqrt(x)` rounded to the nearest f32, decided with
/// integers: with `x = mx 2^ex` and a midpoint `m = mm 2^em` between `r`
/// and a neighbour, `1 / sqrt(x) < m` exactly when `mm^2 mx 2^(2 em + ex) > 1`.
fn is_rsqrt_rounded(x: f32, r: f32) -> bool {
    // (odd mantissa, exponent) of a positive finite value: v = m 2^e.
    fn split(v: f64) -> (u128, i32) {
        let b = v.to_bits();
        let e = ((b >> 52) & 0x7ff) as i32;
        let (m, e) = if e == 0 { (b & ((1 << 52) - 1), -1074) } else { (b & ((1 << 52) - 1) | 1 << 52, e - 1075) };
        let z = m.trailing_zeros();
        (u128::from(m >> z), e + z as i32)
    }
    // The sign of m^2 x - 1 for a midpoint m (25 significant bits, so
    // m^2 x has at most 74 and fits in a u128).
    let side = |m: f64| -> std::cmp::Ordering {
        let ((mm, em), (mx, ex)) = (split(m), split(f64::from(x)));
        let (q, e) = (mm * mm * mx, 2 * em + ex);
        let bits = 128 - q.leading_zeros() as i32;
        if bits + e <= 0 {
            std::cmp::Ordering::Less
        } else if bits - 1 + e >= 1 {
            std::cmp::Ordering::Greater
        } else if q.is_power_of_two() {
            std::cmp::Ordering::Equal
        } else {
            std::cmp::Ordering::Greater
        }
    };
    let up = f32::from_bits(r.to_bits() + 1);
    let down = f32::from_bits(r.to_bits() - 1);
    let hi = (f64::from(r) + f64::from(up)) / 2.0;
    let lo = (f64::from(r) + f64::from(down)) / 2.0;
    // 1/sqrt(x) <= hi means hi^2 x >= 1; 1/sqrt(x) >= lo means lo^2 x <= 1.
    side(hi) != std::cmp::Ordering::Less && side(lo) != std::cmp::Ordering::Greater
}

#[test]
fn rsqrt_approx_is_correctly_rounded() {
    // Thread t takes x with bits 0x0080_0000 + t * 0x0007_f1e3 (normal
    // values over 64 binades, varied mantissas) and stores x and rsqrt(x).
    let body = "mov.u32 %r1, %tid.x;\nmul.lo.u32 %r2, %r1, 520675;\nadd.u32 %r2, %r2, 8388608;\n\
                mov.b32 %f1, %r2;\nrsqrt.approx.f32 %f2, %f1;\nmov.b32 %r3, %f2;\n\
                mul.wide.u32 %rd1, %r1, 16;\nadd.s64 %rd2, %rd0, %rd1;\n\
                st.global.u32 [%rd2], %r2;\nst.global.u32 [%rd2+8], %r3;\n";
    let words = run_with("", body, 1024, 2048).unwrap_or_else(|f| panic!("{}", f.message));
    let mut single = 0;
    for t in 0..1024 {
        let x = f32::from_bits(words[2 * t] as u32);
        let r = f32::from_bits(words[2 * t + 1] as u32);
        assert!(is_rsqrt_rounded(x, r), "rsqrt({x:e}) = {r:e} is not the nearest f32");
        if (1.0 / x.sqrt()).to_bits() != r.to_bits() {
            single += 1;
        }
    }
    // The f32 formula 1/sqrt(x) is off by an ulp on a share of these inputs.
    println!("1 / sqrt(x) in f32 differs from the correctly rounded value on {single} of 1024 inputs");
    assert!(single > 0, "the inputs include ones where rounding twice in f32 goes wrong");
}

#[test]
fn copysign_takes_the_sign_of_its_first_operand() {
    // copysign d, a, b: b's magnitude with a's sign (NVRTC 13 emits it for copysignf).
    let body = format!(
        "mov.f32 %f1, 0fBF800000;\nmov.f32 %f2, 0f40400000;\nmov.f32 %f3, 0f00000000;\nmov.f32 %f4, 0fFFC00000;\n\
         copysign.f32 %f10, %f1, %f2;\ncopysign.f32 %f11, %f3, %f1;\ncopysign.f32 %f12, %f1, %f4;\n\
         mov.f64 %fd1, 0d8000000000000000;\nmov.f64 %fd2, 0d4014000000000000;\ncopysign.f64 %fd3, %fd1, %fd2;\n{}{}",
        stores32(&["%f10", "%f11", "%f12"]),
        stores_at(3, &["%fd3"])
    );
    let r = run(&body, 4);
    assert_eq!(r[0], (-3f32).to_bits() as u64, "copysign(-1, 3) = -3");
    assert_eq!(r[1], 1f32.to_bits() as u64, "copysign(+0, -1) = 1");
    assert_eq!(r[2] as u32 & 0x8000_0000, 0x8000_0000, "the NaN takes the negative sign");
    assert!(f32::from_bits(r[2] as u32).is_nan());
    assert_eq!(r[3], (-5f64).to_bits(), "copysign(-0, 5) = -5");
}

/// The f32 at float index `k` of the words `r`.
fn f32_at(r: &[u64], k: usize) -> f32 {
    f32::from_bits((r[k / 2] >> (32 * (k % 2))) as u32)
}

#[test]
fn vector_red_and_atom_add_f32_match_scalar_adds_in_lane_order() {
    // 32 lanes add {l, 2l, 0.5, -1} with red.v4 and {1, l} with red.v2 to
    // one address each (starting at 1), and each lane's atom.v4 adds l to
    // its own vector {1, l, 0.5, -1} and gets that vector back.
    let body = "mov.u32 %r1, %tid.x;\ncvt.rn.f32.u32 %f1, %r1;\nadd.f32 %f2, %f1, %f1;\nmov.f32 %f3, 0f3F000000;\n\
                mov.f32 %f4, 0fBF800000;\nmov.f32 %f5, 0f3F800000;\nsetp.eq.u32 %p1, %r1, 0;\n\
                @%p1 st.global.v4.f32 [%rd0], {%f5, %f5, %f5, %f5};\n@%p1 st.global.v2.f32 [%rd0+16], {%f5, %f5};\n\
                bar.sync 0;\nred.global.add.v4.f32 [%rd0], {%f1, %f2, %f3, %f4};\n\
                red.global.add.v2.f32 [%rd0+16], {%f5, %f1};\n\
                mul.wide.u32 %rd1, %r1, 16;\nadd.s64 %rd2, %rd0, %rd1;\n\
                st.global.v4.f32 [%rd2+32], {%f5, %f1, %f3, %f4};\n\
                atom.global.add.v4.f32 {%f10, %f11, %f12, %f13}, [%rd2+32], {%f1, %f1, %f1, %f1};\n\
                st.global.v4.f32 [%rd2+544], {%f10, %f11, %f12, %f13};\n";
    let r = run_with("", body, 32, 132).unwrap_or_else(|f| panic!("{}", f.message));
    let (mut v4, mut v2) = ([1f32; 4], [1f32; 2]);
    for l in 0..32 {
        let x = l as f32;
        for (a, b) in v4.iter_mut().zip([x, x + x, 0.5, -1.0]) {
            *a += b;
        }
        for (a, b) in v2.iter_mut().zip([1.0, x]) {
            *a += b;
        }
    }
    assert_eq!([f32_at(&r, 0), f32_at(&r, 1), f32_at(&r, 2), f32_at(&r, 3)], v4, "red.v4 of 32 lanes");
    assert_eq!([f32_at(&r, 4), f32_at(&r, 5)], v2, "red.v2 of 32 lanes");
    for l in 0..32 {
        let x = l as f32;
        let start = [1.0, x, 0.5, -1.0];
        let got: Vec<f32> = (0..4).map(|k| f32_at(&r, 8 + 4 * l + k)).collect();
        let want: Vec<f32> = start.iter().map(|s| s + x).collect();
        assert_eq!(got, want, "lane {l}: atom.v4's sums");
        let old: Vec<f32> = (0..4).map(|k| f32_at(&r, 136 + 4 * l + k)).collect();
        assert_eq!(old, start, "lane {l}: atom.v4 returns the old vector");
    }
}

#[test]
fn a_vector_red_is_one_request_and_must_be_aligned_to_its_size() {
    exec::set_profiling(true);
    let init = "mov.f32 %f1, 0f3F800000;\nmov.u32 %r1, %tid.x;\nsetp.eq.u32 %p1, %r1, 0;\n\
                @%p1 st.global.v4.f32 [%rd0], {%f1, %f1, %f1, %f1};\nbar.sync 0;\n";
    let vector = format!("{init}red.global.add.v4.f32 [%rd0], {{%f1, %f1, %f1, %f1}};\n");
    let (r, s) = launch("", &vector, 32, 2).unwrap_or_else(|f| panic!("{}", f.message));
    assert_eq!([f32_at(&r, 0), f32_at(&r, 3)], [33.0, 33.0], "32 lanes added 1 to each element");
    let c = s.counters;
    assert_eq!((c.atomic_requests, c.atomic_lanes, c.atomic_sectors, c.atomic_bytes), (1, 32, 1, 16));
    // The scalar form: four requests for the same bytes.
    let scalar = format!(
        "{init}red.global.add.f32 [%rd0], %f1;\nred.global.add.f32 [%rd0+4], %f1;\n\
         red.global.add.f32 [%rd0+8], %f1;\nred.global.add.f32 [%rd0+12], %f1;\n"
    );
    let (r2, s2) = launch("", &scalar, 32, 2).unwrap_or_else(|f| panic!("{}", f.message));
    assert_eq!(r2, r, "the scalar adds leave the same values");
    assert_eq!((s2.counters.atomic_requests, s2.counters.atomic_lanes), (4, 128));
    // A 16-byte vector at an 8-byte boundary is misaligned.
    let bad = format!("{init}red.global.add.v4.f32 [%rd0+8], {{%f1, %f1, %f1, %f1}};\n");
    let f = run_with("", &bad, 32, 4).expect_err("a misaligned vector atomic faults");
    assert_eq!(f.code, exec::MISALIGNED_ADDRESS, "{}", f.message);
    // A vector whose last 8 bytes lie past the end of a 24-byte buffer is
    // out of bounds as a whole, as a 16-byte load there would be.
    let past = format!("{init}red.global.add.v4.f32 [%rd0+16], {{%f1, %f1, %f1, %f1}};\n");
    let f = run_with("", &past, 32, 3).expect_err("a vector atomic past the end faults");
    assert_eq!(f.code, exec::ILLEGAL_ADDRESS, "{}", f.message);
}

/// `a` and `b` rounded to bf16 (to nearest, ties to even), `a` in the
/// upper half: what `cvt.rn.bf16x2.f32 d, a, b` leaves in `d`.
fn bf16x2(a: f32, b: f32) -> u32 {
    u32::from(half::bf16::from_f32(a).to_bits()) << 16 | u32::from(half::bf16::from_f32(b).to_bits())
}

#[test]
fn cvt_rn_bf16x2_f32_packs_two_floats_rounded_to_nearest_even() {
    // Ties to even both ways, a tie broken by a low bit, overflow to
    // infinity, a subnormal, negative zero, and a NaN.
    let pairs: [(u32, u32); 4] = [
        (0x3F80_8000, 0x3F81_8000),
        (0x3F80_8001, 0x7F7F_FFFF),
        (0x0001_0000, 0x8000_0000),
        (0xFFC0_0000, 0x4049_0FDB),
    ];
    let mut body = String::new();
    for (k, (a, b)) in pairs.iter().enumerate() {
        body += &format!(
            "mov.b32 %r1, {a};\nmov.b32 %r2, {b};\ncvt.rn.bf16x2.f32 %r3, %r1, %r2;\nst.global.b32 [%rd0+{}], %r3;\n",
            8 * k
        );
    }
    let r = run(&body, pairs.len());
    for (k, &(a, b)) in pairs.iter().enumerate() {
        let got = r[k] as u32;
        let (fa, fb) = (f32::from_bits(a), f32::from_bits(b));
        if fa.is_nan() {
            let hi = half::bf16::from_bits((got >> 16) as u16);
            assert!(hi.is_nan(), "NaN stays NaN: {got:#010x}");
            assert_eq!(got & 0xffff, bf16x2(0.0, fb) & 0xffff, "the lower half of pair {k}");
        } else {
            assert_eq!(got, bf16x2(fa, fb), "pair {k}: {a:#010x}, {b:#010x}");
        }
    }
    assert_eq!(r[0] as u32, 0x3F80_3F82, "1 + 2^-8 ties to 1, 1 + 3 * 2^-8 to 1 + 2^-6");
    assert_eq!(r[1] as u32 >> 16, 0x3F81, "just above the tie rounds up");
    assert_eq!(r[1] as u32 & 0xffff, 0x7F80, "f32's largest rounds to infinity");
    // The scalar conversions round the same way where only the f32's
    // lowest bits break the tie.
    let body = "mov.b32 %r1, 0x3F808001;\ncvt.rn.bf16.f32 %h1, %r1;\nmov.b32 %r2, 0x3F801001;\n\
                cvt.rn.f16.f32 %h2, %r2;\nst.global.b16 [%rd0], %h1;\nst.global.b16 [%rd0+8], %h2;\n";
    let r = run(body, 2);
    assert_eq!(r[0], u64::from(half::bf16::from_f32(f32::from_bits(0x3F80_8001)).to_bits()));
    assert_eq!(r[0], 0x3F81, "bf16: just above the tie rounds up");
    assert_eq!(r[1], u64::from(half::f16::from_f32(f32::from_bits(0x3F80_1001)).to_bits()));
    assert_eq!(r[1], 0x3C01, "f16: just above the tie rounds up");
}

#[test]
fn red_add_noftz_bf16x2_rounds_each_half_once_per_add() {
    // Each lane packs {l * 1.37, -l * 0.731} into bf16x2 and adds it to a
    // shared word (starting at {100, 0.3}) and to a word of its own (each
    // starting at {1, 2^-8}, where adding 2^-8 ties).
    let body = "mov.u32 %r1, %tid.x;\ncvt.rn.f32.u32 %f1, %r1;\nmul.f32 %f2, %f1, 0f3FAF5C29;\n\
                mul.f32 %f3, %f1, 0fBF3B22D1;\ncvt.rn.bf16x2.f32 %r2, %f2, %f3;\n\
                mov.f32 %f4, 0f42C80000;\nmov.f32 %f5, 0f3E99999A;\ncvt.rn.bf16x2.f32 %r3, %f4, %f5;\n\
                setp.eq.u32 %p1, %r1, 0;\n@%p1 st.global.b32 [%rd0], %r3;\nbar.sync 0;\n\
                red.global.add.noftz.bf16x2 [%rd0], %r2;\n\
                mul.wide.u32 %rd1, %r1, 4;\nadd.s64 %rd2, %rd0, %rd1;\nmov.b32 %r4, 0x3F803B80;\n\
                st.global.b32 [%rd2+8], %r4;\nmov.b32 %r5, 0x3B803B80;\n\
                atom.global.add.noftz.bf16x2 %r6, [%rd2+8], %r5;\nst.global.b32 [%rd2+136], %r6;\n";
    let r = run_with("", body, 32, 40).unwrap_or_else(|f| panic!("{}", f.message));
    let word = |k: usize| (r[k / 2] >> (32 * (k % 2))) as u32;
    let add = |x: u16, y: u16| {
        let s = half::bf16::from_bits(x).to_f64() + half::bf16::from_bits(y).to_f64();
        half::bf16::from_f64(s).to_bits()
    };
    let mut acc = bf16x2(100.0, 0.3);
    for l in 0..32 {
        let x = l as f32;
        let v = bf16x2(x * 1.37, x * -0.731);
        acc = u32::from(add((acc >> 16) as u16, (v >> 16) as u16)) << 16 | u32::from(add(acc as u16, v as u16));
    }
    assert_eq!(word(0), acc, "the shared word: 32 bf16x2 adds in lane order");
    for l in 0..32 {
        assert_eq!(word(2 + l), 0x3F80_3C00, "lane {l}: 1 + 2^-8 ties to 1, 2^-8 + 2^-8 = 2^-7");
        assert_eq!(word(34 + l), 0x3F80_3B80, "lane {l}: atom returns the old word");
    }
}

#[test]
fn vector_red_add_noftz_bf16x2_adds_each_word_in_lane_order() {
    // sm_90's `red.global.add.noftz.v4.bf16x2`: 32 lanes add four packed
    // words each to one 16-byte vector (starting at zero), one request of
    // 16 bytes a lane; each word's halves sum in lane order, rounded once
    // an add, as four scalar `red.add.noftz.bf16x2` would.
    let body = "mov.u32 %r1, %tid.x;\ncvt.rn.f32.u32 %f1, %r1;\nmul.f32 %f2, %f1, 0f3FAF5C29;\n\
                mul.f32 %f3, %f1, 0fBF3B22D1;\ncvt.rn.bf16x2.f32 %r2, %f2, %f3;\n\
                mov.f32 %f4, 0f3F000000;\ncvt.rn.bf16x2.f32 %r3, %f1, %f4;\n\
                mul.f32 %f5, %f1, 0fBE800000;\nmov.f32 %f6, 0f40400000;\ncvt.rn.bf16x2.f32 %r4, %f5, %f6;\n\
                mov.f32 %f7, 0f3E000000;\ncvt.rn.bf16x2.f32 %r5, %f7, %f1;\n\
                mov.b32 %r6, 0;\nsetp.eq.u32 %p1, %r1, 0;\n\
                @%p1 st.global.v4.b32 [%rd0], {%r6, %r6, %r6, %r6};\nbar.sync 0;\n\
                red.global.add.noftz.v4.bf16x2 [%rd0], {%r2, %r3, %r4, %r5};\n";
    exec::set_profiling(true);
    let (r, stats) = launch("", body, 32, 2).unwrap_or_else(|f| panic!("{}", f.message));
    let word = |k: usize| (r[k / 2] >> (32 * (k % 2))) as u32;
    let add = |x: u16, y: u16| {
        let s = half::bf16::from_bits(x).to_f64() + half::bf16::from_bits(y).to_f64();
        half::bf16::from_f64(s).to_bits()
    };
    let mut acc = [0u32; 4];
    for l in 0..32 {
        let x = l as f32;
        let v = [bf16x2(x * 1.37, x * -0.731), bf16x2(x, 0.5), bf16x2(x * -0.25, 3.0), bf16x2(0.125, x)];
        for (a, v) in acc.iter_mut().zip(v) {
            *a = u32::from(add((*a >> 16) as u16, (v >> 16) as u16)) << 16 | u32::from(add(*a as u16, v as u16));
        }
    }
    for (k, want) in acc.iter().enumerate() {
        assert_eq!(word(k), *want, "word {k}: 32 packed adds in lane order");
    }
    let c = stats.counters;
    assert_eq!((c.atomic_requests, c.atomic_lanes, c.atomic_bytes), (1, 32, 16), "one 16-byte request a lane");
}
