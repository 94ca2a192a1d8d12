//! `tapir pinn`: each PDE's residual vanishes at its exact solution, the
//! Burgers reference agrees with an independent quadrature, and a short
//! training run lowers the error with flat memory.

use std::f64::consts::PI;

use tapir::nn::{Activation, Mlp, ParamStore};
use tapir::prelude::*;
use tapir_cli::pinn::{
    burgers_cole_hopf, residual, solution, train, values, worst_points, Args, GaussHermite, Precision, Problem, Search,
};

/// The memory counters are process-wide and tests run in parallel: every
/// test here that makes tensors holds this lock, so the flat-memory check
/// sees only its own run.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn col(v: Vec<f64>) -> Tensor {
    let n = v.len();
    Tensor::from_vec(v, [n, 1]).unwrap()
}

fn max_abs(t: &Tensor) -> f64 {
    t.to_vec_f64().iter().fold(0.0, |m, x| m.max(x.abs()))
}

#[test]
fn poisson_and_heat_residuals_vanish_at_the_exact_solutions() {
    let _s = serial();
    let pts: Vec<(f64, f64)> = (0..50).map(|i| (0.02 * i as f64 + 0.01, (0.37 * i as f64).fract())).collect();
    // Poisson: u = sin(pi x) sin(pi y), Laplacian = -2 pi^2 u, f = 2 pi^2 u.
    let u: Vec<f64> = pts.iter().map(|(x, y)| (PI * x).sin() * (PI * y).sin()).collect();
    let lap = col(u.iter().map(|u| -2.0 * PI * PI * u).collect());
    let f = col(u.iter().map(|u| 2.0 * PI * PI * u).collect());
    let grad = Tensor::zeros([50, 2], DType::F64).expect("alloc"); // unused by Poisson
    let r = residual(Problem::Poisson, &col(u.clone()), &grad, &lap, &f).unwrap();
    assert!(max_abs(&r) < 1e-12);
    // Heat: u = sin(pi x) exp(-alpha pi^2 t), alpha = 0.1.
    let alpha = 0.1;
    let u: Vec<f64> = pts.iter().map(|(x, t)| (PI * x).sin() * (-alpha * PI * PI * t).exp()).collect();
    let g: Vec<f64> = pts
        .iter()
        .zip(&u)
        .flat_map(|((x, t), u)| [PI * (PI * x).cos() * (-alpha * PI * PI * t).exp(), -alpha * PI * PI * u])
        .collect();
    let uxx = col(u.iter().map(|u| -PI * PI * u).collect());
    let r =
        residual(Problem::Heat, &col(u), &Tensor::from_vec(g, [50, 2]).unwrap(), &uxx, &col(vec![0.0; 50])).unwrap();
    assert!(max_abs(&r) < 1e-12);
}

#[test]
fn burgers_reference_satisfies_the_pde_and_matches_a_second_quadrature() {
    let _s = serial();
    let gh = GaussHermite::new(200);
    let nu = 0.01 / PI;
    // An independent quadrature: the trapezoid rule on a wide, fine grid.
    let trapezoid = |x: f64, t: f64| {
        let c = (4.0 * nu * t).sqrt();
        let k = 1.0 / (2.0 * PI * nu);
        let zs: Vec<f64> = (0..=40_000).map(|i| -10.0 + 20.0 * i as f64 / 40_000.0).collect();
        let logs: Vec<f64> = zs.iter().map(|z| -z * z - (PI * (x - c * z)).cos() * k).collect();
        let m = logs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let (mut num, mut den) = (0.0, 0.0);
        for (z, l) in zs.iter().zip(&logs) {
            let e = (l - m).exp();
            num += (PI * (x - c * z)).sin() * e;
            den += e;
        }
        -num / den
    };
    for &(x, t) in &[(0.5, 0.25), (-0.3, 0.5), (0.1, 0.9), (0.8, 0.75)] {
        let a = burgers_cole_hopf(x, t, &gh);
        let b = trapezoid(x, t);
        assert!((a - b).abs() < 1e-6, "({x}, {t}): {a} vs {b}");
    }
    assert!((burgers_cole_hopf(0.3, 0.0, &gh) + (PI * 0.3).sin()).abs() < 1e-15);
    assert!(burgers_cole_hopf(1.0, 0.5, &gh).abs() < 1e-8 && burgers_cole_hopf(-1.0, 0.5, &gh).abs() < 1e-8);
    // u_t + u u_x - nu u_xx ~ 0 by central differences, away from the shock.
    let h = 1e-3;
    for &(x, t) in &[(0.5, 0.3), (-0.6, 0.4), (0.7, 0.2)] {
        let u = |x, t| burgers_cole_hopf(x, t, &gh);
        let ut = (u(x, t + h) - u(x, t - h)) / (2.0 * h);
        let ux = (u(x + h, t) - u(x - h, t)) / (2.0 * h);
        let uxx = (u(x + h, t) - 2.0 * u(x, t) + u(x - h, t)) / (h * h);
        let r = ut + u(x, t) * ux - nu * uxx;
        assert!(r.abs() < 1e-4, "residual {r} at ({x}, {t})");
    }
}

