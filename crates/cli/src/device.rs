//! `--device`: which device a command runs on, and the few helpers the
//! commands need to put their data and parameters there.

use std::str::FromStr;

use tapir::nn::{Activation, Bound, Grads, Jet, Linear, Mlp, ParamStore};
use tapir::prelude::*;

/// What the user asked for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceArg {
    /// The host.
    #[default]
    Cpu,
    /// CUDA device N (`cuda` is `cuda:0`).
    Cuda(usize),
    /// CUDA 0 when one can be used, else the CPU.
    Auto,
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" => Ok(DeviceArg::Cuda(0)),
            "auto" => Ok(DeviceArg::Auto),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceArg::Cuda(n)),
                _ => Err(format!("unknown device `{s}`: expected cpu, cuda, cuda:N or auto")),
            },
        }
    }
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceArg::Auto => f.write_str("auto"),
        }
    }
}

impl DeviceArg {
    /// The device to run on, with a line saying why when `auto` chose.
    /// A CUDA request on a machine without one is an error naming what is
    /// missing, never a fallback: a user who asked for the GPU should not
    /// get CPU figures without noticing.
    pub fn resolve(self) -> anyhow::Result<(Device, Option<String>)> {
        match self {
            DeviceArg::Cpu => Ok((Device::Cpu, None)),
            DeviceArg::Cuda(n) => match Device::cuda(n) {
                Ok(d) => Ok((d, None)),
                Err(e) => Err(anyhow::anyhow!("--device cuda:{n} cannot be used: {e}")),
            },
            DeviceArg::Auto => match Device::cuda(0) {
                Ok(d) => Ok((d, Some(format!("device: auto picked {d} (CUDA is present)")))),
                Err(e) => Ok((Device::Cpu, Some(format!("device: auto picked cpu (no CUDA: {e})")))),
            },
        }
    }

    /// [`DeviceArg::resolve`], printing the choice when `auto` made one.
    pub fn pick(self) -> anyhow::Result<Device> {
        let (d, note) = self.resolve()?;
        if let Some(n) = note {
            println!("{n}");
        }
        Ok(d)
    }
}

/// Moves every parameter of `store` to `device`, in place.
///
/// The nn crate has no way yet to place a store's parameters on a device;
/// this does it through [`ParamStore::set`], one tensor at a time, so the
/// host copy is freed as soon as its device copy exists.
pub fn params_to(store: &mut ParamStore, device: Device) -> Result<()> {
    let ids: Vec<_> = store.ids().collect();
    for id in ids {
        let moved = store.get(id).to_device(device)?;
        store.set(id, moved)?;
    }
    Ok(())
}

/// The device of a store's parameters (the CPU for an empty store).
pub fn params_on(store: &ParamStore) -> Device {
    store.iter().next().map_or(Device::Cpu, |(_, _, t)| t.device())
}

/// Adam (Kingma and Ba, with bias correction) written with tensor
/// operations only, so it runs on whichever device the parameters are on.
///
/// The nn crate's optimizers update host memory in place and do not run on
/// CUDA yet; the commands use this one for CUDA runs until they do. It
/// allocates a fresh moment pair and parameter per step and drops the old
/// ones, so live memory at step boundaries stays the same.
pub struct DeviceAdam {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    t: i32,
    moments: Vec<(Tensor, Tensor)>,
}

impl DeviceAdam {
    /// Adam with PyTorch's default betas (0.9, 0.999) and eps (1e-8).
    pub fn new(lr: f64) -> Self {
        DeviceAdam { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, t: 0, moments: Vec::new() }
    }

    /// AdamW: decoupled weight decay applied to every parameter.
    pub fn adamw(lr: f64, weight_decay: f64) -> Self {
        DeviceAdam { weight_decay, ..Self::new(lr) }
    }

