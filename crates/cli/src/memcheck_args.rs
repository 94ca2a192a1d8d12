//! What `tapir memcheck` is asked ([`Args`]) and where its PyTorch mirror
//! is: what the leak patterns (`memcheck.rs`) and the scale scenarios
//! (`memcheck_scale.rs`) share, below both.

use std::path::{Path, PathBuf};

use tapir::prelude::DType;

use crate::device::DeviceArg;

/// Arguments of `tapir memcheck`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Iterations per scenario.
    #[arg(long, default_value_t = 60)]
    pub iters: usize,
    /// Scales every scenario's tensor sizes (1.0 = the defaults).
    #[arg(long, default_value_t = 1.0)]
    pub size: f64,
    /// Where to write the JSON report.
    #[arg(long, default_value = "memcheck.json")]
    pub json: PathBuf,
    /// Where to write the PNG chart of live memory per iteration.
    #[arg(long, default_value = "memcheck.png")]
    pub plot: PathBuf,
    /// Run only these scenarios (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip the PyTorch side even when torch is available.
    #[arg(long)]
    pub no_torch: bool,
    /// The python interpreter for the PyTorch side.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Where to run: cpu, cuda, cuda:N, or auto (CUDA when present, else the
    /// CPU). On CUDA both sides report that device's allocator bytes
    /// (tapir's counters, torch.cuda.max_memory_allocated).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// What to run (comma-separated): `leaks` (the PyTorch leak patterns
    /// above, the default), `attention` (fused causal attention against
    /// PyTorch's eager attention and SDPA), `checkpoint` (a `tapir gpt`
    /// training step with and without activation checkpointing, against
    /// torch.utils.checkpoint), `amp` (that step in f32 and bf16, against
    /// torch.autocast), `context` (the longest context whose step fits
    /// --budget-mib, fused attention against the composed path; tapir
    /// only), or `scale` (attention, checkpoint and amp).
    #[arg(long, value_delimiter = ',', default_value = "leaks")]
    pub scenario: Vec<String>,
    /// attention: sequence lengths (default 1024,2048,4096,8192 on the
    /// CPU, 256 on CUDA, where the emulated device takes minutes past 1024).
    #[arg(long, value_delimiter = ',')]
    pub t: Vec<usize>,
    /// attention: the dtype of q, k, v, the output and the gradients, on
    /// tapir's side and PyTorch's: f32, bf16 or f16 (all three accumulate
    /// in f32). On CUDA devices of compute capability 8.0 and newer (the
    /// emulated device is one) bf16 and f16 run the tensor-core kernels,
    /// which the emulator interprets far faster than the f32 scalar ones.
    /// The other scenarios run in f32 (`amp` compares bf16 itself).
    #[arg(long, default_value = "f32", value_parser = attention_dtype)]
    pub dtype: DType,
    /// attention: batch.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// attention, checkpoint, amp, context: heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// attention: width of each head.
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// attention: PyTorch's eager attention runs up to this T (its
    /// [B, H, T, T] tensors take 1 GiB each at T = 8192, H = 4).
    #[arg(long, default_value_t = 8192)]
    pub eager_max_t: usize,
    /// attention: tapir's composed path (scores from a matmul, the causal
    /// softmax, a matmul: [B, H, T, T] tensors) runs beside the fused op up
    /// to this T (0: never; past it the table gives the floor of its peak).
    #[arg(long, default_value_t = 0)]
    pub composed_max_t: usize,
    /// Timed steps per variant (the median is reported), after one warm-up
    /// step and one measured for bytes; 0: the step measured for bytes
    /// alone (the emulated device, where a long step takes minutes).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// checkpoint, amp, context: vocabulary of the model.
    #[arg(long, default_value_t = 65)]
    pub vocab: usize,
    /// checkpoint, amp: context length.
    #[arg(long, default_value_t = 256)]
    pub gpt_t: usize,
    /// checkpoint, amp: sequences a step.
    #[arg(long, default_value_t = 8)]
    pub gpt_batch: usize,
    /// checkpoint, amp: width of the model.
    #[arg(long, default_value_t = 128)]
    pub d_model: usize,
    /// checkpoint, amp: blocks.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// context: the memory the step must fit in, in MiB, judged by the
    /// step's measured peak (on the emulated device, TAPIR_CUDA_EMU_MEMORY
    /// sets the device's memory; give it room for the caching allocator's
    /// segments, e.g. 4 times the budget).
    #[arg(long, default_value_t = 16.0)]
    pub budget_mib: f64,
    /// context: width of the model.
    #[arg(long, default_value_t = 64)]
    pub context_d_model: usize,
    /// context: blocks.
    #[arg(long, default_value_t = 2)]
    pub context_layers: usize,
    /// context: contexts are multiples of this.
    #[arg(long, default_value_t = 64)]
    pub context_unit: usize,
}

/// `--dtype`: the floating dtypes the attention scenario runs in.
fn attention_dtype(s: &str) -> Result<DType, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        _ => Err(format!("unknown --dtype `{s}`: the attention scenario runs in f32, bf16 or f16")),
    }
}

impl Default for Args {
    fn default() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            args: Args,
        }
        Wrap::parse_from(["memcheck"]).args
    }
}

/// The PyTorch mirror, `benches/torch/memcheck.py`, when it is found.
pub(crate) fn torch_script() -> Option<PathBuf> {
    let candidates = [
        PathBuf::from("benches/torch/memcheck.py"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/torch/memcheck.py"),
    ];
    candidates.into_iter().find(|p| p.exists())
}
