//! CPU throughput of tapir-tensor's hot kernels: f32 matmul, large
//! elementwise ops and a row reduction. `benches/torch/tensor_ops.py` runs
//! the same shapes in PyTorch and `scripts/bench-tensor.sh` prints the
//! ratios side by side.
//!
//! Each benchmark's id (`group/parameter`) is the key the runner script
//! matches between the two; throughput is in elements (matmul: 2 n^3
//! floating-point operations, so criterion's "elem/s" reads as FLOP/s).
//!
//! CPU ops are synchronous, so timing a call is timing the work; a CUDA
//! variant must synchronise the device before reading the clock.

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use tapir_tensor::prelude::*;

/// Large buffers on cache lines, as in the `tapir` command.
#[global_allocator]
static ALLOC: tapir_tensor::AlignedAlloc = tapir_tensor::AlignedAlloc;

fn config<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    g
}

fn matmul(c: &mut Criterion) {
    let mut g = config(c, "matmul_f32");
    for n in [256usize, 1024, 2048] {
        let mut rng = Rng::new(n as u64);
        let a = rng.randn([n, n], DType::F32).expect("a");
        let b = rng.randn([n, n], DType::F32).expect("b");
        g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| bench.iter(|| a.matmul(&b).expect("matmul")));
    }
    g.finish();
}

const ELEMS: usize = 1 << 24;

fn elementwise(c: &mut Criterion) {
    let mut rng = Rng::new(1);
    let a = rng.randn([ELEMS], DType::F32).expect("a");
    let b = rng.randn([ELEMS], DType::F32).expect("b");
    let mut g = config(c, "add_f32");
    g.throughput(Throughput::Elements(ELEMS as u64));
    g.bench_function(BenchmarkId::from_parameter("16M"), |bench| bench.iter(|| a.add(&b).expect("add")));
    g.finish();
    let mut g = config(c, "exp_f32");
    g.throughput(Throughput::Elements(ELEMS as u64));
    g.bench_function(BenchmarkId::from_parameter("16M"), |bench| bench.iter(|| a.exp().expect("exp")));
    g.finish();
}

fn reduction(c: &mut Criterion) {
    let x = Rng::new(2).randn([4096, 4096], DType::F32).expect("x");
    let mut g = config(c, "sum_last_axis_f32");
    g.throughput(Throughput::Elements(x.numel() as u64));
    g.bench_function(BenchmarkId::from_parameter("4096x4096"), |bench| {
        bench.iter(|| x.sum(&[-1], false).expect("sum"))
    });
    g.finish();
}

criterion_group!(benches, matmul, elementwise, reduction);
criterion_main!(benches);