    /// Sets the learning rate for the next steps.
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// One update of every parameter in `store` from `grads`.
    pub fn step(&mut self, store: &mut ParamStore, grads: &Grads) -> Result<()> {
        grads.check_fits(store, "DeviceAdam::step")?;
        if self.moments.is_empty() {
            for (_, _, p) in store.iter() {
                self.moments.push((p.zeros_like()?, p.zeros_like()?));
            }
        }
        self.t += 1;
        let c1 = 1.0 - self.beta1.powi(self.t);
        let c2 = 1.0 - self.beta2.powi(self.t);
        let ids: Vec<_> = store.ids().collect();
        for (k, id) in ids.into_iter().enumerate() {
            let g = grads.get(id);
            let (m, v) = &self.moments[k];
            let m = m.mul_scalar(self.beta1)?.add(&g.mul_scalar(1.0 - self.beta1)?)?;
            let v = v.mul_scalar(self.beta2)?.add(&g.square()?.mul_scalar(1.0 - self.beta2)?)?;
            let update = m.div_scalar(c1)?.div(&v.div_scalar(c2)?.sqrt()?.add_scalar(self.eps)?)?;
            let p = store.get(id);
            let p = if self.weight_decay > 0.0 { p.mul_scalar(1.0 - self.lr * self.weight_decay)? } else { p.clone() };
            store.set(id, p.sub(&update.mul_scalar(self.lr)?)?)?;
            self.moments[k] = (m, v);
        }
        Ok(())
    }
}

/// A tanh MLP's outputs at `x` `[N, in]`, from matmul, add and tanh alone.
///
/// The nn crate's fused affine layers have no CUDA kernels yet; on CUDA the
/// commands run the same network through these composed operations, which
/// do.
pub fn mlp_forward<'g>(net: &Mlp, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
    let mut h = x;
    for (i, l) in net.layers.iter().enumerate() {
        h = affine(l, p, &h)?;
        if i + 1 < net.layers.len() {
            h = hidden_activation(net, &h)?;
        }
    }
    Ok(h)
}

/// `net`'s outputs at `x`: the nn crate's fused layers on the CPU, the
/// composed ones ([`mlp_forward`]) on CUDA.
pub fn forward<'g>(net: &Mlp, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
    match x.device() {
        Device::Cpu => net.forward(p, x),
        Device::Cuda(_) => mlp_forward(net, p, x),
    }
}

/// `net`'s forward-Laplacian jet at `x`: the nn crate's on the CPU, the
/// composed one ([`mlp_jet`]) on CUDA.
pub fn jet<'g>(net: &Mlp, p: &Bound<'g>, x: Var<'g>, dims: &[usize]) -> Result<Jet<'g>> {
    match x.device() {
        Device::Cpu => net.forward_jet(p, x, dims),
        Device::Cuda(_) => mlp_jet(net, p, x, dims),
    }
}

/// `x W^T + b` for one layer.
fn affine<'g>(l: &Linear, p: &Bound<'g>, x: &Var<'g>) -> Result<Var<'g>> {
    let z = x.matmul(&p.var(l.weight)?.t()?)?;
    match l.bias {
        Some(b) => z.add(&p.var(b)?),
        None => Ok(z),
    }
}

fn hidden_activation<'g>(net: &Mlp, z: &Var<'g>) -> Result<Var<'g>> {
    match net.activation {
        Activation::Tanh => z.tanh(),
        Activation::Relu => z.relu(),
        // The commands run tanh and ReLU networks only.
        _ => Err(Error::Unsupported { op: "mlp_forward (activations other than tanh and ReLU)", device: z.device() }),
    }
}

