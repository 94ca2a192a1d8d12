//! Every differentiable op through the gradient checker, at orders 1 and 2,
//! in reverse and forward mode; and a check that the table covers every op.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tapir_autograd::{check_grads, CheckOptions, Graph, Var};
use tapir_tensor::prelude::*;

type R<'g> = tapir_tensor::Result<Var<'g>>;

/// Op names seen while the table ran.
static SEEN: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

thread_local! {
    /// The device the running case puts its inputs and constants on: each
    /// test has its own thread, and the CUDA variant of a case sets it.
    static DEVICE: std::cell::Cell<Device> = const { std::cell::Cell::new(Device::Cpu) };
}

/// `x` on the running case's device (the same values on every device).
fn on(x: Tensor) -> Tensor {
    x.to_device(DEVICE.with(|d| d.get())).unwrap()
}

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    on(Tensor::from_vec(v.to_vec(), shape.to_vec()).unwrap())
}

fn rnd(shape: &[usize], seed: u64) -> Tensor {
    on(Rng::new(seed).uniform(shape.to_vec(), -1.0, 1.0, DType::F64).unwrap())
}

fn pos(shape: &[usize], seed: u64) -> Tensor {
    on(Rng::new(seed).uniform(shape.to_vec(), 0.5, 2.0, DType::F64).unwrap())
}

