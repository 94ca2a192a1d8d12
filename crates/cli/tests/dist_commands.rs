//! `tapir gpt --dist mpi` and `tapir pinn --dist mpi` on real MPI ranks:
//! two ranks follow one process over the same global batch (gpt: batch B
//! each against 2B; pinn: half the points each against all of them), and a
//! build without MPI refuses `--dist mpi` with the way to get it.
//!
//! The MPI tests need a build with `--features mpi` (Open MPI and libclang
//! installed) and `mpirun` on the PATH; otherwise they say why and pass,
//! unless `TAPIR_REQUIRE_MPI=1`, which makes that a failure (CI's
//! scripts/ci-mpi.sh sets it).

use std::path::Path;
use std::process::Command;

const TAPIR: &str = env!("CARGO_BIN_EXE_tapir");

/// A small run: 6 steps of a one-layer model, no dropout (a rank's dropout
/// masks are its own), no chart.
const RUN: &[&str] =
    &["gpt", "--digits", "1", "--steps", "6", "--d-model", "16", "--layers", "1", "--heads", "2", "--block", "8"];
const TAIL: &[&str] = &["--warmup", "2", "--eval-every", "0", "--no-chart", "--quiet"];

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn losses(path: &Path) -> Vec<f64> {
    json(path)["losses"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Whether this build and machine can run MPI ranks (after saying why
/// not); with TAPIR_REQUIRE_MPI=1 a missing piece is a failure.
fn mpi_or_skip() -> bool {
    let required = std::env::var("TAPIR_REQUIRE_MPI").is_ok_and(|v| v == "1");
    if !cfg!(feature = "mpi") {
        assert!(!required, "TAPIR_REQUIRE_MPI=1 but tapir-cli was built without the `mpi` feature");
        println!("skipped: tapir-cli built without the `mpi` feature (cargo test -p tapir-cli --features mpi)");
        return false;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        assert!(!required, "TAPIR_REQUIRE_MPI=1 but mpirun is not on the PATH");
        println!("skipped: no mpirun on the PATH (apt-get install openmpi-bin libopenmpi-dev)");
        return false;
    }
    true
}

/// `mpirun -np 2 tapir <args>`, as CI can run it (as root, in a container).
fn two_ranks(args: &[&str]) -> std::process::Output {
    Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "-np", "2", TAPIR])
        .args(args)
        // Containers often refuse the cross-memory-attach copy that Open
        // MPI's shared-memory transport tries first.
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .output()
        .unwrap()
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tapir-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn mpi_two_ranks_follow_one_process_with_twice_the_batch() {
    if !mpi_or_skip() {
        return;
    }
    let dir = scratch("gpt-dist");
    let (one, two) = (dir.join("one.json"), dir.join("two.json"));

    let out = Command::new(TAPIR).args(RUN).args(["--batch", "16", "--json"]).arg(&one).args(TAIL).output().unwrap();
    assert!(out.status.success(), "one process: {}", String::from_utf8_lossy(&out.stderr));

    let two_json = two.to_str().unwrap();
    let out = two_ranks(&[RUN, &["--dist", "mpi", "--batch", "8", "--json", two_json], TAIL].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "two ranks: {stderr}");
    // Each rank reports its throughput and its time in the all-reduces
    // (the ranks' lines may come through mpirun interleaved).
    assert_eq!(stderr.matches(" of 2: ").count(), 2, "{stderr}");
    assert_eq!(stderr.matches(" training (").count(), 2, "{stderr}");

    let v = json(&two);
    assert_eq!(v["world"], 2, "{v}");
    assert_eq!(v["rank_tokens_per_s"].as_array().unwrap().len(), 2, "{v}");
    assert!(v["allreduce_s"].as_f64().unwrap() > 0.0, "{v}");

    let (a, b) = (losses(&one), losses(&two));
    assert_eq!(a.len(), 6);
    assert_eq!(a.len(), b.len());
    // The first step's loss is the same global batch under the same
    // weights: the mean of the two halves' means is the mean, to rounding.
    assert!((a[0] - b[0]).abs() <= 1e-6 * a[0].abs(), "step 0: one process {}, two ranks {}", a[0], b[0]);
    // Later steps follow the one-process run. Not to rounding: Adam's first
    // updates are about lr times the sign of each gradient element, so an
    // element near zero whose sign the order of the sums flips moves its
    // weight by a whole step (seen: 2e-4 relative after two steps). A rank
    // that trained on the wrong rows, or gradients summed instead of
    // averaged, is off by far more.
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 2e-3 * x.abs(), "step {step}: one process {x}, two ranks {y}\n{a:?}\n{b:?}");
    }
    assert!(a[5] < a[0] && b[5] < b[0], "both runs learn: {a:?} {b:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Poisson with half the collocation points on each rank: the mean over
/// each half, averaged, is the mean over all, so the two runs agree to
/// rounding through Adam and L-BFGS alike.
#[test]
fn mpi_pinn_two_ranks_with_half_the_points_each_follow_one_process() {
    if !mpi_or_skip() {
        return;
    }
    let dir = scratch("pinn-dist");
    let (plot, curves) = (dir.join("p.png"), dir.join("c.png"));
    let (one, two) = (dir.join("one.json"), dir.join("two.json"));
    let args = |json: &Path| -> Vec<String> {
        let mut v: Vec<String> = [
            "pinn",
            "poisson",
            "--steps",
            "6",
            "--lbfgs",
            "4",
            "--interior",
            "64",
            "--boundary",
            "32",
            "--hidden",
            "8,8",
            "--eval-every",
            "1000",
            "--quiet",
        ]
        .map(String::from)
        .to_vec();
        for (flag, path) in [("--plot", plot.as_path()), ("--curves", curves.as_path()), ("--json", json)] {
            v.push(flag.into());
            v.push(path.display().to_string());
        }
        v
    };
    let out = Command::new(TAPIR).args(args(&one)).output().unwrap();
    assert!(out.status.success(), "one process: {}", String::from_utf8_lossy(&out.stderr));
    let mut on_two = args(&two);
    on_two.extend(["--dist".into(), "mpi".into()]);
    let out = two_ranks(&on_two.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "two ranks: {stderr}");
    assert_eq!(stderr.matches(" of 2: all-reduce").count(), 2, "{stderr}");
    // Rank 0 alone prints the report.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("relative L2 error").count(), 1, "{stdout}");
    let (a, b) = (losses(&one), losses(&two));
    assert_eq!(a.len(), 10, "6 Adam steps and 4 L-BFGS iterations: {a:?}");
    assert_eq!(a.len(), b.len());
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "step {step}: one process {x}, two ranks {y}\n{a:?}\n{b:?}");
    }
    assert!(a[9] < a[0], "the run learns: {a:?}");
    assert_eq!(json(&two)["world"], 2);
    // Shares must be equal for the average of means to be the mean.
    let out = two_ranks(&["pinn", "poisson", "--steps", "1", "--interior", "63", "--dist", "mpi", "--quiet"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("must be multiples of 2"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A text file every position of which counts, so the mean of the ranks'
/// mean losses is the global batch's and two ranks follow one process to
/// rounding (with the sums task a rank's answers may differ in length).
fn text_args(dir: &Path) -> Vec<String> {
    let text = dir.join("text.txt");
    std::fs::write(&text, "the tapir runs on two ranks, the tapir runs on one. ".repeat(8)).unwrap();
    let run = [
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
        "--data",
    ];
    let mut v: Vec<String> = run.map(String::from).to_vec();
    v.push(text.display().to_string());
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * x.abs(), "{what}, step {step}: {x} vs {y}\n{a:?}\n{b:?}");
    }
}

/// A run saved by two ranks resumes in one process (and one saved by one
/// process resumes on two ranks): rank 0's checkpoint holds the parameters
/// and AdamW's moments every rank shares, and each step's global batch is
/// drawn from the seed and the step, so the resumed half follows the
/// uninterrupted run whatever the number of ranks on either side.
#[test]
fn mpi_a_run_saved_on_two_ranks_resumes_on_one_and_back() {
    if !mpi_or_skip() {
        return;
    }
    let dir = scratch("gpt-resume");
    let base = text_args(&dir);
    let path = |name: &str| dir.join(name).display().to_string();
    let one = |extra: &[&str]| {
        let out = Command::new(TAPIR).args(strs(&base)).args(extra).output().unwrap();
        assert!(out.status.success(), "one process {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let two = |extra: &[&str]| {
        let out = two_ranks(&[strs(&base), extra.to_vec()].concat());
        assert!(out.status.success(), "two ranks {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let (whole, ck2, ck1) = (path("whole.json"), path("two.safetensors"), path("one.safetensors"));
    one(&["--batch", "8", "--json", &whole]);
    let whole = losses(Path::new(&whole));
    assert_eq!(whole.len(), 4);

    // Two ranks of batch 4 for two steps, then one process of batch 8.
    let (first, rest) = (path("first2.json"), path("rest1.json"));
    two(&["--dist", "mpi", "--batch", "4", "--save", &ck2, "--stop-after", "2", "--json", &first]);
    one(&["--batch", "8", "--resume", &ck2, "--json", &rest]);
    let got: Vec<f64> = [losses(Path::new(&first)), losses(Path::new(&rest))].concat();
    // Seen: within 1e-7 of the one-process run.
    assert_close(&whole, &got, 1e-5, "saved on 2 ranks, resumed on 1");

    // One process for two steps, then two ranks.
    let (first, rest) = (path("first1.json"), path("rest2.json"));
    one(&["--batch", "8", "--save", &ck1, "--stop-after", "2", "--json", &first]);
    two(&["--dist", "mpi", "--batch", "4", "--resume", &ck1, "--json", &rest]);
    let got: Vec<f64> = [losses(Path::new(&first)), losses(Path::new(&rest))].concat();
    assert_close(&whole, &got, 1e-5, "saved on 1, resumed on 2 ranks");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mpirun -np 2 tapir gpt --dist mpi --device cuda:0`: each rank a process
/// with a device of its own (here each process's emulated device), the
/// gradients reduced on the devices by NCCL (the emulator's stand-in, its
/// ranks in two processes), whose id rank 0 made and sent over MPI; the
/// two follow one process with the whole batch. (No "cuda" in the name:
/// the GPU check's bundle has no mpirun.)
#[test]
fn mpi_ranks_on_devices_reduce_over_nccl_and_follow_one_process() {
    const TEST: &str = "mpi_ranks_on_devices_reduce_over_nccl_and_follow_one_process";
    if !mpi_or_skip() {
        return;
    }
    let dir = scratch("gpt-mpi-nccl");
    let base = text_args(&dir);
    let (one, two) = (dir.join("one.json"), dir.join("two.json"));
    let out = Command::new(TAPIR)
        .args(strs(&base))
        .args(["--device", "cuda:0", "--batch", "8", "--json"])
        .arg(&one)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if tapir_testing::cuda_or_skip(TEST, if out.status.success() { Ok(()) } else { Err(stderr) }).is_none() {
        return;
    }
    let out = two_ranks(
        &[strs(&base), vec!["--dist", "mpi", "--device", "cuda:0", "--batch", "4", "--json", two.to_str().unwrap()]]
            .concat(),
    );
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "two ranks: {stdout}\n{stderr}");
    assert!(stdout.contains("2 over NCCL, its id over MPI"), "{stdout}");
    assert_eq!(stderr.matches(" of 2: ").count(), 2, "{stderr}");
    let (v1, v2) = (json(&one), json(&two));
    assert_eq!(v2["world"], 2, "{v2}");
    assert_eq!(v2["memory_flat"], true, "{v2}");
    let (a, b) = (losses(&one), losses(&two));
    println!("one process, batch 8: {a:?}\ntwo ranks over NCCL, batch 4 each: {b:?}");
    assert_eq!(v1["world"], 1);
    assert_close(&a, &b, 1e-5, "two ranks over NCCL against one process");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tapir allreduce` on two ranks: tapir's all-reduce beside MPI's own
/// call (each checked to give the sum first), one row a size; on the
/// emulated devices, beside NCCL's.
#[test]
fn mpi_allreduce_times_tapir_beside_the_engine() {
    if !mpi_or_skip() {
        return;
    }
    let dir = scratch("allreduce");
    let check = |extra: &[&str], engine: &str| {
        let jpath = dir.join("a.json");
        let mut args = vec!["allreduce", "--dist", "mpi", "--sizes", "4K,64K", "--iters", "3", "--json"];
        let path = jpath.display().to_string();
        args.push(&path);
        args.extend(extra);
        let out = two_ranks(&args);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{extra:?}: {stdout}\n{stderr}");
        assert!(stdout.contains(engine) && stdout.contains("64 KiB"), "{stdout}");
        let v = json(&jpath);
        assert_eq!(v["world"], 2, "{v}");
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{v}");
        for (r, bytes) in rows.iter().zip([4096, 65536]) {
            assert_eq!(r["bytes"], bytes, "{v}");
            assert!(r["tapir_s"].as_f64().unwrap() > 0.0 && r["engine_s"].as_f64().unwrap() > 0.0, "{v}");
        }
    };
    check(&[], "beside MPI_Allreduce");
    // Only where CUDA runs (the emulated device in CI).
    if tapir::tensor::cuda::emulated_selected() {
        check(&["--device", "cuda:0"], "beside NCCL's all-reduce");
    } else {
        println!("the CUDA half skipped: the emulated device is not selected");
    }
    let out = Command::new(TAPIR).args(["allreduce", "--sizes", "3"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("multiple of 4 bytes") && !stderr.contains("panicked"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that fails mid-run (rank 0 cannot write its checkpoint after
/// step 2, while rank 1 goes on to step 3's all-reduce) ends the whole job
/// with its message, at once, instead of leaving rank 1 waiting forever.
#[test]
fn mpi_a_rank_that_fails_mid_run_ends_the_job() {
    if !mpi_or_skip() {
        return;
    }
    let t0 = std::time::Instant::now();
    let bad = "/nonexistent-tapir-dir/x.safetensors";
    let out = two_ranks(&[RUN, &["--dist", "mpi", "--batch", "8", "--save", bad, "--save-every", "2"], TAIL].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("rank 0 of 2 aborting the job") && stderr.contains("nonexistent-tapir-dir"), "{stderr}");
    assert!(t0.elapsed().as_secs_f64() < 30.0, "took {:?}", t0.elapsed());
}

#[test]
fn dist_mpi_without_the_feature_says_how_to_get_it() {
    if cfg!(feature = "mpi") {
        println!("skipped: this build has the `mpi` feature (the MPI test covers --dist mpi)");
        return;
    }
    let out = Command::new(TAPIR).args(RUN).args(["--dist", "mpi"]).args(TAIL).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("built without MPI") && stderr.contains("--features mpi"), "{stderr}");
}
