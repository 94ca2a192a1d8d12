//! Misuse of the nn crate's public API is an error, never a panic: op
//! structs applied with too few inputs, layers bound from another store,
//! optimizers handed gradients that do not fit.

use tapir_nn::{CausalAttention, NormOp};
use tapir_tensor::prelude::*;

fn x23() -> Tensor {
    Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]).expect("test tensor")
}

#[test]
fn nn_op_structs_check_their_input_count() {
    let x = x23();
    let norm = NormOp { eps: 1e-5, rms: false, has_weight: true, has_bias: false };
    match Tensor::apply(norm, &[&x]) {
        Err(Error::InvalidArgument { op: "layer_norm", reason }) => assert!(reason.contains("takes 2 inputs, got 1")),
        other => panic!("expected an arity error, got {other:?}"),
    }
    let attn = CausalAttention { heads: 1, scale: 1.0 };
    match Tensor::apply(attn, &[&x]) {
        Err(Error::InvalidArgument { op, reason }) => {
            assert!(reason.contains("takes 3 inputs, got 1"), "{op}: {reason}")
        }
        other => panic!("expected an arity error, got {other:?}"),
    }
}
