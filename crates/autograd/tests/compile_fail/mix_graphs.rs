// Vars of two different graphs cannot be combined.
use tapir_autograd::Graph;
use tapir_tensor::{BinaryOps, Error, Tensor};

fn main() {
    Graph::scope(|outer| {
        let a = outer.leaf(Tensor::scalar(1.0));
        Graph::scope(|inner| {
            let b = inner.leaf(Tensor::scalar(2.0));
            let _c = a.add(&b)?;
            Ok::<_, Error>(())
        })
    })
    .unwrap();
}
