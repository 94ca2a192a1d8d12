//! Properties of CUDA's device math library (libdevice, as NVRTC inlines
//! it) that tapir's kernels rely on, checked on the interpreter: the
//! random normals (kernels/random.cu) call `sincos` where they once
//! called `sin` and `cos`, which is only right if the values are the same
//! bits.

mod common;

use tapir_cuda_emu::exec::{self, Launch};
use tapir_cuda_emu::memory::Memory;
use tapir_cuda_emu::ptx;
use tapir_tensor::cuda::{compile_source, DEFAULT_ARCH};

// t = 2 pi u2 as the Box-Muller of random.cu forms it, for u2 = x 2^-32 over
// x spread through the 32-bit range (odd multiplier: a permutation), plus
// the quarter-turn boundaries of the argument reduction and their
// neighbours.
const SRC: &str = r#"
__device__ double angle(unsigned i) {
    unsigned q = i & 1023u;
    if (i < 64u) {
        double b = __dmul_rn(0.7853981633974483, (double)(q >> 3));
        long long bits = __double_as_longlong(b) + (long long)(q & 7u) - 3;
        return __longlong_as_double(bits < 0 ? 0 : bits);
    }
    unsigned x = i * 2654435761u;
    return __dmul_rn(6.283185307179586, __dmul_rn((double)x, 0x1p-32));
}
extern "C" __global__ void separate(double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double t = angle((unsigned)i);
    out[2 * i] = sin(t);
    out[2 * i + 1] = cos(t);
}
extern "C" __global__ void together(double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double s, c;
    sincos(angle((unsigned)i), &s, &c);
    out[2 * i] = s;
    out[2 * i + 1] = c;
}
"#;

#[test]
fn sincos_of_a_double_gives_the_bits_of_sin_and_cos() {
    if !common::nvrtc_or_skip("sincos_of_a_double_gives_the_bits_of_sin_and_cos") {
        return;
    }
    let src = compile_source("libdevice.cu", SRC, DEFAULT_ARCH).expect("the test kernels compile");
    let mem = Memory::new(1 << 24);
    // The tables of the reduction are module globals, copied in from the
    // host as the driver's module loader copies them (which initcheck does
    // not see: it is off here, as in the profiler's tests).
    mem.set_initcheck(false);
    let module = ptx::load(&src, &|globals| {
        globals
            .iter()
            .map(|g| {
                let a = mem.alloc((g.init.len() as u64).max(1)).unwrap();
                if let Some(p) = mem.host_ptr(a, g.init.len() as u64) {
                    // SAFETY: the allocation has room for the initialiser.
                    unsafe { std::ptr::copy_nonoverlapping(g.init.as_ptr(), p, g.init.len()) };
                }
                a
            })
            .collect()
    })
    .unwrap();
    let n: usize = 1 << 16;
    let run = |name: &str| -> Vec<u64> {
        let out = mem.alloc(16 * n as u64).unwrap();
        let func = module.funcs.iter().position(|f| f.entry && f.name == name).expect("the kernel exists");
        let f = &module.funcs[func];
        let mut p = vec![0u8; f.param_size as usize];
        let (o0, o1) = (f.params[0].offset as usize, f.params[1].offset as usize);
        p[o0..o0 + 8].copy_from_slice(&out.to_le_bytes());
        p[o1..o1 + 4].copy_from_slice(&(n as i32).to_le_bytes());
        let snap = mem.snapshot();
        let l = Launch {
            module: &module,
            func,
            grid: [(n / 256) as u32, 1, 1],
            block: [256, 1, 1],
            dyn_shared: 0,
            params: &p,
            mem: &snap,
            racecheck: false,
            workers: 2,
        };
        exec::run(&l).expect("the launch succeeds");
        let ptr = mem.host_ptr(out, 16 * n as u64).unwrap();
        // SAFETY: the buffer holds 2n doubles' bits.
        (0..2 * n).map(|k| unsafe { ptr.cast::<u64>().add(k).read() }).collect()
    };
    let (a, b) = (run("separate"), run("together"));
    let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert_eq!(differ, 0, "sincos differs from sin, cos in {differ} of {} values", 2 * n);
    // The angles are not degenerate: every value is finite and the sines vary.
    assert!(a.iter().all(|&v| f64::from_bits(v).is_finite()));
    assert!(a.chunks(2).map(|p| p[0]).collect::<std::collections::BTreeSet<_>>().len() > n / 2);
}
