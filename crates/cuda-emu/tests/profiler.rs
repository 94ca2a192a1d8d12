//! The profiler's counters on real NVRTC output, run through the
//! interpreter directly: exact requests, sectors, unique sectors, bank
//! conflicts and same-address atomics for kernels whose figures can be
//! worked out by hand, the same whatever the number of host threads; and
//! the register counts read from a real sm_90 cubin.

mod common;

use std::ffi::CString;

use tapir_cuda_emu::exec::{self, Class, Counters, Launch};
use tapir_cuda_emu::memory::Memory;
use tapir_cuda_emu::profile::cubin;
use tapir_cuda_emu::ptx::{self, Module};
use tapir_tensor::cuda::{compile_source, DEFAULT_ARCH};

const SRC: &str = r#"
extern "C" __global__ void copy(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
// Each lane reads a float 32 floats (128 bytes) past its neighbour's.
extern "C" __global__ void strided(const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i * 32];
}
extern "C" __global__ void copy4(const float4* x, float4* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i];
}
// A 32 x 32 tile written by rows and read by columns: with a row of 32
// floats every lane of a column read is in one bank; 33 removes that.
template <int W> __device__ void transpose(const float* x, float* y) {
    __shared__ float t[32 * W];
    int r = threadIdx.y, c = threadIdx.x;
    t[r * W + c] = x[r * 32 + c];
    __syncthreads();
    y[r * 32 + c] = t[c * W + r];
}
extern "C" __global__ void transpose32(const float* x, float* y) { transpose<32>(x, y); }
extern "C" __global__ void transpose33(const float* x, float* y) { transpose<33>(x, y); }
extern "C" __global__ void count_all(unsigned* c) { atomicAdd(c, 1u); }
extern "C" __global__ void count_each(unsigned* c) { atomicAdd(c + threadIdx.x, 1u); }
"#;

fn entry(m: &Module, name: &str) -> usize {
    m.funcs.iter().position(|f| f.entry && f.name == name).expect("the kernel exists")
}

fn params(m: &Module, func: usize, args: &[Vec<u8>]) -> Vec<u8> {
    let f = &m.funcs[func];
    let mut out = vec![0u8; f.param_size as usize];
    for (p, a) in f.params.iter().zip(args) {
        out[p.offset as usize..p.offset as usize + a.len()].copy_from_slice(a);
    }
    out
}

struct Rig {
    mem: Memory,
    module: Module,
}

impl Rig {
    fn new(test: &str) -> Option<Rig> {
        if !common::nvrtc_or_skip(test) {
            return None;
        }
        exec::set_profiling(true);
        let src = compile_source("profiler.cu", SRC, DEFAULT_ARCH).expect("the test kernels compile");
        let mem = Memory::new(1 << 26);
        // The kernels read zeroed buffers nothing wrote: the counters are
        // under test here, not initcheck (which CI turns on for every test).
        mem.set_initcheck(false);
        let module = ptx::load(&src, &|g| g.iter().map(|_| mem.alloc(4096).unwrap()).collect()).unwrap();
        Some(Rig { mem, module })
    }

    /// A zeroed buffer of `bytes`, 256-byte aligned.
    fn buf(&self, bytes: u64) -> u64 {
        let a = self.mem.alloc(bytes).unwrap();
        assert_eq!(a % 256, 0, "allocations are aligned");
        a
    }

    fn run(&self, name: &str, grid: u32, block: [u32; 3], args: &[Vec<u8>], workers: usize) -> Counters {
        let func = entry(&self.module, name);
        let p = params(&self.module, func, args);
        let snap = self.mem.snapshot();
        let l = Launch {
            module: &self.module,
            func,
            grid: [grid, 1, 1],
            block,
            dyn_shared: 0,
            params: &p,
            mem: &snap,
            racecheck: true,
            workers,
        };
        exec::run(&l).expect("the launch succeeds").counters
    }
}