#[test]
fn a_short_poisson_run_lowers_the_error_with_flat_memory() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("tapir-pinn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = Args {
        problem: Problem::Poisson,
        steps: Some(300),
        lbfgs: Some(10),
        lr: 1e-2,
        lr_final: 1e-3,
        hidden: Some(vec![16, 16]),
        interior: Some(256),
        boundary: 64,
        ic_points: 0,
        ic_weight: None,
        adaptive: 0,
        adaptive_rounds: 1,
        adaptive_every: 1000,
        adaptive_candidates: 20_000,
        f64: false,
        lbfgs_precision: None,
        lbfgs_f64_cost: 2.7,
        line_search: None,
        seed: 1,
        eval_every: 1000,
        plot: dir.join("p.png"),
        curves: dir.join("c.png"),
        quiet: true,
        plain: false,
        device: Default::default(),
        dist: Default::default(),
        devices: vec![],
        json: None,
    };
    let o = train(&a).unwrap();
    assert!(o.rel_l2 < 0.5 * o.initial_rel_l2, "error {} -> {}", o.initial_rel_l2, o.rel_l2);
    assert!(o.losses.last().unwrap() < &(o.losses[0] * 0.1), "loss {} -> {}", o.losses[0], o.losses.last().unwrap());
    assert!(o.live.windows(2).skip(1).all(|w| w[0] == w[1]), "live memory moved between steps");
    assert!(std::fs::read(dir.join("p.png")).unwrap().starts_with(b"\x89PNG"));
    std::fs::remove_dir_all(&dir).ok();
}

