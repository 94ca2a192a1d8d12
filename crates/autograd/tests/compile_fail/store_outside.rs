// A Var cannot be stored in something that outlives its scope.
use tapir_autograd::{Graph, Var};
use tapir_tensor::{Error, Tensor};

fn main() {
    let mut kept: Vec<Var<'_>> = Vec::new();
    Graph::scope(|g| {
        kept.push(g.leaf(Tensor::scalar(1.0)));
        Ok::<_, Error>(())
    })
    .unwrap();
    drop(kept);
}