fn le<T: Copy>(v: T) -> Vec<u8> {
    // SAFETY: plain-old-data scalars.
    unsafe { std::slice::from_raw_parts((&v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
}

#[test]
fn a_coalesced_copy_reads_and_writes_each_sector_once() {
    let Some(r) = Rig::new("a_coalesced_copy_reads_and_writes_each_sector_once") else { return };
    let n = 4096u64;
    let (x, y) = (r.buf(4 * n), r.buf(4 * n));
    let c = r.run("copy", 16, [256, 1, 1], &[le(x), le(y), le(n as i32)], 1);
    let warps = n / 32;
    assert_eq!((c.load_requests, c.load_sectors, c.load_bytes), (warps, 4 * warps, 4 * n));
    assert_eq!((c.store_requests, c.store_sectors, c.store_bytes), (warps, 4 * warps, 4 * n));
    assert_eq!((c.unique_read_sectors, c.unique_write_sectors), (4 * n / 32, 4 * n / 32));
    assert_eq!(c.max_footprint_sectors, 8 * n / 32);
    // No two blocks share a sector.
    assert_eq!((c.block_unique_read_sectors, c.block_unique_write_sectors), (4 * n / 32, 4 * n / 32));
    assert_eq!(c.sectors_per_request(), 4.0);
    assert_eq!(c.sector_efficiency(), 1.0);
    assert_eq!((c.of(Class::LdGlobal), c.of(Class::StGlobal)), (warps, warps));
    assert_eq!((c.blocks, c.block_threads, c.shared_requests, c.atomic_lanes), (16, 256, 0, 0));
    // The mix accounts for every warp-instruction of the launch.
    assert_eq!(c.mix.iter().sum::<u64>(), c.warp_instructions);
}

#[test]
fn a_strided_read_touches_a_sector_a_lane() {
    let Some(r) = Rig::new("a_strided_read_touches_a_sector_a_lane") else { return };
    let (x, y) = (r.buf(4 * 32 * 64), r.buf(4 * 64));
    let c = r.run("strided", 1, [64, 1, 1], &[le(x), le(y)], 1);
    assert_eq!((c.load_requests, c.load_sectors, c.load_bytes), (2, 64, 256));
    assert_eq!(c.unique_read_sectors, 64);
    // 256 bytes asked for out of 64 sectors: one eighth.
    assert_eq!(c.sector_efficiency(), (256 + 256) as f64 / ((64 + 8) * 32) as f64);
}

#[test]
fn sixteen_byte_vectors_make_sixteen_sectors_a_request() {
    let Some(r) = Rig::new("sixteen_byte_vectors_make_sixteen_sectors_a_request") else { return };
    let (x, y) = (r.buf(16 * 256), r.buf(16 * 256));
    let c = r.run("copy4", 2, [128, 1, 1], &[le(x), le(y)], 1);
    assert_eq!((c.load_requests, c.load_sectors, c.load_bytes), (8, 128, 4096));
    assert_eq!(c.sectors_per_request(), 16.0);
    assert_eq!(c.sector_efficiency(), 1.0);
}

#[test]
fn a_column_read_of_an_unpadded_tile_conflicts_in_every_bank() {
    let Some(r) = Rig::new("a_column_read_of_an_unpadded_tile_conflicts_in_every_bank") else { return };
    let (x, y) = (r.buf(4 * 1024), r.buf(4 * 1024));
    let c32 = r.run("transpose32", 1, [32, 32, 1], &[le(x), le(y)], 1);
    // 32 warps write a row each (1 wavefront) and read a column each (32).
    assert_eq!(c32.shared_requests, 64);
    assert_eq!(c32.shared_wavefronts, 32 + 32 * 32);
    assert_eq!(c32.bank_conflicts(), 32 * 31);
    let c33 = r.run("transpose33", 1, [32, 32, 1], &[le(x), le(y)], 1);
    assert_eq!((c33.shared_wavefronts, c33.bank_conflicts()), (64, 0));
    assert_eq!(c33.barriers, 1);
    assert_eq!((c33.of(Class::LdShared), c33.of(Class::StShared)), (32, 32));
}

#[test]
fn atomics_on_one_address_are_counted_as_the_same_address() {
    let Some(r) = Rig::new("atomics_on_one_address_are_counted_as_the_same_address") else { return };
    let cnt = r.buf(4 * 64);
    let all = r.run("count_all", 2, [64, 1, 1], &[le(cnt)], 1);
    assert_eq!((all.atomic_lanes, all.atomic_same_address, all.of(Class::Atomic)), (128, 124, 4));
    let each = r.run("count_each", 2, [64, 1, 1], &[le(cnt)], 1);
    assert_eq!((each.atomic_lanes, each.atomic_same_address), (128, 0));
    // An atomic's sector is read and written; both blocks touch the same 8
    // sectors: 8 for the launch, 16 summed over blocks.
    assert_eq!((each.unique_read_sectors, each.unique_write_sectors), (8, 8));
    assert_eq!((each.block_unique_read_sectors, each.block_unique_write_sectors), (16, 16));
}

#[test]
fn the_counters_do_not_depend_on_the_host_threads() {
    let Some(r) = Rig::new("the_counters_do_not_depend_on_the_host_threads") else { return };
    let n = 1u64 << 15;
    let (x, y) = (r.buf(4 * n), r.buf(4 * n));
    let one = r.run("copy", 128, [256, 1, 1], &[le(x), le(y), le(n as i32 - 100)], 1);
    let four = r.run("copy", 128, [256, 1, 1], &[le(x), le(y), le(n as i32 - 100)], 4);
    assert_eq!(one, four);
    assert!(one.unique_read_sectors > 0 && one.mix.iter().sum::<u64>() == one.warp_instructions);
}

/// NVRTC's sm_90 cubin of the kernels above: every kernel is found, with
/// a register count a real compiler could give.
#[test]
fn registers_are_read_from_a_real_cubin() {
    use cudarc::nvrtc::{result, sys};
    if !common::nvrtc_or_skip("registers_are_read_from_a_real_cubin") {
        return;
    }
    let src = CString::new(SRC).unwrap();
    let prog = result::create_program(&src, None).unwrap();
    // SAFETY: a program just created, destroyed below.
    unsafe { result::compile_program(prog, &["--gpu-architecture=sm_90"]) }.expect("compiles for sm_90");
    let mut size = 0usize;
    // SAFETY: the program compiled; the buffer holds `size` bytes.
    let bin = unsafe {
        sys::nvrtcGetCUBINSize(prog, &mut size).result().unwrap();
        let mut b = vec![0u8; size];
        sys::nvrtcGetCUBIN(prog, b.as_mut_ptr().cast()).result().unwrap();
        result::destroy_program(prog).unwrap();
        b
    };
    let ks = cubin::kernels(&bin).expect("a cubin of the expected layout");
    for name in ["copy", "strided", "copy4", "transpose32", "transpose33", "count_all", "count_each"] {
        let k = ks.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("{name} in {ks:?}"));
        assert!((4..=64).contains(&k.regs), "{k:?}");
        assert_eq!(k.frame, 0, "{k:?}");
    }
}
