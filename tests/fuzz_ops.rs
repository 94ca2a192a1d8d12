//! The fuzz generator of `fuzz/fuzz_targets/ops.rs` on the stable
//! toolchain: proptest draws the bytes `arbitrary` builds a program from,
//! a few hundred cases per run, and every crash the fuzzer found is kept
//! below as a named case.

use proptest::prelude::*;

#[path = "support/fuzz_checkpoint.rs"]
mod fuzz_checkpoint;
#[path = "support/fuzz_op_structs.rs"]
mod fuzz_op_structs;
#[path = "support/fuzz_program.rs"]
mod fuzz_program;

use fuzz_program as program;

/// The memory counters are process-wide and each case asserts they come
/// back to their baseline, so the cases of this binary run one at a time.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A value of `T` built by `arbitrary` from `bytes`, as the fuzzer builds it.
fn build<'a, T: arbitrary::Arbitrary<'a>>(bytes: &'a [u8]) -> Option<T> {
    T::arbitrary(&mut arbitrary::Unstructured::new(bytes)).ok()
}

fn run(bytes: &[u8]) {
    let _g = lock();
    if let Some(p) = build::<program::Program>(bytes) {
        program::check(&p);
    }
}

fn run_op_struct(bytes: &[u8]) {
    let _g = lock();
    if let Some(c) = build::<fuzz_op_structs::Case>(bytes) {
        fuzz_op_structs::check(&c);
    }
}

fn run_checkpoint(bytes: &[u8]) {
    static BASE: std::sync::OnceLock<(std::path::PathBuf, Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
    let _g = lock();
    let (dir, plain, with_optim) = BASE.get_or_init(|| {
        let dir = fuzz_checkpoint::scratch_dir();
        (dir.clone(), fuzz_checkpoint::valid_bytes(false, &dir), fuzz_checkpoint::valid_bytes(true, &dir))
    });
    if let Some(c) = build::<fuzz_checkpoint::Case>(bytes) {
        fuzz_checkpoint::check(&c, if c.with_optim { with_optim } else { plain }, dir);
    }
}

proptest! {
    // A fixed seed: CI runs the same cases every time; the fuzzer explores.
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(19),
        ..ProptestConfig::default()
    })]
    #[test]
    fn random_programs_agree_eager_and_recorded_and_free_everything(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        run(&bytes);
    }

    #[test]
    fn op_structs_with_arbitrary_fields_and_arities_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        run_op_struct(&bytes);
    }

    #[test]
    fn corrupted_checkpoints_are_errors_that_change_nothing(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        run_checkpoint(&bytes);
    }
}

// ----- crashes the fuzzer found, kept as named cases ----------------------

/// `fuzz/artifacts/checkpoint/crash-0846...`: a header length near
/// `u64::MAX` written over a valid file, then the header text replaced.
/// It overflowed the harness's own arithmetic (the loader returned its
/// error); kept so the edit path stays covered.
#[test]
fn checkpoint_with_a_header_length_near_u64_max() {
    run_checkpoint(&[
        33, 176, 47, 255, 127, 127, 127, 19, 61, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
        255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 158, 173, 33, 36, 255, 255, 255,
        255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 158, 173, 33, 10, 127,
    ]);
}

/// `fuzz/artifacts/ops/crash-6b86...`: erf, a cast to f32, neg, and a
/// label-smoothed cross-entropy, differentiated back to an f64 leaf. The
/// fused f32 kernel and its recorded formulation round differently (1e-7
/// apart), which the harness once compared at f64 tolerance; the gradients
/// are compared only in programs that stay in f64 now.
#[test]
fn f32_cross_entropy_between_f64_leaves_is_compared_at_its_own_precision() {
    run(&[
        168, 42, 168, 116, 116, 168, 116, 177, 116, 0, 81, 68, 68, 68, 229, 81, 68, 68, 135, 0, 15, 7, 21, 210, 255,
        181, 1, 0, 63, 7, 46, 0, 0, 136, 12, 12, 12, 255, 42, 255, 12, 12, 82, 255, 255, 255, 255, 8, 255, 65, 9, 12,
        12,
    ]);
}
