//! Checkpoints in the safetensors format: parameters under their own names
//! (so other tools read them as a state dict), optimizer state under
//! `optim.<slot>.<name>` with torch's slot names, and the optimizer's kind
//! and step, plus any caller metadata, in the header's string map.
//!
//! Saving is atomic: the file is written under a temporary name in the same
//! directory, flushed to disk, and renamed over the target (a rename within
//! one file system replaces the old file in one step), then the directory
//! is synced. A crash at any point leaves either the old checkpoint or the
//! new one, never a torn file.
//!
//! Loading checks every name, shape and dtype against the model (and the
//! optimizer) before changing anything, and reports every mismatch at once.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::{Dtype, SafeTensors, View};
use tapir_tensor::{DType, Device, Shape, Tensor};

use crate::optim::{Optimizer, OptimizerState};
use crate::params::ParamStore;

/// Header key naming the format.
const FORMAT_KEY: &str = "format";
const FORMAT: &str = "tapir-checkpoint-1";
const OPTIM_KIND: &str = "optim.kind";
const OPTIM_STEP: &str = "optim.step";
const OPTIM_PREFIX: &str = "optim.";

/// What can go wrong saving or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading, writing, syncing or renaming failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a complete safetensors file (truncated, corrupt, or
    /// not a checkpoint at all).
    #[error("checkpoint {path}: not a readable safetensors file ({len} bytes): {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: usize,
        /// What the parser found.
        reason: String,
    },
    /// The file is well formed but does not fit the model or optimizer.
    #[error("checkpoint {path} does not fit: {} mismatch(es):\n{}", .mismatches.len(), list(.mismatches))]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Every mismatch found, in a stable order.
        mismatches: Vec<Mismatch>,
    },
    /// A parameter name the format cannot store (it would collide with the
    /// optimizer's entries).
    #[error("checkpoint: parameter name {0:?} is reserved (it starts with \"optim.\")")]
    ReservedName(String),
    /// A tensor error while converting values.
    #[error(transparent)]
    Tensor(#[from] tapir_tensor::Error),
}

/// `?` on a checkpoint call works in a function returning `tapir::Result`:
/// a tensor error converts to itself, any other to
/// [`Error::Checkpoint`](tapir_tensor::Error::Checkpoint) with the same message.
impl From<CheckpointError> for tapir_tensor::Error {
    fn from(e: CheckpointError) -> Self {
        match e {
            CheckpointError::Tensor(e) => e,
            other => tapir_tensor::Error::Checkpoint { message: other.to_string() },
        }
    }
}

fn list(ms: &[Mismatch]) -> String {
    ms.iter().map(|m| format!("  - {m}")).collect::<Vec<_>>().join("\n")
}

/// One way a checkpoint differs from what it is loaded into.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Mismatch {
    /// The model has this tensor; the file does not.
    Missing {
        /// Tensor name.
        name: String,
    },
    /// The file has this tensor; the model does not.
    Unexpected {
        /// Tensor name.
        name: String,
    },
    /// Different shapes.
    Shape {
        /// Tensor name.
        name: String,
        /// The model's shape.
        expected: Shape,
        /// The file's shape.
        found: Shape,
    },
    /// Different dtypes (or a dtype tapir does not have).
    DType {
        /// Tensor name.
        name: String,
        /// The model's dtype.
        expected: DType,
        /// The file's dtype, as safetensors names it.
        found: String,
    },
    /// The optimizer state is of another kind, or absent when asked for.
    Optimizer {
        /// What the caller's optimizer is.
        expected: String,
        /// What the file holds.
        found: String,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Missing { name } => write!(f, "{name}: missing from the file"),
            Mismatch::Unexpected { name } => write!(f, "{name}: in the file but not in the model"),
            Mismatch::Shape { name, expected, found } => {
                write!(f, "{name}: shape {found} in the file, {expected} in the model")
            }
            Mismatch::DType { name, expected, found } => {
                write!(f, "{name}: dtype {found} in the file, {expected} in the model")
            }
            Mismatch::Optimizer { expected, found } => write!(f, "optimizer: {found} in the file, {expected} given"),
        }
    }
}