/// The odd network `(N(x, t) - N(-x, t)) / 2` that burgers trains: its value,
/// gradient and u_xx from one jet over the points and their mirror images
/// equal nested autodiff of the same expression, and it is odd in x.
#[test]
fn odd_network_derivatives_match_nested_autodiff() {
    let _s = serial();
    let mut store = ParamStore::new();
    let net = Mlp::xavier(&mut store, "u", &[2, 8, 8, 1], Activation::Tanh, &mut Rng::new(3), DType::F64).unwrap();
    let pts = Rng::new(4).uniform([5, 2], -1.0, 1.0, DType::F64).unwrap();
    let mirror = Tensor::from_vec(vec![-1.0f64, 1.0], [1, 2]).unwrap();
    Graph::scope(|g| {
        let p = store.bind(g);
        let [u, grad, second] = solution(&net, &p, &pts, &[0], Some(&mirror))?;
        let x = g.leaf(pts.clone());
        let m = g.constant(mirror.clone());
        let nested = net.forward(&p, x)?.sub(&net.forward(&p, x.mul(&m)?)?)?.mul_scalar(0.5)?;
        let close = |a: &Var<'_>, b: &Var<'_>, what: &str| -> Result<()> {
            for (a, b) in a.value()?.to_vec::<f64>()?.iter().zip(b.value()?.to_vec::<f64>()?) {
                assert!((a - b).abs() < 1e-10, "{what}: {a} vs {b}");
            }
            Ok(())
        };
        close(&u, &nested, "value")?;
        close(&grad, &g.point_gradient(nested, x)?, "gradient")?;
        close(&second, &g.second_partials(nested, x, &[0])?, "u_xx")?;
        let at_mirror = values(&net, &p, &pts.mul(&mirror)?, Some(&mirror))?;
        close(&at_mirror.neg()?, &values(&net, &p, &pts, Some(&mirror))?, "odd in x")?;
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// `--lbfgs-precision f64` after an f32 Adam phase: the parameters, points
/// and grid are cast once, live memory is flat within each phase (and the
/// L-BFGS phase, without Adam's moments, holds f64 copies), and L-BFGS
/// keeps lowering the loss from where Adam left it.
#[test]
fn a_burgers_run_switches_to_f64_for_lbfgs_with_flat_memory_in_each_phase() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("tapir-pinn-f64-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = Args {
        problem: Problem::Burgers,
        steps: Some(40),
        lbfgs: Some(30),
        lr: 1e-2,
        lr_final: 1e-3,
        hidden: Some(vec![12, 12]),
        interior: Some(128),
        boundary: 48,
        ic_points: 0,
        ic_weight: Some(1.0),
        adaptive: 0,
        adaptive_rounds: 1,
        adaptive_every: 1000,
        adaptive_candidates: 20_000,
        f64: false,
        lbfgs_precision: Some(Precision::F64),
        lbfgs_f64_cost: 2.7,
        line_search: None,
        seed: 2,
        eval_every: 1000,
        plot: dir.join("p.png"),
        curves: dir.join("c.png"),
        quiet: true,
        plain: false,
        device: Default::default(),
        dist: Default::default(),
        devices: vec![],
        json: None,
    };
    let o = train(&a).unwrap();
    assert_eq!(o.phase_switch, Some(40));
    assert!(o.live_flat(), "live memory moved within a phase: {:?}", o.live);
    let (adam, lbfgs) = (o.live[10], o.live[50]);
    assert_ne!(adam, lbfgs, "the phases hold different dtypes and state, yet the same bytes");
    let adam_end = o.losses[39];
    let end = *o.losses.last().unwrap();
    assert!(end < 0.5 * adam_end, "L-BFGS in f64: loss {adam_end} -> {end}");
    assert!(o.rel_l2 < o.initial_rel_l2, "error {} -> {}", o.initial_rel_l2, o.rel_l2);
    let paper = o.paper_grid_rel_l2.expect("burgers reports the paper's grid");
    assert!(paper.is_finite() && (paper / o.rel_l2 - 1.0).abs() < 1.0, "paper grid {paper} vs {}", o.rel_l2);
    std::fs::remove_dir_all(&dir).ok();
}

fn tiny_burgers() -> Args {
    Args {
        problem: Problem::Burgers,
        steps: Some(30),
        lbfgs: Some(20),
        lr: 1e-2,
        lr_final: 1e-3,
        hidden: Some(vec![8, 8]),
        interior: Some(96),
        boundary: 30,
        ic_points: 0,
        ic_weight: Some(1.0),
        adaptive: 0,
        adaptive_rounds: 1,
        adaptive_every: 1000,
        adaptive_candidates: 20_000,
        f64: false,
        lbfgs_precision: Some(Precision::F32),
        lbfgs_f64_cost: 2.7,
        line_search: None,
        seed: 4,
        eval_every: 1000,
        plot: "".into(),
        curves: "".into(),
        quiet: true,
        plain: false,
        device: Default::default(),
        dist: Default::default(),
        devices: vec![],
        json: None,
    }
}

/// `--ic-points` and `--ic-weight` change the loss (and only where asked:
/// weight 1 and no extra points is the plain run), train with flat memory,
/// and are refused where they mean nothing.
#[test]
fn the_initial_line_flags_change_the_loss_and_are_checked() {
    let _s = serial();
    let plain = train(&tiny_burgers()).unwrap();
    let same = train(&Args { ic_weight: Some(1.0), ic_points: 0, ..tiny_burgers() }).unwrap();
    assert_eq!(plain.losses, same.losses);
    for a in [
        Args { ic_weight: Some(10.0), ..tiny_burgers() },
        Args { ic_points: 24, ..tiny_burgers() },
        Args { ic_points: 24, ic_weight: Some(10.0), lbfgs_precision: Some(Precision::F32ThenF64), ..tiny_burgers() },
    ] {
        let o = train(&a).unwrap();
        assert_ne!(o.losses[0], plain.losses[0], "{} {:?}", a.ic_points, a.ic_weight);
        assert!(o.live_flat(), "live memory moved: {:?}", o.live);
        assert!(o.rel_l2 < o.initial_rel_l2, "error {} -> {}", o.initial_rel_l2, o.rel_l2);
    }
    let refused = [
        Args { problem: Problem::Poisson, ic_points: 4, ..tiny_burgers() },
        Args { problem: Problem::Poisson, ic_weight: Some(2.0), ..tiny_burgers() },
        Args { ic_weight: Some(-1.0), ..tiny_burgers() },
        Args { ic_weight: Some(f64::NAN), ..tiny_burgers() },
        Args { f64: true, lbfgs_precision: Some(Precision::F32ThenF64), ..tiny_burgers() },
    ];
    for a in refused {
        assert!(train(&a).is_err(), "{:?} {} {:?}", a.problem, a.ic_points, a.ic_weight);
    }
}

/// `--adaptive`: the points a round picks are the candidates with the
/// largest residuals, largest first; the rounds come every --adaptive-every
/// L-BFGS iterations, change the losses only from the first, keep memory flat between rounds, and repeat bit for bit.
#[test]
fn adaptive_points_join_where_the_residual_is_largest() {
    let _s = serial();
    let mut store = ParamStore::new();
    let net = Mlp::xavier(&mut store, "u", &[2, 8, 8, 1], Activation::Tanh, &mut Rng::new(3), DType::F64).unwrap();
    let mirror = Tensor::from_vec(vec![-1.0f64, 1.0], [1, 2]).unwrap();
    let pick = |k: usize| {
        let mut rng = Rng::new(9);
        worst_points(Problem::Burgers, &net, &store, Some(&mirror), &mut rng, (k, 300), DType::F64, Device::Cpu)
            .unwrap()
    };
    let (all, some) = (pick(300), pick(40));
    assert_eq!(all.len(), 600);
    assert_eq!(some[..], all[..80], "the 40 worst are the first 40 of the ranking");
    // Recompute each residual independently: the ranking is by |residual|.
    let r = Graph::scope(|g| {
        let p = store.bind(g);
        let pts = Tensor::from_vec(all.clone(), [300, 2])?;
        let [u, grad, second] = solution(&net, &p, &pts, &[0], Some(&mirror))?;
        let zero = g.constant(Tensor::zeros([300, 1], DType::F64)?);
        Ok::<_, Error>(residual(Problem::Burgers, &u, &grad, &second, &zero)?.value()?.to_vec_f64())
    })
    .unwrap();
    assert!(r.windows(2).all(|w| w[0].abs() >= w[1].abs()), "not ranked by |residual|");
    assert!(r[0].abs() > 2.0 * r[299].abs(), "a flat residual would not test the ranking: {} {}", r[0], r[299]);

    let plain = train(&tiny_burgers()).unwrap();
    let a = Args { adaptive: 24, adaptive_candidates: 400, adaptive_rounds: 2, adaptive_every: 5, ..tiny_burgers() };
    let (o, again) = (train(&a).unwrap(), train(&a).unwrap());
    let steps = a.adam_steps();
    assert_eq!(o.point_rounds, [steps + 5, steps + 10]);
    assert_eq!(o.losses[..steps + 5], plain.losses[..steps + 5], "nothing changes before the first round");
    assert_ne!(o.losses[steps + 5], plain.losses[steps + 5], "the new points change the loss");
    assert_eq!(o.losses, again.losses);
    assert!(o.live_flat(), "live memory moved between rounds: {:?}", o.live);
    for bad in [Args { adaptive: 500, adaptive_candidates: 400, ..a.clone() }, Args { adaptive_every: 0, ..a.clone() }]
    {
        assert!(train(&bad).is_err(), "{} of {} every {}", bad.adaptive, bad.adaptive_candidates, bad.adaptive_every);
    }
}

/// `tapir pinn burgers`'s defaults are the schedule that reaches Raissi et
/// al.'s 6.7e-4 (docs/performance.md, "A default that reaches it"): 2,000
/// Adam steps, 3,200 interior points, the initial line weighted 10, a
/// budget of 7,100 f32 L-BFGS iterations, f32 then f64 with an f64
/// iteration counted as 2.7; the other problems keep theirs, and every
/// default gives way to its flag.
#[test]
fn burgers_defaults_to_the_schedule_that_reaches_the_paper() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }
    let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("pinn").chain(args.iter().copied())).unwrap().a;
    let b = parse(&["burgers"]);
    assert_eq!(
        (b.adam_steps(), b.lbfgs_iterations(), b.initial_weight(), b.lbfgs_phase_precision(), b.lbfgs_f64_cost),
        (2_000, 7_100, 10.0, Some(Precision::F32ThenF64), 2.7)
    );
    assert_eq!(b.interior_points(), 3_200);
    // Raissi et al.'s nine tanh layers of 20, and a strong Wolfe search.
    assert_eq!((b.hidden_widths(), b.search()), (vec![20; 9], Search::StrongWolfe));
    for (p, lbfgs) in [("poisson", 2_500), ("heat", 300)] {
        let a = parse(&[p]);
        assert_eq!(
            (a.adam_steps(), a.lbfgs_iterations(), a.initial_weight(), a.lbfgs_phase_precision()),
            (10_000, lbfgs, 1.0, None)
        );
        assert_eq!(a.interior_points(), 2_000);
        assert_eq!((a.hidden_widths(), a.search()), (vec![64; 3], Search::Backtracking));
    }
    // Flags win over the problem's defaults.
    let b = parse(&["burgers", "--hidden", "64,64,64", "--line-search", "backtracking", "--interior", "2000"]);
    assert_eq!((b.hidden_widths(), b.search(), b.interior_points()), (vec![64; 3], Search::Backtracking, 2_000));
    // The old burgers default, by flags.
    let old =
        parse(&["burgers", "--steps", "10000", "--lbfgs", "2000", "--ic-weight", "1", "--lbfgs-precision", "f32"]);
    assert_eq!(
        (old.adam_steps(), old.lbfgs_iterations(), old.initial_weight(), old.lbfgs_phase_precision()),
        (10_000, 2_000, 1.0, Some(Precision::F32))
    );
    // In f64 throughout, L-BFGS stays in f64.
    assert_eq!(parse(&["burgers", "--f64"]).lbfgs_phase_precision(), None);
}

