// A Var cannot be returned from the scope that made it.
use tapir_autograd::Graph;
use tapir_tensor::{Error, Tensor};

fn main() {
    let _escaped = Graph::scope(|g| Ok::<_, Error>(g.leaf(Tensor::scalar(1.0))));
}