fn to_st(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
    }
}

/// A file dtype by torch's name for it, so a mismatch reads the same
/// whichever side it comes from.
fn st_name(d: Dtype) -> String {
    match from_st(d) {
        Some(d) => d.name().to_string(),
        None => match d {
            Dtype::BOOL => "bool".to_string(),
            Dtype::U8 => "uint8".to_string(),
            Dtype::I8 => "int8".to_string(),
            Dtype::I16 => "int16".to_string(),
            Dtype::U16 => "uint16".to_string(),
            Dtype::U32 => "uint32".to_string(),
            Dtype::U64 => "uint64".to_string(),
            other => format!("{other:?}").to_lowercase(),
        },
    }
}

fn from_st(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        _ => return None,
    })
}

/// A tensor's elements as little-endian bytes.
fn tensor_bytes(t: &Tensor) -> tapir_tensor::Result<Vec<u8>> {
    macro_rules! le {
        ($ty:ty) => {
            t.to_vec::<$ty>()?.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
    }
    Ok(match t.dtype() {
        DType::F32 => le!(f32),
        DType::F64 => le!(f64),
        DType::F16 => le!(half::f16),
        DType::BF16 => le!(half::bf16),
        DType::I32 => le!(i32),
        DType::I64 => le!(i64),
    })
}

/// A tensor from little-endian bytes (the length was checked by the parser).
fn tensor_from_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> tapir_tensor::Result<Tensor> {
    macro_rules! le {
        ($ty:ty) => {{
            const N: usize = std::mem::size_of::<$ty>();
            let v: Vec<$ty> = data
                .chunks_exact(N)
                .map(|c| <$ty>::from_le_bytes(c.try_into().expect("internal: chunk size")))
                .collect();
            Tensor::from_vec(v, shape.to_vec())
        }};
    }
    match dtype {
        DType::F32 => le!(f32),
        DType::F64 => le!(f64),
        DType::F16 => le!(half::f16),
        DType::BF16 => le!(half::bf16),
        DType::I32 => le!(i32),
        DType::I64 => le!(i64),
    }
}

/// One tensor ready to serialise.
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn raw(t: &Tensor) -> tapir_tensor::Result<Raw> {
    Ok(Raw { dtype: to_st(t.dtype()), shape: t.dims().to_vec(), data: tensor_bytes(t)? })
}

fn slot_key(slot: &str, name: &str) -> String {
    format!("{OPTIM_PREFIX}{slot}.{name}")
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

/// Saves the parameters of `store`, the state of `optim` if given, and
/// `metadata` (free-form strings: a training step, a model config) to
/// `path`, atomically.
pub fn save(
    path: impl AsRef<Path>,
    store: &ParamStore,
    optim: Option<&dyn Optimizer>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    save_with_hook(path, store, optim, metadata, |_| Ok(()))
}

/// [`save`], calling `before_rename` with the finished temporary file just
/// before it replaces `path`. An error from the hook aborts the save the
/// way a crash at that point would (the temporary file is removed and the
/// old checkpoint is untouched). For tests of interrupted saves.
#[doc(hidden)]
pub fn save_with_hook(
    path: impl AsRef<Path>,
    store: &ParamStore,
    optim: Option<&dyn Optimizer>,
    metadata: &BTreeMap<String, String>,
    before_rename: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    save_with_io(path, store, optim, metadata, |f, bytes| f.write_all(bytes), before_rename)
}

/// [`save_with_hook`], writing the temporary file's bytes with `write`
/// instead of one `write_all`: a test passes a writer that fails halfway,
/// as a full disk or a killed process would leave it.
#[doc(hidden)]
pub fn save_with_io(
    path: impl AsRef<Path>,
    store: &ParamStore,
    optim: Option<&dyn Optimizer>,
    metadata: &BTreeMap<String, String>,
    write: impl FnOnce(&mut File, &[u8]) -> std::io::Result<()>,
    before_rename: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let path = path.as_ref();
    let mut tensors: Vec<(String, Raw)> = Vec::with_capacity(store.len());
    for (_, name, value) in store.iter() {
        if name.starts_with(OPTIM_PREFIX) || name == FORMAT_KEY {
            return Err(CheckpointError::ReservedName(name.to_string()));
        }
        tensors.push((name.to_string(), raw(value)?));
    }
    let mut header: HashMap<String, String> = metadata.clone().into_iter().collect();
    header.insert(FORMAT_KEY.into(), FORMAT.into());
    if let Some(o) = optim {
        let st = o.state_dict();
        header.insert(OPTIM_KIND.into(), st.kind.into());
        header.insert(OPTIM_STEP.into(), st.step.to_string());
        for ((_, name, _), slots) in store.iter().zip(&st.slots) {
            for (slot, t) in st.slot_names.iter().zip(slots) {
                tensors.push((slot_key(slot, name), raw(t)?));
            }
        }
    }
    let bytes = safetensors::serialize(tensors.iter().map(|(n, r)| (n.as_str(), r)), &Some(header)).map_err(|e| {
        CheckpointError::Format { path: path.to_path_buf(), len: 0, reason: format!("cannot serialise: {e}") }
    })?;
    drop(tensors);

    let tmp = temp_path(path);
    let result = (|| {
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        write(&mut f, &bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        drop(f);
        before_rename(&tmp).map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // Make the rename itself durable.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// A temporary name beside `path`, unique within this process.
fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// A checkpoint read into memory: every tensor and the header's metadata.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Every tensor, by name (parameters and optimizer state).
    pub tensors: BTreeMap<String, Tensor>,
    /// The header's metadata, including the caller's.
    pub metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Reads and parses `path`. A truncated or corrupt file is a
    /// [`CheckpointError::Format`] that says so.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        Self::read_to(path, Device::Cpu)
    }

    /// Reads and parses `path` as [`Checkpoint::read`] does, each tensor
    /// placed on `device` (copied there from the file's bytes on the host).
    pub fn read_to(path: impl AsRef<Path>, device: Device) -> Result<Self, CheckpointError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(io_err(path))?;
        let format_err =
            |reason: String| CheckpointError::Format { path: path.to_path_buf(), len: bytes.len(), reason };
        let st = SafeTensors::deserialize(&bytes).map_err(|e| format_err(describe(&e)))?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| format_err(describe(&e)))?;
        let metadata: BTreeMap<String, String> = meta.metadata().clone().unwrap_or_default().into_iter().collect();
        let mut tensors = BTreeMap::new();
        let mut unsupported = Vec::new();
        for (name, view) in st.tensors() {
            match from_st(view.dtype()) {
                Some(d) => {
                    tensors.insert(name, tensor_from_bytes(d, view.shape(), view.data())?.to_device(device)?);
                }
                None => unsupported.push(Mismatch::DType { expected: DType::F32, found: st_name(view.dtype()), name }),
            }
        }
        if !unsupported.is_empty() {
            unsupported.sort_by_key(|m| m.to_string());
            return Err(CheckpointError::Mismatch { path: path.to_path_buf(), mismatches: unsupported });
        }
        Ok(Checkpoint { tensors, metadata })
    }
}

fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall | E::InvalidHeaderLength | E::MetadataIncompleteBuffer => {
            format!("the file is truncated or incomplete ({e:?})")
        }
        _ => format!("{e:?}"),
    }
}

