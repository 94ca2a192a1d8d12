//! Every op, in four layers, each importing only those below it:
//!
//! - `op.rs`: what an op is. [`Op`] (a name, an arity, `run` on a
//!   device's backend), [`Derivative`] (its VJP and JVP rules), the
//!   [`Diff`] values rules are written over ([`Tensor`](crate::Tensor), eager, nothing
//!   recorded; [`Traced`], a recording handle, so a rule is itself
//!   differentiated for higher orders), and [`forward`], the one place a
//!   device is chosen.
//! - the op families (`unary.rs`, `binary.rs`, `reduce.rs`, `shape.rs`,
//!   `index.rs`, `matmul.rs`, `softmax.rs`, `cross_entropy/`, `optim.rs`):
//!   each op's struct, its device-free checks and plan, and its
//!   [`Op`] entry, which hands the plan to its family's kernel trait
//!   (`backend/`). A family file imports no device (`cpu/`, `cuda/`), no
//!   method trait and no rule.
//! - `methods/`: the method traits users call ([`UnaryOps`],
//!   [`BinaryOps`], ...), one file per family, shared by [`Tensor`](crate::Tensor) and
//!   tapir-autograd's `Var`.
//! - `rules/`: each family's [`Derivative`], written in those methods,
//!   so a rule may use any family's ops. The autograd crate holds no
//!   per-op code.
//!
//! This file lists the families ([`registry`]) and names what the crate
//! exports.

pub mod binary;
pub mod cross_entropy;
pub mod index;
pub mod matmul;
pub mod methods;
mod op;
pub mod optim;
pub mod reduce;
pub mod rules;
pub mod shape;
pub mod softmax;
pub mod unary;

pub use cross_entropy::{CrossEntropyOptions, Reduction};
pub use methods::binary::add_opt;
pub use methods::{BinaryOps, CrossEntropyOps, IndexOps, MatmulOps, ReduceOps, ShapeOps, SoftmaxOps, UnaryOps};
pub use op::{forward, one, Arity, Derivative, Diff, DynOp, InputGrads, Op, Saved, Tape, Traced};

/// Every op of this crate, each once, family by family: each op file lists
/// its own members (`family()`, and `ALL` for the enums), and names come
/// from the ops themselves, so this cannot drift from them. The
/// gradient-check table is checked against it in both directions, and a
/// unit test that every enum variant is listed.
pub fn registry() -> Vec<Box<dyn DynOp>> {
    [
        unary::family,
        binary::family,
        reduce::family,
        shape::family,
        matmul::family,
        softmax::family,
        index::family,
        cross_entropy::family,
    ]
    .into_iter()
    .flat_map(|family| family())
    .collect()
}

/// The names of the differentiable ops of [`registry`].
pub fn differentiable_ops() -> Vec<&'static str> {
    registry().iter().filter(|op| op.is_differentiable()).map(|op| op.name()).collect()
}

#[cfg(test)]
mod seam_tests {
    //! The backend seam without a GPU: a stand-in device buffer that claims
    //! to live on `cuda:3` (or `cuda:5` for the one test that reads its
    //! counters, which nothing else touches) and
    //! keeps its elements in a host vector, so every path that must not
    //! read a device buffer as host memory is exercised.

    use std::sync::Arc;

    use crate::storage::{CpuBuffer, DeviceBuffer, Storage};
    use crate::{memory_stats, BinaryOps, Device, Error, Layout, ShapeOps, Tensor, UnaryOps};

    const FAKE: Device = Device::Cuda(3);
    const COUNTED: Device = Device::Cuda(5);

    #[derive(Debug)]
    struct FakeBuffer(CpuBuffer, Device);

