//! `tapir profile` on the emulated device, and the efficiency table
//! (`tests/efficiency.tsv`): for each case at a small shape, every listed
//! kernel keeps at least its sector efficiency and its sectors a request
//! (16-byte accesses) and moves at most its modeled DRAM bytes. The
//! counters are exact, so the check is deterministic: a change that breaks
//! coalescing, drops vector accesses or adds a pass fails it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use tapir::prelude::*;

/// One line of the table.
struct Row {
    case: String,
    rows: usize,
    cols: usize,
    dtype: String,
    kernel: String,
    min_efficiency: f64,
    max_bytes: f64,
    min_sectors_per_request: f64,
}

fn table() -> Vec<Row> {
    include_str!("efficiency.tsv")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 8, "efficiency.tsv: eight tab-separated fields in `{l}`");
            Row {
                case: f[0].into(),
                rows: f[1].parse().unwrap(),
                cols: f[2].parse().unwrap(),
                dtype: f[3].into(),
                kernel: f[4].into(),
                min_efficiency: f[5].parse().unwrap(),
                max_bytes: f[6].parse().unwrap(),
                min_sectors_per_request: f[7].parse().unwrap(),
            }
        })
        .collect()
}

/// Runs `tapir profile` for a case and returns its JSON profile.
fn profile(case: &str, rows: usize, cols: usize, dtype: &str, dir: &Path) -> serde_json::Value {
    let json = dir.join(format!("{case}-{rows}x{cols}-{dtype}.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_tapir"))
        .args(["profile", "--no-cubins", "--case", case, "--dtype", dtype])
        .args(["--rows", &rows.to_string(), "--cols", &cols.to_string()])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("the tapir binary runs");
    assert!(
        out.status.success(),
        "tapir profile --case {case} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("total modeled time"), "{text}");
    serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
}

fn kernel<'a>(p: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    p["kernels"].as_array()?.iter().find(|k| k["name"] == name)
}

