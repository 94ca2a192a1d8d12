//! `tapir gpt --devices cuda:0,cuda:1`: one process, one thread and one
//! NCCL communicator per device, following the one-device run with the
//! whole batch. On the emulated device (built with `TAPIR_CUDA=emulated`)
//! the command runs with two emulated devices and the emulator's NCCL
//! stand-in; without a device or NCCL the test says so and passes, unless
//! `TAPIR_REQUIRE_CUDA=1`, which makes that a failure. (No "cuda" in the
//! test's name: the GPU check's bundle takes those, and a lent machine may
//! have one GPU.)

use std::path::Path;
use std::process::Command;

const TAPIR: &str = env!("CARGO_BIN_EXE_tapir");

/// A small run: 4 steps of a one-layer model on a text file (every
/// position of every row counts, so the mean of the ranks' mean losses is
/// the global batch's; with the built-in sums the ranks' answers may
/// differ in length), no dropout, no chart.
const RUN: &[&str] = &[
    "gpt",
    "--steps",
    "4",
    "--d-model",
    "16",
    "--layers",
    "1",
    "--heads",
    "2",
    "--block",
    "8",
    "--warmup",
    "2",
    "--eval-every",
    "0",
    "--no-chart",
    "--quiet",
];

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn losses(v: &serde_json::Value) -> Vec<f64> {
    v["losses"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// `tapir <args>` with two emulated devices (when emulated).
fn tapir(args: &[&str]) -> std::process::Output {
    let mut c = Command::new(TAPIR);
    if tapir::tensor::cuda::emulated_selected() && std::env::var_os("TAPIR_CUDA_EMU_DEVICES").is_none() {
        c.env("TAPIR_CUDA_EMU_DEVICES", "2");
    }
    c.args(args).output().unwrap()
}

#[tapir_testing::cuda_test]
fn gpt_on_two_devices_over_nccl_follows_one_device_with_twice_the_batch() {
    const TEST: &str = "gpt_on_two_devices_over_nccl_follows_one_device_with_twice_the_batch";
    let dir = std::env::temp_dir().join(format!("tapir-gpt-devices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (one, two) = (dir.join("one.json"), dir.join("two.json"));
    let text = dir.join("text.txt");
    std::fs::write(&text, "the tapir runs on two devices, the tapir runs on one. ".repeat(8)).unwrap();
    let data: &[&str] = &["--data", text.to_str().unwrap()];

    let out = tapir(&[RUN, data, &["--device", "cuda:0", "--batch", "8", "--json", one.to_str().unwrap()]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    if tapir_testing::cuda_or_skip(TEST, if out.status.success() { Ok(()) } else { Err(stderr.to_string()) }).is_none()
    {
        return;
    }
    let out =
        tapir(&[RUN, data, &["--devices", "cuda:0,cuda:1", "--batch", "4", "--json", two.to_str().unwrap()]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    if tapir_testing::cuda_or_skip(
        &format!("{TEST} (two devices, NCCL)"),
        if out.status.success() { Ok(()) } else { Err(stderr.to_string()) },
    )
    .is_none()
    {
        return;
    }
    println!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    // Each rank (a thread) reports its throughput and its all-reduce time.
    assert!(stderr.contains("rank 0 of 2: ") && stderr.contains("rank 1 of 2: "), "{stderr}");
    let (v1, v2) = (json(&one), json(&two));
    assert_eq!(v2["world"], 2, "{v2}");
    assert_eq!(v2["rank_tokens_per_s"].as_array().unwrap().len(), 2, "{v2}");
    assert_eq!(v2["memory_flat"], true, "{v2}");
    let (a, b) = (losses(&v1), losses(&v2));
    println!("one device, batch 8: {a:?}\ntwo devices, batch 4 each: {b:?}");
    assert_eq!((a.len(), b.len()), (4, 4));
    // The same global batch each step, every position counted on both
    // sides: the mean of the two halves' means is the mean, and the
    // averaged gradients are the whole batch's, to rounding (seen: within
    // 1e-7 over the 4 steps). A rank on the wrong rows, or gradients summed
    // instead of averaged, is off by far more.
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "step {step}: one device {x}, two devices {y}\n{a:?}\n{b:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A device's rank that fails mid-run (rank 0 cannot write its checkpoint
/// after step 2, while rank 1 goes on to the next all-reduce) ends the
/// process with its message instead of leaving rank 1 waiting for it.
#[tapir_testing::cuda_test]
fn a_device_rank_that_fails_mid_run_ends_the_process() {
    const TEST: &str = "a_device_rank_that_fails_mid_run_ends_the_process";
    let t0 = std::time::Instant::now();
    let bad = "/nonexistent-tapir-dir/x.safetensors";
    let out = tapir(
        &[RUN, &["--digits", "1", "--devices", "cuda:0,cuda:1", "--batch", "4", "--save", bad, "--save-every", "2"]]
            .concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // No abort at all: no devices or no NCCL here (a failure under
    // TAPIR_REQUIRE_CUDA=1, with what the command said).
    if !stderr.contains("aborting") && tapir_testing::cuda_or_skip(TEST, Err::<(), _>(stderr.to_string())).is_none() {
        return;
    }
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("NCCL rank 0 of 2 aborting") && stderr.contains("nonexistent-tapir-dir"), "{stderr}");
    assert!(t0.elapsed().as_secs_f64() < 30.0, "took {:?}", t0.elapsed());
}

/// `tapir pinn --devices cuda:0,cuda:1`: each device's thread takes half
/// the collocation points; the mean over each half, averaged, is the mean
/// over all, so the two follow one device with every point, to rounding.
#[tapir_testing::cuda_test]
fn pinn_on_two_devices_over_nccl_follows_one_device_with_every_point() {
    const TEST: &str = "pinn_on_two_devices_over_nccl_follows_one_device_with_every_point";
    let dir = std::env::temp_dir().join(format!("tapir-pinn-devices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (one, two) = (dir.join("one.json"), dir.join("two.json"));
    let run = |json: &Path, devices: &[&str]| {
        let args = [
            "pinn",
            "poisson",
            "--steps",
            "5",
            "--lbfgs",
            "0",
            "--interior",
            "48",
            "--boundary",
            "24",
            "--hidden",
            "8,8",
            "--eval-every",
            "1000",
            "--quiet",
        ];
        let (plot, curves) = (dir.join("p.png"), dir.join("c.png"));
        let files = ["--plot", plot.to_str().unwrap(), "--curves", curves.to_str().unwrap()];
        tapir(&[&args[..], &files, devices, &["--json", json.to_str().unwrap()]].concat())
    };
    let out = run(&one, &["--device", "cuda:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if tapir_testing::cuda_or_skip(TEST, if out.status.success() { Ok(()) } else { Err(stderr.to_string()) }).is_none()
    {
        return;
    }
    let out = run(&two, &["--devices", "cuda:0,cuda:1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("rank 0 of 2: all-reduce") && stderr.contains("rank 1 of 2: all-reduce"), "{stderr}");
    let (v1, v2) = (json(&one), json(&two));
    assert_eq!(v2["world"], 2, "{v2}");
    let (a, b) = (losses(&v1), losses(&v2));
    assert_eq!((a.len(), b.len()), (5, 5));
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "step {step}: one device {x}, two devices {y}\n{a:?}\n{b:?}");
    }
    assert!(a[4] < a[0], "the run learns: {a:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn devices_takes_cuda_devices_only() {
    let out = Command::new(TAPIR).args(["gpt", "--devices", "cpu,cuda:1", "--steps", "1"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--devices takes CUDA devices"), "{stderr}");
}

/// Without NCCL, `--devices` is an error saying what was looked for (here:
/// the emulator's stand-in at a path that does not exist), not a panic.
#[tapir_testing::cuda_test]
fn devices_without_nccl_say_what_was_tried() {
    if !tapir::tensor::cuda::emulated_selected() {
        println!("devices_without_nccl_say_what_was_tried: skipped, the emulated device is not selected");
        return;
    }
    let out = Command::new(TAPIR)
        .env("TAPIR_CUDA_EMU_DEVICES", "2")
        .env("TAPIR_CUDA_EMU_NCCL_LIB", "/nonexistent/libtapir_cuda_emu_nccl.so")
        .args(["gpt", "--devices", "cuda:0,cuda:1", "--steps", "1", "--no-chart", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no NCCL library") && stderr.contains("/nonexistent/libtapir_cuda_emu_nccl.so"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