/// Loads `path` into `store` (and `optim`, if given), after checking every
/// parameter's (and optimizer slot's) name, shape and dtype; returns the
/// metadata. On any mismatch nothing is changed and the error lists all of
/// them. Optimizer state in the file is ignored when `optim` is `None`.
/// Every value is placed on the device of the parameter it replaces, and
/// optimizer state on its parameter's: move the store with
/// [`ParamStore::to_device`] first to load onto another device.
pub fn load(
    path: impl AsRef<Path>,
    store: &mut ParamStore,
    optim: Option<&mut dyn Optimizer>,
) -> Result<BTreeMap<String, String>, CheckpointError> {
    let path = path.as_ref();
    let mut ck = Checkpoint::read(path)?;
    let mut mismatches = Vec::new();
    // `slot`: an optimizer's state for `want`, which the optimizers keep in
    // the compute dtype (f32 for f16/bf16 parameters) and widen on load.
    let mut check = |name: &str, want: &Tensor, slot: bool, ck: &Checkpoint| match ck.tensors.get(name) {
        None => mismatches.push(Mismatch::Missing { name: name.to_string() }),
        Some(t) => {
            if t.shape() != want.shape() {
                mismatches.push(Mismatch::Shape {
                    name: name.to_string(),
                    expected: want.shape().clone(),
                    found: t.shape().clone(),
                });
            }
            let fits = t.dtype() == want.dtype() || (slot && t.dtype() == want.dtype().compute());
            if !fits {
                mismatches.push(Mismatch::DType {
                    name: name.to_string(),
                    expected: want.dtype(),
                    found: t.dtype().name().to_string(),
                });
            }
        }
    };
    for (_, name, value) in store.iter() {
        check(name, value, false, &ck);
    }
    // The optimizer: the same kind, and either no state yet or one tensor
    // per parameter and slot.
    let mut optim_state = None;
    if let Some(o) = optim.as_deref() {
        let mine = o.state_dict();
        let kind = ck.metadata.get(OPTIM_KIND).cloned().unwrap_or_else(|| "no optimizer state".into());
        if kind != mine.kind {
            mismatches.push(Mismatch::Optimizer { expected: mine.kind.into(), found: kind });
        } else {
            let any = store
                .iter()
                .any(|(_, name, _)| mine.slot_names.iter().any(|s| ck.tensors.contains_key(&slot_key(s, name))));
            if any {
                for (_, name, value) in store.iter() {
                    for s in mine.slot_names {
                        check(&slot_key(s, name), value, true, &ck);
                    }
                }
            }
            let step = ck.metadata.get(OPTIM_STEP).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            optim_state = Some((mine, any, step));
        }
    }
    let known: std::collections::HashSet<&str> = store.iter().map(|(_, n, _)| n).collect();
    for name in ck.tensors.keys() {
        if !name.starts_with(OPTIM_PREFIX) && !known.contains(name.as_str()) {
            mismatches.push(Mismatch::Unexpected { name: name.clone() });
        }
    }
    if !mismatches.is_empty() {
        return Err(CheckpointError::Mismatch { path: path.to_path_buf(), mismatches });
    }
    let ids: Vec<(crate::ParamId, String)> = store.iter().map(|(id, n, _)| (id, n.to_string())).collect();
    // Each value goes to the device its parameter is on, so a store built
    // on CUDA loads a checkpoint written from the CPU and the reverse. The
    // copies are made before anything is changed, so a failed one changes
    // nothing.
    let values = ids
        .iter()
        .map(|(id, name)| {
            let t = ck.tensors.remove(name).expect("internal: checked");
            Ok((*id, t.to_device(store.get(*id).device())?))
        })
        .collect::<tapir_tensor::Result<Vec<_>>>()?;
    if let (Some(o), Some((mine, any, step))) = (optim, optim_state) {
        let slots = if any {
            ids.iter()
                .map(|(id, n)| {
                    let dev = store.get(*id).device();
                    mine.slot_names
                        .iter()
                        .map(|s| ck.tensors.remove(&slot_key(s, n)).expect("internal: checked").to_device(dev))
                        .collect::<tapir_tensor::Result<Vec<_>>>()
                })
                .collect::<tapir_tensor::Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        o.load_state_dict(OptimizerState { kind: mine.kind, step, slot_names: mine.slot_names, slots })?;
    }
    for (id, t) in values {
        store.set(id, t)?;
    }
    Ok(ck.metadata)
}