/// The forward-Laplacian jet of a tanh MLP at `x` `[N, d]` (value `[N, out]`,
/// Jacobian `[N, d, out]`, second derivatives summed over `dims`
/// `[N, out]`), from matmul, add, tanh and elementwise products alone; the
/// same quantities as the nn crate's `Mlp::forward_jet`, which has no CUDA
/// kernels yet.
pub fn mlp_jet<'g>(net: &Mlp, p: &Bound<'g>, x: Var<'g>, dims: &[usize]) -> Result<Jet<'g>> {
    let g = p.graph();
    let (n, d) = (x.shape().dims()[0], x.shape().dims()[1]);
    let dtype = x.dtype();
    let device = x.device();
    let eye: Vec<f64> = (0..n * d * d).map(|k| if k % (d * d) % (d + 1) == 0 { 1.0 } else { 0.0 }).collect();
    let mut jac = g.constant(Tensor::from_vec(eye, [n, d, d])?.cast(dtype)?.to_device(device)?);
    let mask: Vec<f64> = (0..d).map(|i| if dims.contains(&i) { 1.0 } else { 0.0 }).collect();
    let mask = g.constant(Tensor::from_vec(mask, [1, d, 1])?.cast(dtype)?.to_device(device)?);
    let mut h = x;
    // The input's second derivatives are zero; None until a layer makes them.
    let mut lap: Option<Var<'g>> = None;
    for (i, l) in net.layers.iter().enumerate() {
        let w_t = p.var(l.weight)?.t()?;
        let (w_in, out) = (w_t.shape().dims()[0], w_t.shape().dims()[1]);
        let z = affine(l, p, &h)?;
        let jz = jac.reshape([n * d, w_in])?.matmul(&w_t)?.reshape([n, d, out])?;
        let lz = lap.map(|v| v.matmul(&w_t)).transpose()?;
        if i + 1 == net.layers.len() {
            let lz = match lz {
                Some(v) => v,
                None => g.constant(Tensor::zeros_on([n, out], dtype, device)?),
            };
            return Ok(Jet { value: z, jacobian: jz, laplacian: lz });
        }
        // tanh' = 1 - a^2 and tanh'' = -2 a tanh', at a = tanh(z).
        if net.activation != Activation::Tanh {
            return Err(Error::Unsupported { op: "mlp_jet (activations other than tanh)", device });
        }
        let a = z.tanh()?;
        let s = a.square()?.rsub_scalar(1.0)?;
        let s2 = a.mul(&s)?.mul_scalar(-2.0)?;
        let curv = jz.square()?.mul(&mask)?.sum(&[1], false)?.mul(&s2)?;
        lap = Some(match lz {
            Some(v) => v.mul(&s)?.add(&curv)?,
            None => curv,
        });
        jac = jz.mul(&s.reshape([n, 1, out])?)?;
        h = a;
    }
    Err(Error::Unsupported { op: "mlp_jet (a network without layers)", device })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_and_rejects_others() {
        assert_eq!("cpu".parse::<DeviceArg>(), Ok(DeviceArg::Cpu));
        assert_eq!("cuda".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(0)));
        assert_eq!("CUDA:3".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(3)));
        assert_eq!("auto".parse::<DeviceArg>(), Ok(DeviceArg::Auto));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let e = bad.parse::<DeviceArg>().unwrap_err();
            assert!(e.contains("cpu, cuda, cuda:N or auto"), "{bad}: {e}");
        }
    }

    #[test]
    fn device_adam_matches_the_nn_crates_adam_on_the_cpu() {
        use tapir::nn::{Adam, Optimizer};
        let mut a = ParamStore::new();
        let id = a.add("w", Tensor::from_vec(vec![0.5f64, -1.0, 2.0], [3]).unwrap()).unwrap();
        let mut b = a.clone();
        let (mut ours, mut theirs) = (DeviceAdam::new(0.1), Adam::new(0.1));
        for step in 0..5 {
            let g = Tensor::from_vec(vec![1.0f64 + step as f64, -0.5, 0.25 * step as f64], [3]).unwrap();
            ours.step(&mut a, &Grads::from_tensors(vec![g.clone()])).unwrap();
            theirs.step(&mut b, &Grads::from_tensors(vec![g])).unwrap();
        }
        let (x, y) = (a.get(id).to_vec_f64(), b.get(id).to_vec_f64());
        for (p, q) in x.iter().zip(&y) {
            assert!((p - q).abs() < 1e-12, "{x:?} vs {y:?}");
        }
    }

    #[test]
    fn the_composed_jet_matches_the_nn_crates() {
        let mut store = ParamStore::new();
        let mut rng = Rng::new(7);
        let net = Mlp::xavier(&mut store, "u", &[2, 5, 4, 1], Activation::Tanh, &mut rng, DType::F64).unwrap();
        let x = Tensor::from_vec(vec![0.1f64, 0.7, -0.4, 0.3, 0.9, -0.8], [3, 2]).unwrap();
        Graph::scope(|g| {
            let p = store.bind(g);
            for dims in [&[0usize, 1][..], &[0]] {
                let a = net.forward_jet(&p, g.constant(x.clone()), dims).unwrap();
                let b = mlp_jet(&net, &p, g.constant(x.clone()), dims).unwrap();
                let c = mlp_forward(&net, &p, g.constant(x.clone())).unwrap();
                for (u, v) in
                    [(&a.value, &b.value), (&a.jacobian, &b.jacobian), (&a.laplacian, &b.laplacian), (&a.value, &c)]
                {
                    let (u, v) = (u.value().unwrap().to_vec_f64(), v.value().unwrap().to_vec_f64());
                    assert_eq!(u.len(), v.len());
                    for (s, t) in u.iter().zip(&v) {
                        assert!((s - t).abs() < 1e-12, "{u:?} vs {v:?}");
                    }
                }
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}
