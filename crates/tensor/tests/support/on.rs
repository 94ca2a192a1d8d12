//! The device a test of this crate runs on ([`On`]): it makes the test's
//! inputs there and checks that results stay there. Each test binary uses
//! some of it, so unused parts are allowed.
#![allow(dead_code)]

use tapir_tensor::prelude::*;
use tapir_tensor::CpuElement;

/// The device a test runs on: it makes the test's inputs there and checks
/// that results stay there.
#[derive(Debug, Clone, Copy)]
pub struct On(pub Device);

impl On {
    /// `t` copied to this device (the same handle when it is there).
    pub fn put(self, t: Tensor) -> Tensor {
        t.to_device(self.0).expect("test tensor to its device")
    }

    pub fn f32s(self, data: &[f64], dims: &[usize]) -> Tensor {
        let t = Tensor::from_vec(data.iter().map(|&v| v as f32).collect::<Vec<f32>>(), dims.to_vec());
        self.put(t.expect("test tensor"))
    }

    pub fn f64s(self, data: &[f64], dims: &[usize]) -> Tensor {
        self.put(Tensor::from_vec(data.to_vec(), dims.to_vec()).expect("test tensor"))
    }

    /// `0, 1, .., n-1` as f32 in `dims`.
    pub fn iota(self, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        self.f32s(&(0..n).map(|i| i as f64).collect::<Vec<_>>(), dims)
    }

    pub fn vec<T: CpuElement>(self, data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        Tensor::from_vec(data, shape)?.to_device(self.0)
    }

    pub fn slice<T: CpuElement>(self, data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        self.vec(data.to_vec(), shape)
    }

    pub fn scalar(self, v: f32) -> Tensor {
        self.put(Tensor::scalar(v))
    }

    pub fn scalar_of(self, v: f64, dtype: DType) -> Tensor {
        self.put(Tensor::scalar_of(v, dtype))
    }

    pub fn zeros(self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Tensor::zeros_on(shape, dtype, self.0)
    }

    pub fn ones(self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Tensor::ones_on(shape, dtype, self.0)
    }

    pub fn full(self, shape: impl Into<Shape>, value: f64, dtype: DType) -> Result<Tensor> {
        Tensor::full_on(shape, value, dtype, self.0)
    }

    /// arange and eye are made on the host, then copied.
    pub fn arange(self, start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        Tensor::arange(start, end, step, dtype)?.to_device(self.0)
    }

    pub fn eye(self, n: usize, dtype: DType) -> Result<Tensor> {
        Tensor::eye(n, dtype)?.to_device(self.0)
    }

    /// Asserts that `got` is on this device, then its shape and values
    /// (absolute + relative tolerance; NaN equals NaN, infinities must match
    /// exactly).
    #[track_caller]
    pub fn check(self, got: &Tensor, dims: &[usize], want: &[f64], tol: f64) {
        assert_eq!(got.device(), self.0, "the result stays on the inputs' device");
        assert_eq!(got.dims(), dims, "shape");
        let g = got.to_vec_f64();
        assert_eq!(g.len(), want.len(), "element count");
        for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
            let ok = if b.is_nan() {
                a.is_nan()
            } else if b.is_infinite() {
                a == b
            } else {
                (a - b).abs() <= tol * (1.0 + b.abs())
            };
            assert!(ok, "element {i}: got {a}, want {b} (all: {g:?})");
        }
    }
}