/// With f32-then-f64, --lbfgs is a budget in f32 iterations and each f64
/// iteration after the stall counts as --lbfgs-f64-cost of them: the same
/// run with cost 1 goes on where the cost-2.7 run stops, along the same
/// losses (this tiny net stalls in f32 after 893 iterations).
#[test]
fn the_f64_tail_of_f32_then_f64_is_counted_at_its_cost() {
    let _s = serial();
    let run = |cost: f64| {
        train(&Args {
            hidden: Some(vec![8, 8]),
            interior: Some(48),
            boundary: 24,
            steps: Some(20),
            lbfgs: Some(1050),
            lbfgs_precision: Some(Precision::F32ThenF64),
            lbfgs_f64_cost: cost,
            ic_weight: Some(10.0),
            ..tiny_burgers()
        })
        .unwrap()
    };
    let (dear, cheap) = (run(2.7), run(1.0));
    let switch = dear.phase_switch.expect("the tiny net stalls in f32");
    assert_eq!(cheap.phase_switch, Some(switch));
    let f32_iters = switch - 20;
    let f64_iters = |o: &tapir_cli::pinn::Outcome| o.losses.len() - switch;
    // As many f64 iterations as fit: 960 + 33 x 2.7 <= 1050 < 960 + 34 x 2.7.
    let n = f64_iters(&dear);
    assert!(f32_iters as f64 + n as f64 * 2.7 <= 1050.0, "{f32_iters} + {n} x 2.7");
    assert!(f32_iters as f64 + (n + 1) as f64 * 2.7 > 1050.0, "{f32_iters} + {n} x 2.7");
    assert_eq!(f64_iters(&cheap), 1050 - f32_iters);
    assert_eq!(dear.losses[..], cheap.losses[..dear.losses.len()]);
    for a in [Args { lbfgs_f64_cost: 0.0, ..tiny_burgers() }, Args { lbfgs_f64_cost: f64::NAN, ..tiny_burgers() }] {
        assert!(train(&a).is_err(), "--lbfgs-f64-cost {}", a.lbfgs_f64_cost);
    }
}