    impl DeviceBuffer for FakeBuffer {
        fn device(&self) -> Device {
            self.1
        }
        fn dtype(&self) -> crate::DType {
            self.0.dtype()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
        fn to_host(&self) -> crate::Result<CpuBuffer> {
            Ok(self.0.clone())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn on_fake(v: Vec<f32>, shape: &[usize]) -> Tensor {
        on(FAKE, v, shape)
    }

    fn on(device: Device, v: Vec<f32>, shape: &[usize]) -> Tensor {
        let storage = Storage::on_device(Box::new(FakeBuffer(CpuBuffer::F32(v), device)), true);
        Tensor { storage: Arc::new(storage), layout: Layout::contiguous(shape.into()) }
    }

    #[test]
    fn device_storage_is_counted_on_its_device_exactly() {
        let t = on(COUNTED, vec![1.0; 6], &[2, 3]);
        assert_eq!(t.device(), COUNTED);
        let s = memory_stats(COUNTED);
        assert_eq!((s.allocated, s.peak, s.reserved, s.allocations, s.system_allocations), (24, 24, 24, 1, 1));
        let view = t.t().unwrap();
        drop(t);
        assert_eq!(memory_stats(COUNTED).allocated, 24, "a view keeps the storage");
        drop(view);
        // Unallocated; still reserved, as a caching allocator keeps the block.
        let s = memory_stats(COUNTED);
        assert_eq!((s.allocated, s.peak, s.reserved), (0, 24, 24));
    }

    #[test]
    fn mixing_devices_is_a_device_mismatch_naming_the_op_and_both_devices() {
        let (d, c) = (on_fake(vec![1.0, 2.0], &[2]), Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap());
        assert_eq!(c.add(&d).unwrap_err(), Error::DeviceMismatch { op: "add", lhs: Device::Cpu, rhs: FAKE });
        assert_eq!(d.mul(&c).unwrap_err(), Error::DeviceMismatch { op: "mul", lhs: FAKE, rhs: Device::Cpu });
        // An operand the op holds counts too: the mask of `where`.
        let mask = Tensor::from_vec(vec![1.0f32, 0.0], [2]).unwrap();
        assert_eq!(
            d.where_(&mask, &d).unwrap_err(),
            Error::DeviceMismatch { op: "where", lhs: FAKE, rhs: Device::Cpu }
        );
    }

    #[test]
    fn an_op_without_a_kernel_on_the_device_is_unsupported_not_a_panic() {
        let d = on_fake(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]);
        assert_eq!(d.exp().unwrap_err(), Error::Unsupported { op: "exp", device: FAKE });
        assert_eq!(d.add(&d).unwrap_err(), Error::Unsupported { op: "add", device: FAKE });
        // Views need no kernel: they work on any device, and a copy of a
        // strided view is the device's business.
        let v = d.t().unwrap().narrow(0, 1, 1).unwrap();
        assert_eq!(v.device(), FAKE);
        assert_eq!(v.contiguous().unwrap_err(), Error::Unsupported { op: "contiguous", device: FAKE });
        let mut m = d.clone();
        assert!(matches!(m.make_mut::<f32>(), Err(Error::Unsupported { op: "make_mut", .. })));
        assert_eq!(d.as_slice::<f32>(), None);
        assert!(format!("{d:?}").contains("cuda:3"));
    }

    #[test]
    fn values_leave_a_device_through_a_host_copy() {
        let d = on_fake(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        assert_eq!(d.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let col = d.t().unwrap().narrow(0, 2, 1).unwrap();
        assert_eq!(col.to_vec_f64(), vec![3.0, 6.0]);
        let host = col.to_device(Device::Cpu).unwrap();
        assert_eq!(host.device(), Device::Cpu);
        assert_eq!(host.exp().unwrap().to_vec_f32(), vec![3.0f32.exp(), 6.0f32.exp()]);
        assert_eq!(d.narrow(1, 1, 1).unwrap().narrow(0, 1, 1).unwrap().item().unwrap(), 5.0);
        // A CUDA device: a copy where one is present, else an error naming it.
        match host.to_device(Device::Cuda(0)) {
            Ok(t) => assert_eq!((t.device(), t.to_vec_f64()), (Device::Cuda(0), host.to_vec_f64())),
            Err(err) => assert!(matches!(err, Error::DeviceUnavailable { device: Device::Cuda(0), .. }), "{err}"),
        }
    }
}