fn check(name: &str, f: &dyn for<'g> Fn(&'g Graph, &[Var<'g>]) -> R<'g>, inputs: &[Tensor]) {
    check_with(name, f, inputs, CheckOptions::default())
}

fn check_with(name: &str, f: &dyn for<'g> Fn(&'g Graph, &[Var<'g>]) -> R<'g>, inputs: &[Tensor], base: CheckOptions) {
    // Record which ops this case exercises, its rules included.
    Graph::scope(|g| {
        let vs: Vec<Var<'_>> = inputs.iter().map(|x| Ok(g.leaf(x.cast(DType::F64)?))).collect::<Result<_>>()?;
        let y = f(g, &vs)?;
        g.grad_graph(y.sum_all()?, &vs)?;
        SEEN.lock().unwrap().extend(g.op_names());
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    for order in [1, 2] {
        let opts = CheckOptions { order, ..base.clone() };
        check_grads(f, inputs, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

// Each case is two tests, `<case>::cpu` and `<case>::cuda` (the same
// inputs, constants and checks, in f64, on CUDA device 0; it says why it
// skips without one, and fails then under TAPIR_REQUIRE_CUDA=1).
macro_rules! case {
    ($name:ident, |$g:ident, $v:ident| $body:expr, $inputs:expr) => {
        tapir_testing::test_device! {
            fn $name(device: Device) {
                DEVICE.with(|d| d.set(device));
                check(&format!("{} on {device}", stringify!($name)), &|$g, $v| $body, &$inputs);
            }
        }
    };
}

// ----- unary -------------------------------------------------------------
case!(neg, |_g, v| v[0].neg()?.mul(&v[0])?.sum_all(), [rnd(&[3, 4], 1)]);
case!(abs, |_g, v| v[0].abs()?.mul(&v[0])?.sum_all(), [rnd(&[3, 4], 2)]);
case!(exp, |_g, v| v[0].exp(), [rnd(&[3, 4], 3)]);
case!(log, |_g, v| v[0].log(), [pos(&[3, 4], 4)]);
case!(sqrt, |_g, v| v[0].sqrt(), [pos(&[5], 5)]);
case!(rsqrt, |_g, v| v[0].rsqrt(), [pos(&[5], 6)]);
case!(tanh, |_g, v| v[0].tanh(), [rnd(&[2, 3], 7)]);
case!(tanh_backward, |_g, v| v[0].tanh()?.tanh_backward(&v[1]), [rnd(&[2, 3], 71), rnd(&[2, 3], 72)]);
case!(tanh_backward_broadcast, |_g, v| v[0].tanh_backward(&v[1]), [rnd(&[2, 3], 73), rnd(&[3], 74)]);
case!(sigmoid, |_g, v| v[0].sigmoid(), [rnd(&[2, 3], 8)]);
case!(relu, |_g, v| v[0].relu()?.mul(&v[0]), [rnd(&[2, 3], 9)]);
case!(gelu, |_g, v| v[0].gelu(), [rnd(&[2, 3], 10)]);
case!(gelu_tanh, |_g, v| v[0].gelu_tanh(), [rnd(&[2, 3], 11)]);
case!(sin, |_g, v| v[0].sin(), [rnd(&[4], 12)]);
case!(cos, |_g, v| v[0].cos(), [rnd(&[4], 13)]);
case!(square, |_g, v| v[0].square(), [rnd(&[4], 14)]);
case!(powf, |_g, v| v[0].powf(2.5), [pos(&[4], 15)]);
case!(recip, |_g, v| v[0].recip(), [pos(&[4], 16)]);
case!(add_scalar, |_g, v| v[0].add_scalar(1.5)?.square(), [rnd(&[4], 17)]);
case!(mul_scalar, |_g, v| v[0].mul_scalar(-2.0)?.square(), [rnd(&[4], 18)]);
case!(clamp, |_g, v| v[0].clamp(-0.5, 0.5)?.mul(&v[0]), [rnd(&[3, 3], 19)]);
case!(erf, |_g, v| v[0].erf(), [rnd(&[4], 20)]);

// ----- binary, with broadcasting -------------------------------------------
case!(add, |_g, v| v[0].add(&v[1])?.square(), [rnd(&[2, 3], 21), rnd(&[3], 22)]);
case!(sub, |_g, v| v[0].sub(&v[1])?.square(), [rnd(&[2, 1], 23), rnd(&[1, 3], 24)]);
case!(mul, |_g, v| v[0].mul(&v[1]), [rnd(&[2, 3], 25), rnd(&[2, 3], 26)]);
case!(div, |_g, v| v[0].div(&v[1]), [rnd(&[2, 3], 27), pos(&[3], 28)]);
case!(pow, |_g, v| v[0].pow(&v[1]), [pos(&[2, 3], 29), rnd(&[2, 3], 30)]);
case!(maximum, |_g, v| v[0].maximum(&v[1])?.square(), [rnd(&[3, 3], 31), rnd(&[3], 32)]);
case!(minimum, |_g, v| v[0].minimum(&v[1])?.square(), [rnd(&[3, 3], 33), rnd(&[3, 1], 34)]);
case!(where_, |_g, v| v[0].where_(&t(&[1., 0., 1.], &[3]), &v[1])?.square(), [rnd(&[2, 3], 35), rnd(&[2, 3], 36)]);

// ----- reductions ------------------------------------------------------------
case!(sum, |_g, v| v[0].sum(&[0, 2], true)?.square(), [rnd(&[2, 3, 4], 37)]);
case!(mean, |_g, v| v[0].mean(&[1], false)?.square(), [rnd(&[2, 3, 4], 38)]);
case!(max, |_g, v| v[0].max(&[1], false)?.square(), [rnd(&[3, 4], 39)]);
case!(min, |_g, v| v[0].min(&[0], true)?.square(), [rnd(&[3, 4], 40)]);
case!(logsumexp, |_g, v| v[0].logsumexp(&[-1], false), [rnd(&[3, 4], 41)]);
case!(sum_to, |_g, v| v[0].sum_to([1, 4])?.square(), [rnd(&[3, 4], 42)]);

// ----- layout ---------------------------------------------------------------
case!(reshape, |_g, v| v[0].reshape([6, 2])?.square()?.matmul(&v[1]), [rnd(&[3, 4], 43), rnd(&[2], 44)]);
case!(permute, |_g, v| v[0].permute(&[2, 0, 1])?.square(), [rnd(&[2, 3, 4], 45)]);
case!(narrow, |_g, v| v[0].narrow(1, 1, 2)?.square(), [rnd(&[3, 4], 46)]);
case!(broadcast_to, |_g, v| v[0].broadcast_to([3, 4])?.square()?.mul(&v[1]), [rnd(&[4], 47), rnd(&[3, 4], 48)]);
case!(contiguous, |_g, v| v[0].t()?.contiguous_()?.square(), [rnd(&[3, 4], 49)]);
case!(concat, |_g, v| Var::concat(&[&v[0], &v[1]], 0)?.square(), [rnd(&[2, 3], 50), rnd(&[1, 3], 51)]);
case!(stack, |_g, v| Var::stack(&[&v[0], &v[1]], 1)?.square(), [rnd(&[2, 3], 52), rnd(&[2, 3], 53)]);
/// A round trip through f32 rounds the function's values to ~1e-7, so the
/// finite differences take a wider step (exact for the quadratic here).
#[test]
fn cast() {
    let opts = CheckOptions { eps: 1e-2, rtol: 1e-3, atol: 1e-5, ..CheckOptions::default() };
    check_with("cast", &|_g, v| v[0].cast(DType::F32)?.cast(DType::F64)?.square(), &[rnd(&[3], 54)], opts);
}

/// Mixed dtypes promote forward, and each gradient comes back in its own
/// input's dtype. The figures are torch's, printed by:
///
/// ```text
/// a = torch.tensor([1.5, -2.0, 3.0], requires_grad=True)
/// b = torch.tensor([[2.0], [0.5]], dtype=torch.float64, requires_grad=True)
/// y = a * b + a / b; print(y.dtype); y.sum().backward(); print(a.grad, b.grad)
/// x = torch.tensor([2.0, 3.0], requires_grad=True); p = torch.tensor([2, 3])
/// z = x ** p; print(z.dtype, z); z.sum().backward(); print(x.grad)
/// ```
///
/// torch.float64; tensor([5., 5., 5.]) tensor([[1.8750], [-7.5000]], dtype=torch.float64);
/// torch.float32 tensor([4., 27.]); tensor([4., 27.])
#[test]
fn mixed_dtypes_give_each_input_its_own_dtype_of_gradient() {
    Graph::scope(|g| {
        let a = g.leaf(Tensor::from_vec(vec![1.5f32, -2.0, 3.0], [3])?);
        let b = g.leaf(Tensor::from_vec(vec![2.0f64, 0.5], [2, 1])?);
        let y = a.mul(&b)?.add(&a.div(&b)?)?;
        assert_eq!(y.dtype(), DType::F64);
        let gs = g.grad(y.sum_all()?, &[a, b])?;
        assert_eq!((gs[0].dtype(), gs[0].to_vec::<f32>()?), (DType::F32, vec![5.0, 5.0, 5.0]));
        assert_eq!((gs[1].dtype(), gs[1].to_vec::<f64>()?), (DType::F64, vec![1.875, -7.5]));
        // An integer exponent: the base's gradient, and none for the integers.
        let x = g.leaf(Tensor::from_vec(vec![2.0f32, 3.0], [2])?);
        let p = g.leaf(Tensor::from_vec(vec![2i64, 3], [2])?);
        let z = x.pow(&p)?;
        assert_eq!((z.dtype(), z.value()?.to_vec::<f32>()?), (DType::F32, vec![4.0, 27.0]));
        let gs = g.grad(z.sum_all()?, &[x, p])?;
        assert_eq!((gs[0].dtype(), gs[0].to_vec::<f32>()?), (DType::F32, vec![4.0, 27.0]));
        assert_eq!((gs[1].dtype(), gs[1].to_vec::<i64>()?), (DType::I64, vec![0, 0]));
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// The checker's inputs are f64; half of each product runs through f32, so
/// both orders of promotion, and their second derivatives, are checked.
/// The f32 round trip needs the cast case's wider step.
#[test]
fn mixed_dtype_gradients_check() {
    let opts = CheckOptions { eps: 1e-2, rtol: 1e-3, atol: 1e-5, ..CheckOptions::default() };
    check_with(
        "mixed_dtypes",
        &|_g, v| {
            let a32 = v[0].cast(DType::F32)?;
            a32.mul(&v[1])?.add(&v[1].cast(DType::F32)?.square()?.div(&v[0])?)?.sub(&a32.maximum(&v[1])?)
        },
        // Fixed inputs rather than draws: `maximum` has a kink where the
        // operands meet and `1 / a` a large third derivative near 0, and
        // f32 central differences (eps 1e-2) are only as good as the
        // distance from both. Every `a` here is 0.3 or more from its `b`
        // (half of them above it, so both branches of `maximum` run) and at
        // least 1, whatever directions the checker draws.
        &[t(&[1.1, 1.9, 1.3, 1.8, 1.05, 1.95], &[2, 3]), t(&[1.5, 1.45, 1.6], &[3])],
        opts,
    );
}

// ----- products and normalisations ---------------------------------------------
case!(matmul, |_g, v| v[0].matmul(&v[1])?.tanh(), [rnd(&[3, 4], 55), rnd(&[4, 2], 56)]);
case!(matmul_batched, |_g, v| v[0].matmul(&v[1])?.tanh(), [rnd(&[2, 3, 4], 57), rnd(&[4, 2], 58)]);
case!(matmul_vec, |_g, v| v[0].matmul(&v[1])?.square(), [rnd(&[3, 4], 59), rnd(&[4], 60)]);
case!(softmax, |_g, v| v[0].softmax(1)?.mul(&v[0]), [rnd(&[3, 4], 61)]);
case!(log_softmax, |_g, v| v[0].log_softmax(0)?.mul(&v[0]), [rnd(&[3, 4], 62)]);

// ----- indexing ------------------------------------------------------------------
fn idx(v: &[i64]) -> Tensor {
    on(Tensor::from_vec(v.to_vec(), [v.len()]).unwrap())
}
case!(index_select, |_g, v| v[0].index_select(0, &idx(&[2, 0, 2]))?.square(), [rnd(&[3, 4], 63)]);
case!(embedding, |_g, v| v[0].embedding(&idx(&[1, 1, 0]))?.tanh(), [rnd(&[2, 3], 64)]);
case!(
    gather,
    |_g, v| v[0].gather(1, &on(Tensor::from_vec(vec![0i64, 2, 1, 1], [2, 2]).unwrap()))?.square(),
    [rnd(&[2, 3], 65)]
);
case!(
    scatter_add,
    |_g, v| v[0].scatter_add(1, &on(Tensor::from_vec(vec![0i64, 2, 1, 1], [2, 2]).unwrap()), &v[1])?.square(),
    [rnd(&[2, 3], 66), rnd(&[2, 2], 67)]
);

case!(softplus, |_g, v| v[0].mul_scalar(3.0)?.softplus(), [rnd(&[3, 4], 75)]);
case!(log1p, |_g, v| v[0].log1p(), [pos(&[3, 4], 76)]);
case!(expm1, |_g, v| v[0].expm1(), [rnd(&[3, 4], 77)]);

// ----- losses ------------------------------------------------------------
case!(
    sparse_cross_entropy,
    |_g, v| v[0].sparse_cross_entropy_with(
        &idx(&[2, 0, -100, 4]),
        tapir_tensor::ops::CrossEntropyOptions { label_smoothing: 0.1, ..Default::default() }
    ),
    [rnd(&[4, 5], 71)]
);
case!(
    linear_cross_entropy,
    |_g, v| v[0].linear_cross_entropy(&v[1], Some(&v[2]), &idx(&[1, 3, 0, 2]), Default::default(), Some(3)),
    [rnd(&[4, 3], 72), rnd(&[5, 3], 73), rnd(&[5], 74)]
);

/// Every differentiable op in tapir-tensor appears in at least one case
/// above (ops reached only as another op's rule count too), and every op
/// the cases ran is in `ops::registry`.
#[test]
fn every_op_has_a_gradient_test() {
    // Run the whole table once more in this test so the check does not
    // depend on test order.
    let all: Vec<fn()> = vec![
        || neg::body(Device::Cpu),
        || abs::body(Device::Cpu),
        || exp::body(Device::Cpu),
        || log::body(Device::Cpu),
        || sqrt::body(Device::Cpu),
        || rsqrt::body(Device::Cpu),
        || tanh::body(Device::Cpu),
        || tanh_backward::body(Device::Cpu),
        || tanh_backward_broadcast::body(Device::Cpu),
        || sigmoid::body(Device::Cpu),
        || relu::body(Device::Cpu),
        || gelu::body(Device::Cpu),
        || gelu_tanh::body(Device::Cpu),
        || sin::body(Device::Cpu),
        || cos::body(Device::Cpu),
        || square::body(Device::Cpu),
        || powf::body(Device::Cpu),
        || recip::body(Device::Cpu),
        || add_scalar::body(Device::Cpu),
        || mul_scalar::body(Device::Cpu),
        || clamp::body(Device::Cpu),
        || erf::body(Device::Cpu),
        || add::body(Device::Cpu),
        || sub::body(Device::Cpu),
        || mul::body(Device::Cpu),
        || div::body(Device::Cpu),
        || pow::body(Device::Cpu),
        || maximum::body(Device::Cpu),
        || minimum::body(Device::Cpu),
        || where_::body(Device::Cpu),
        || sum::body(Device::Cpu),
        || mean::body(Device::Cpu),
        || max::body(Device::Cpu),
        || min::body(Device::Cpu),
        || logsumexp::body(Device::Cpu),
        || sum_to::body(Device::Cpu),
        || reshape::body(Device::Cpu),
        || permute::body(Device::Cpu),
        || narrow::body(Device::Cpu),
        || broadcast_to::body(Device::Cpu),
        || contiguous::body(Device::Cpu),
        || concat::body(Device::Cpu),
        || stack::body(Device::Cpu),
        cast,
        || matmul::body(Device::Cpu),
        || matmul_batched::body(Device::Cpu),
        || matmul_vec::body(Device::Cpu),
        || softmax::body(Device::Cpu),
        || log_softmax::body(Device::Cpu),
        || index_select::body(Device::Cpu),
        || embedding::body(Device::Cpu),
        || gather::body(Device::Cpu),
        || scatter_add::body(Device::Cpu),
        || softplus::body(Device::Cpu),
        || log1p::body(Device::Cpu),
        || expm1::body(Device::Cpu),
        || sparse_cross_entropy::body(Device::Cpu),
        || linear_cross_entropy::body(Device::Cpu),
    ];
    for f in all {
        f();
    }
    let seen = SEEN.lock().unwrap().clone();
    // Every differentiable op of the registry has a case...
    let missing: Vec<&str> =
        tapir_tensor::ops::differentiable_ops().into_iter().filter(|n| !seen.contains(n)).collect();
    assert!(missing.is_empty(), "ops without a gradient-check case: {missing:?}");
    // ...and every op the cases ran is in the registry, so an op its family
    // forgot to list is found here too.
    let registered: BTreeSet<&str> = tapir_tensor::ops::registry().iter().map(|op| op.name()).collect();
    let unlisted: Vec<&str> = seen.iter().copied().filter(|n| !registered.contains(n)).collect();
    assert!(unlisted.is_empty(), "ops missing from their family's list (ops::registry): {unlisted:?}");
}
