//! `tapir memcheck` at tiny sizes: every scenario's tapir growth is exactly
//! zero, the JSON report has its schema, and the command works without
//! python3 or torch.

use std::sync::Mutex;

use tapir_cli::memcheck::{run, scenarios, Args};

static LOCK: Mutex<()> = Mutex::new(());

#[test]
fn every_scenario_is_flat_at_tiny_sizes() {
    let _s = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for s in scenarios() {
        let m = (s.run)(0.01, 12, tapir::Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        assert_eq!(m.growth(), 0, "{} grew: {:?}", s.name, m.live);
        assert_eq!(m.live.len(), m.peak.len());
        // Beyond warm-up, every boundary is identical once kept values are
        // subtracted: exact, not a slope within a tolerance.
        let net: Vec<i64> = m.live.iter().zip(&m.kept).map(|(l, k)| *l as i64 - *k as i64).collect();
        assert!(net.windows(2).skip(1).all(|w| w[0] == w[1]), "{}: {net:?}", s.name);
    }
}

#[test]
fn report_schema_without_python() {
    let _s = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("tapir-memcheck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = Args {
        iters: 4,
        size: 0.01,
        json: dir.join("r.json"),
        plot: dir.join("r.png"),
        only: vec!["create_graph_cycle".into(), "accumulated_loss".into()],
        no_torch: false,
        python: "python3-that-does-not-exist".into(),
        ..Args::default()
    };
    run(args).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
    assert_eq!(doc["schema"], "tapir-memcheck/1");
    assert!(doc["torch_skipped"].as_str().unwrap().contains("not found"));
    let sc = doc["scenarios"].as_array().unwrap();
    assert_eq!(sc.len(), 2);
    for s in sc {
        assert!(s["name"].is_string());
        assert_eq!(s["tapir"]["growth_bytes"], 0);
        assert_eq!(s["tapir"]["live"].as_array().unwrap().len(), 4);
        assert!(s["tapir"]["peak"].is_array() && s["tapir"]["kept"].is_array());
        assert!(s["torch"].is_null());
        assert!(s["verdict"].as_str().unwrap().starts_with("tapir flat"));
    }
    // A python3 that cannot import torch: the tapir side still runs.
    let no_torch = Args { python: "false".into(), only: vec!["accumulated_loss".into()], ..args_clone(&dir) };
    run(no_torch).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
    assert!(doc["torch_skipped"].as_str().unwrap().contains("cannot import torch"), "{}", doc["torch_skipped"]);
    let png = std::fs::read(dir.join("r.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    assert!(run(Args { only: vec!["no_such".into()], ..args_clone(&dir) }).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

fn args_clone(dir: &std::path::Path) -> Args {
    Args {
        iters: 3,
        size: 0.01,
        json: dir.join("r.json"),
        plot: dir.join("r.png"),
        only: vec![],
        no_torch: false,
        python: "python3".into(),
        ..Args::default()
    }
}

#[test]
fn scale_scenarios_at_tiny_sizes() {
    // attention, checkpoint and amp without PyTorch: each step leaves
    // nothing live, and checkpointing lowers the step's peak; the JSON
    // report carries every row.
    let _s = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("tapir-memcheck-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = Args {
        scenario: vec!["scale".into()],
        t: vec![40],
        head_dim: 8,
        reps: 1,
        gpt_t: 16,
        gpt_batch: 2,
        d_model: 32,
        layers: 2,
        vocab: 13,
        json: dir.join("s.json"),
        no_torch: true,
        ..Args::default()
    };
    run(args).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("s.json")).unwrap()).unwrap();
    assert_eq!(doc["schema"], "tapir-memcheck-scale/1");
    assert!(doc["torch_skipped"].as_str().unwrap().contains("--no-torch"));
    let sc = &doc["scenarios"];
    let att = &sc["attention"]["rows"][0];
    assert_eq!(att["t"], 40);
    assert_eq!(att["tapir"]["live_bytes"], 0);
    assert!(att["tapir"]["peak_bytes"].as_u64().unwrap() > 0);
    for name in ["checkpoint", "amp"] {
        let rows = sc[name]["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{name}");
        for r in rows {
            assert_eq!(r["tapir"]["live_bytes"], 0, "{name} {}: the step leaves nothing live", r["variant"]);
        }
    }
    let peak = |v: &str| {
        sc["checkpoint"]["rows"].as_array().unwrap().iter().find(|r| r["variant"] == v).unwrap()["tapir"]["peak_bytes"]
            .as_u64()
            .unwrap()
    };
    assert!(peak("checkpoint") < peak("plain"), "checkpoint {} vs plain {}", peak("checkpoint"), peak("plain"));
    assert!(run(Args { scenario: vec!["nope".into()], ..Args::default() }).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn context_scenario_finds_a_longer_context_for_fused_attention() {
    // The longest context whose training step fits a budget: the fused
    // attention holds nothing quadratic in T, the composed path its
    // [B, H, T, T] probabilities, so the fused path fits a longer one.
    let _s = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("tapir-memcheck-context-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = Args {
        scenario: vec!["context".into()],
        budget_mib: 1.0,
        context_d_model: 16,
        context_layers: 1,
        heads: 2,
        vocab: 13,
        context_unit: 16,
        json: dir.join("c.json"),
        ..Args::default()
    };
    run(args).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("c.json")).unwrap()).unwrap();
    let paths = &doc["scenarios"]["context"]["paths"];
    let (fused, composed) =
        (paths["fused"]["longest_t"].as_u64().unwrap(), paths["composed"]["longest_t"].as_u64().unwrap());
    println!("1 MiB: fused {fused}, composed {composed}");
    assert!(composed > 0 && fused > composed, "fused {fused}, composed {composed}");
    for p in ["fused", "composed"] {
        let peak = paths[p]["peak_bytes"].as_u64().unwrap();
        assert!(peak > 0 && peak <= 1 << 20, "{p}: {peak}");
        // The next context up was measured and did not fit.
        let t = paths[p]["longest_t"].as_u64().unwrap();
        let next = paths[p]["points"].as_array().unwrap().iter().find(|x| x["t"] == t + 16).expect("next point");
        assert!(next["peak_bytes"].as_u64().is_none_or(|b| b > 1 << 20), "{p}: {next}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--dtype` as the command line gives it.
fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    use clap::Parser;
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }
    Wrap::try_parse_from(std::iter::once("memcheck").chain(args.iter().copied())).map(|w| w.args)
}

#[test]
fn dtype_flag_parses_and_refuses_what_it_cannot_run() {
    use tapir::prelude::DType;
    assert_eq!(parse(&[]).unwrap().dtype, DType::F32);
    assert_eq!(parse(&["--dtype", "bf16"]).unwrap().dtype, DType::BF16);
    assert_eq!(parse(&["--dtype", "F16"]).unwrap().dtype, DType::F16);
    let e = parse(&["--dtype", "f64"]).expect_err("f64 is refused").to_string();
    assert!(e.contains("f32, bf16 or f16"), "{e}");
    // A dtype other than f32 without the attention scenario is an error
    // that says where it applies, not a silently f32 run.
    for scenario in ["leaks", "checkpoint", "amp", "context"] {
        let e = run(Args { scenario: vec![scenario.into()], dtype: DType::BF16, no_torch: true, ..Args::default() })
            .expect_err(scenario)
            .to_string();
        assert!(e.contains("applies to the attention scenario"), "{scenario}: {e}");
    }
}

#[test]
fn attention_scenario_in_bf16_on_the_cpu() {
    // The attention scenario in bf16 without PyTorch: the step leaves
    // nothing live, and the report names the dtype; the composed path runs
    // beside the fused one up to --composed-max-t and holds more.
    let _s = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("tapir-memcheck-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut args = parse(&["--scenario", "attention", "--dtype", "bf16", "--t", "40,64", "--head-dim", "8"]).unwrap();
    args.composed_max_t = 40;
    args.reps = 0;
    args.no_torch = true;
    args.json = dir.join("a.json");
    run(args).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("a.json")).unwrap()).unwrap();
    let att = &doc["scenarios"]["attention"];
    assert_eq!(att["dtype"], "bf16");
    let rows = att["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["tapir"]["live_bytes"], 0, "T={}", r["t"]);
        assert!(r["tapir"]["peak_bytes"].as_u64().unwrap() > 0, "T={}", r["t"]);
    }
    let composed = rows[0]["composed"]["peak_bytes"].as_u64().expect("composed ran at T = 40");
    assert!(composed > rows[0]["tapir"]["peak_bytes"].as_u64().unwrap(), "{}", rows[0]);
    assert!(rows[1]["composed"].is_null(), "T = 64 is past --composed-max-t");
    std::fs::remove_dir_all(&dir).ok();
}