/// One binary serves AVX2-only processors with the same results: a short
/// Burgers run (Adam, then L-BFGS in f64; the narrow products, the outer
/// sums, tanh and the reductions all take their AVX2 copies under
/// `TAPIR_CPU_ISA=avx2`) repeats the AVX-512 run's losses and error bit
/// for bit. The gemm crate picks its own kernels, the same in both runs.
#[test]
fn burgers_under_avx2_repeats_the_avx512_bits() {
    use tapir::tensor::cpu::simd::{isa, Isa};
    if isa() < Isa::Avx512 {
        println!("SKIPPED: no AVX-512 here (the processor or TAPIR_CPU_ISA), so both runs would take the same copies");
        return;
    }
    let dir = std::env::temp_dir().join(format!("tapir-pinn-isa-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |isa: &str| -> serde_json::Value {
        let json = dir.join(format!("{isa}.json"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tapir"))
            .args([
                "pinn",
                "burgers",
                "--steps",
                "20",
                "--lbfgs",
                "25",
                "--interior",
                "500",
                "--lbfgs-precision",
                "f64",
            ])
            .args(["--quiet", "--json"])
            .arg(&json)
            .arg("--plot")
            .arg(dir.join(format!("{isa}.png")))
            .arg("--curves")
            .arg(dir.join(format!("{isa}-curves.png")))
            .env("TAPIR_CPU_ISA", isa)
            .output()
            .unwrap();
        assert!(out.status.success(), "{isa}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
    };
    let (wide, narrow) = (run("avx512"), run("avx2"));
    assert!(wide["cpu_kernels"].as_str().unwrap().starts_with("avx512"));
    assert!(narrow["cpu_kernels"].as_str().unwrap().starts_with("avx2"));
    for key in ["rel_l2", "paper_grid_rel_l2", "losses", "lbfgs_evals"] {
        assert!(!wide[key].is_null(), "{key} missing");
        assert_eq!(wide[key], narrow[key], "{key}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