#[tapir_testing::cuda_test]
fn cuda_every_kernel_of_the_efficiency_table_keeps_its_figures() {
    let Some(_) =
        tapir_testing::cuda_or_skip("cuda_every_kernel_of_the_efficiency_table_keeps_its_figures", Device::cuda(0))
    else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tapir-efficiency-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rows = table();
    let mut profiles = BTreeMap::new();
    let mut failures = Vec::new();
    println!("case\trows\tcols\tdtype\tkernel\tsector_efficiency\tdram_bytes\tsectors_per_request\tbank_conflicts");
    for r in &rows {
        let key = (r.case.clone(), r.rows, r.cols, r.dtype.clone());
        let p = profiles.entry(key).or_insert_with(|| profile(&r.case, r.rows, r.cols, &r.dtype, &dir));
        let Some(k) = kernel(p, &r.kernel) else {
            failures.push(format!("{} [{} x {}] {}: no kernel {} ran", r.case, r.rows, r.cols, r.dtype, r.kernel));
            continue;
        };
        let eff = k["sector_efficiency"].as_f64().unwrap();
        let bytes = k["modeled"]["dram_bytes"].as_f64().unwrap();
        let per_request = k["sectors_per_request"].as_f64().unwrap();
        println!(
            "{}\t{}\t{}\t{}\t{}\t{:.4}\t{}\t{:.3}\t{}",
            r.case, r.rows, r.cols, r.dtype, r.kernel, eff, bytes, per_request, k["bank_conflicts"]
        );
        if eff < r.min_efficiency {
            failures.push(format!("{}: sector efficiency {eff:.4} below the table's {}", r.kernel, r.min_efficiency));
        }
        if per_request < r.min_sectors_per_request {
            failures.push(format!(
                "{}: {per_request:.3} sectors a request, below the table's {} (lost vector accesses?)",
                r.kernel, r.min_sectors_per_request
            ));
        }
        if bytes > r.max_bytes {
            failures.push(format!("{}: {bytes} modeled DRAM bytes, above the table's {}", r.kernel, r.max_bytes));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(failures.is_empty(), "efficiency table:\n{}", failures.join("\n"));
}

/// Warp-instructions at most, for kernels whose sectors and bytes the
/// efficiency table already holds but which were issue-bound: the 16-bit
/// kernels that round two floats in one `cvt.rn.bf16x2.f32` and add a pair
/// with one `red.global.add.noftz.bf16x2` (sm_90, what the emulated device
/// reports), and the embedding lookup that copies two rows of 1,024 bf16 a
/// block. Going back to rounding with integer operations, compare-and-swap
/// loops or half-idle blocks leaves the table's figures as they are and
/// fails here. Budgets are the counts of 2026-12-05 plus about 2%; the
/// counts before were 229,312, 97,792, 101,042 and 80,128 (now 208,832,
/// 67,072, 61,558 and 25,600). The last four are the warp-per-row kernels
/// that hold a row in registers (1,024 rows or more of at most 8 KiB;
/// docs/gpu-model.md, "A warp a row"): 234,496, 253,952, 103,424 and
/// 2,222,080 on 2026-12-05, where the block-per-row kernels they replace
/// take 2,198,528, 2,504,704, 1,079,296 and 6,070,272; a change that
/// sends these shapes back to a block a row fails the efficiency table
/// (the kernel's name) and a slower row loop fails here. The 16-bit
/// `index_add_rows` adds a thread's eight columns with sm_90's vector
/// `red.global.add.noftz.v4.bf16x2` since 2026-12-05: 61,126 -> 44,234
/// here (budget 45,200), so going back to a packed word a lane fails.
/// Fewer than 1,024 rows of whole units up to 128 KiB take a block a row
/// held in registers since 2026-12-06 (`softmax_block<U>_*`, docs/gpu-model.md,
/// "Few long rows"): the first row's 208,832 (the block kernel that reads
/// the row twice) -> 44,928, log-softmax's 223,936 -> 44,096.
/// The softmax warp kernels stop at 4 KiB rows (their 16-unit loop set
/// 128 registers, 25% occupancy, for every row): 1,024 x 4,096 bf16 is
/// `softmax_block4_bf16` since then, 2,222,080 -> 2,583,552
/// warp-instructions (the block's two reductions a row; budget 2,635,300),
/// the same 5.50 µs modeled without cubins, and with them at 4,096 rows
/// 20.62 -> 15.98 µs (58 registers, 50%).
/// The random draws (kernels/random.cu) are issue-bound on Philox's
/// integer work: since 2026-12-06 a thread computes its round keys once,
/// takes each three-input xor as one `lop3` and grid-strides over a wave
/// of 1,056 blocks, and the normals take `sincos`. At 1,024 x 4,096 (four
/// Philox blocks a thread) uniform_f32 issued 3,704,320, normal_f32
/// 13,451,264, uniform_bf16 3,818,496, normal_bf16 13,582,336; losing the
/// `lop3` alone adds about 590,000 to each. Since 2026-12-06 (second
/// pass, docs/gpu-model.md, "16-bit uniforms from half-words, normals in
/// f32") the 16-bit uniforms take eight values a block (two a word), the
/// f32, f16 and bf16 normals compute in f32 with one `log1pf` a pair, and
/// the loop keeps its counter and keys in registers: 3,446,528,
/// 10,753,792, 2,152,704 and 10,688,256. Since 2026-12-06 (docs/gpu-model.md,
/// "Normals from tapir's own polynomials") the f32, f16 and bf16 normals
/// take tapir's own FMA polynomials for `-2 ln u1`, `cos` and `sin` in place
/// of libdevice's `log1pf` and `sincospif`, four f32 go out as one float4
/// (no `mov.b32` each) and the aligned loop steps its address and counter:
/// 3,309,056, 6,332,160, 2,179,072 (the loop's longer prologue at about two
/// blocks a thread; 7,166,208 -> 7,094,272 at 4,096 x 4,096) and 6,397,696.
/// Since 2026-12-06 (docs/gpu-model.md, "16-bit normals from the
/// special-function unit") f16 and bf16 normals take `lg2`, `sqrt`, `sin`
/// and `cos` as `.approx` instructions: normal_bf16 3,614,228.
const INSTRUCTION_BUDGETS: [(&str, usize, usize, &str, &str, u64); 13] = [
    ("softmax", 64, 1024, "bf16", "softmax_block4_bf16", 45_900),
    ("log-softmax", 64, 1024, "bf16", "log_softmax_block4_bf16", 45_000),
    ("cast", 64, 1024, "bf16", "cast_f32_bf16", 68_500),
    ("embedding", 64, 1024, "bf16", "index_add_rows_bf16_i64", 45_200),
    ("embedding", 64, 1024, "bf16", "embedding_bf16_i64", 26_200),
    ("softmax", 1024, 256, "bf16", "softmax_warp_bf16", 239_200),
    ("log-softmax", 1024, 256, "bf16", "log_softmax_warp_bf16", 259_000),
    ("sum", 1024, 256, "bf16", "sum_warp_bf16", 105_500),
    ("softmax", 1024, 4096, "bf16", "softmax_block4_bf16", 2_635_300),
    ("random", 1024, 4096, "f32", "uniform_f32", 3_515_000),
    ("random", 1024, 4096, "f32", "normal_f32", 6_459_000),
    ("random", 1024, 4096, "bf16", "uniform_bf16", 2_196_000),
    ("random", 1024, 4096, "bf16", "normal_bf16", 3_687_000),
];

#[tapir_testing::cuda_test]
fn cuda_16_bit_kernels_keep_their_instruction_budgets() {
    let Some(_) = tapir_testing::cuda_or_skip("cuda_16_bit_kernels_keep_their_instruction_budgets", Device::cuda(0))
    else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tapir-budgets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut profiles = BTreeMap::new();
    let mut failures = Vec::new();
    for (case, rows, cols, dtype, name, budget) in INSTRUCTION_BUDGETS {
        let p = profiles.entry((case, rows, cols, dtype)).or_insert_with(|| profile(case, rows, cols, dtype, &dir));
        let Some(k) = kernel(p, name) else {
            failures.push(format!("{case} [{rows} x {cols}] {dtype}: no kernel {name} ran"));
            continue;
        };
        let n = k["warp_instructions"].as_u64().unwrap();
        println!("{case}\t{rows}\t{cols}\t{dtype}\t{name}\t{n}");
        if n > budget {
            failures.push(format!("{name}: {n} warp-instructions, above its budget of {budget}"));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(failures.is_empty(), "instruction budgets:\n{}", failures.join("\n"));
}

/// The summary names each kernel with its modeled figures, and the
/// sparse cross-entropy's forward reads its logits at full sector
/// efficiency with no bank conflicts.
#[tapir_testing::cuda_test]
fn cuda_profile_prints_a_kernel_summary() {
    let Some(_) = tapir_testing::cuda_or_skip("cuda_profile_prints_a_kernel_summary", Device::cuda(0)) else { return };
    let json = std::env::temp_dir().join(format!("tapir-profile-summary-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tapir"))
        .args(["profile", "--case", "add", "--rows", "32", "--cols", "256", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    let names: Vec<&str> = p["kernels"].as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert!(!names.is_empty());
    for n in &names {
        assert!(text.contains(n), "the table names {n}:\n{text}");
    }
    assert!(text.contains("total modeled time") && text.contains("where the time goes"), "{text}");
    // The elementwise sum reads two [32, 256] f32 tensors and writes one: 96 KiB, once each.
    let add = p["kernels"].as_array().unwrap().iter().find(|k| k["name"].as_str().unwrap().starts_with("add")).unwrap();
    assert_eq!(add["modeled"]["dram_bytes"].as_f64().unwrap(), 3.0 * 32.0 * 256.0 * 4.0, "{add}");
    assert_eq!(add["sector_efficiency"].as_f64().unwrap(), 1.0, "{add}");
    // Registers from the sm_90 cubin the command compiled, and an occupancy from them.
    assert!(add["regs"].as_u64().is_some_and(|r| (4..=255).contains(&r)), "{add}");
    let occ = add["occupancy"]["occupancy"].as_f64().unwrap();
    assert!(occ > 0.0 && occ <= 1.0, "{add}");
}
