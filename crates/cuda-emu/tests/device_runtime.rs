//! What the CUDA runtime provides on the device without a body in PTX:
//! `assert` (`__assertfail`) and `printf` (`vprintf`), compiled from CUDA C
//! by NVRTC and run on the interpreter directly.

mod common;

use tapir_cuda_emu::exec::{self, Launch, ASSERT};
use tapir_cuda_emu::memory::Memory;
use tapir_cuda_emu::ptx::{self, Module};
use tapir_tensor::cuda::{compile_source, DEFAULT_ARCH};

const SRC: &str = r#"
extern "C" __device__ void __assertfail(const char* message, const char* file, unsigned int line,
                                        const char* function, size_t charsize);
#define dev_assert(c) ((c) ? (void)0 : __assertfail(#c, "device_runtime.cu", __LINE__, __func__, 1))

extern "C" __global__ void checked(const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dev_assert(x[i] >= 0.0f);
}

extern "C" __global__ void hello(int k, double v) {
    printf("thread %d of %d: k=%d v=%.3f %s [%5x] [%-4d] %ld%%\n", threadIdx.x, blockDim.x, k, v, "ok", 255, 7,
           -123456789012L);
}
"#;

fn module(test: &str, mem: &Memory) -> Option<Module> {
    if !common::nvrtc_or_skip(test) {
        return None;
    }
    let src = compile_source("device_runtime.cu", SRC, DEFAULT_ARCH).expect("the test kernels compile");
    let m = ptx::load(&src, &|g| {
        g.iter()
            .map(|g| {
                let a = mem.alloc(g.init.len().max(1) as u64).unwrap();
                let p = mem.host_ptr(a, g.init.len() as u64).unwrap();
                // SAFETY: the allocation holds the initialiser.
                unsafe { std::ptr::copy_nonoverlapping(g.init.as_ptr(), p, g.init.len()) };
                a
            })
            .collect()
    })
    .expect("the PTX loads");
    assert!(m.unsupported.is_empty(), "unsupported: {:?}", m.unsupported);
    Some(m)
}

fn params(m: &Module, func: usize, args: &[&[u8]]) -> Vec<u8> {
    let f = &m.funcs[func];
    let mut out = vec![0u8; f.param_size as usize];
    for (p, a) in f.params.iter().zip(args) {
        out[p.offset as usize..p.offset as usize + a.len()].copy_from_slice(a);
    }
    out
}

fn entry(m: &Module, name: &str) -> usize {
    m.funcs.iter().position(|f| f.entry && f.name == name).expect("the kernel exists")
}

#[test]
fn a_failed_device_assert_fails_the_launch_with_its_message() {
    let mem = Memory::new(1 << 24);
    let Some(m) = module("a_failed_device_assert_fails_the_launch_with_its_message", &mem) else { return };
    let x: Vec<u8> = [1.0f32, 2.0, -3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let dx = mem.alloc(16).unwrap();
    // SAFETY: 16 bytes.
    unsafe { std::ptr::copy_nonoverlapping(x.as_ptr(), mem.host_ptr(dx, 16).unwrap(), 16) };
    let func = entry(&m, "checked");
    let snap = mem.snapshot();
    let run = |n: i32| {
        let p = params(&m, func, &[&dx.to_le_bytes(), &n.to_le_bytes()]);
        let l = Launch {
            module: &m,
            func,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dyn_shared: 0,
            params: &p,
            mem: &snap,
            racecheck: true,
            workers: 1,
        };
        exec::run(&l)
    };
    run(2).expect("the first two elements are non-negative");
    let err = run(4).expect_err("x[2] < 0 fails the assertion");
    println!("{}", err.message);
    assert_eq!(err.code, ASSERT);
    assert!(err.message.contains("Assertion `x[i] >= 0.0f` failed"), "{}", err.message);
    assert!(err.message.contains("device_runtime.cu:"), "the file is named: {}", err.message);
    assert!(err.message.contains("checked"), "the function is named: {}", err.message);
    assert!(err.message.contains("thread: [2,0,0]"), "thread 2 failed it: {}", err.message);
}

#[test]
fn device_printf_formats_its_arguments_in_thread_order() {
    let mem = Memory::new(1 << 24);
    let Some(m) = module("device_printf_formats_its_arguments_in_thread_order", &mem) else { return };
    let func = entry(&m, "hello");
    let p = params(&m, func, &[&5i32.to_le_bytes(), &2.5f64.to_le_bytes()]);
    let snap = mem.snapshot();
    let l = Launch {
        module: &m,
        func,
        grid: [1, 1, 1],
        block: [3, 1, 1],
        dyn_shared: 0,
        params: &p,
        mem: &snap,
        racecheck: true,
        workers: 1,
    };
    exec::run(&l).expect("printf runs");
    let lines: Vec<String> = exec::printed().into_iter().filter(|l| l.contains("k=5")).collect();
    let want: Vec<String> =
        (0..3).map(|t| format!("thread {t} of 3: k=5 v=2.500 ok [   ff] [7   ] -123456789012%\n")).collect();
    assert_eq!(lines, want);
}
