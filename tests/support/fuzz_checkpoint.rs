//! Checkpoint loading from corrupted and truncated files, shared by the
//! cargo-fuzz target `fuzz/fuzz_targets/checkpoint.rs` and
//! `tests/fuzz_ops.rs`: a valid checkpoint (f32 and f64 parameters, one empty
//! and Adam's state) is edited by the case, written, and loaded into a
//! model whose values differ. Loading must return an error, never panic,
//! and an error must leave the store and the optimizer exactly as they
//! were, holding no more memory than before.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arbitrary::Arbitrary;
use tapir::nn::{checkpoint, Adam, Grads, Optimizer, ParamStore};
use tapir::prelude::*;

/// One edit of the file's bytes (positions taken modulo the length).
#[derive(Debug, Clone, Arbitrary)]
pub enum Edit {
    Truncate(u16),
    Flip(u16, u8),
    Set(u16, u8),
    Insert(u16, Vec<u8>),
    Remove(u16, u8),
    /// Overwrites the 8-byte header length.
    HeaderLen(u64),
    /// Replaces the whole JSON header with this text (padded to its length).
    Header(String),
}

/// A case: edits of a valid checkpoint, or bytes of the fuzzer's own.
#[derive(Debug, Clone, Arbitrary)]
pub struct Case {
    pub with_optim: bool,
    pub load_optim: bool,
    pub edits: Vec<Edit>,
    pub raw: Option<Vec<u8>>,
}

fn model(fill: f64) -> Result<ParamStore> {
    let mut s = ParamStore::new();
    s.add("w", Tensor::full([3, 2], fill, DType::F32)?)?;
    s.add("b", Tensor::full([2], fill, DType::F64)?)?;
    s.add("e", Tensor::full([0, 3], fill, DType::F32)?)?;
    Ok(s)
}

fn trained_adam(store: &mut ParamStore) -> Result<Adam> {
    let mut opt = Adam::new(0.1);
    let grads = Grads::from_tensors(store.iter().map(|(_, _, t)| t.ones_like()).collect::<Result<_>>()?);
    opt.step(store, &grads)?;
    Ok(opt)
}

/// The valid checkpoint every edited case starts from.
pub fn valid_bytes(with_optim: bool, dir: &Path) -> Vec<u8> {
    let mut store = model(0.5).expect("model");
    let opt = trained_adam(&mut store).expect("adam");
    let path = dir.join("base.safetensors");
    let optim: Option<&dyn Optimizer> = if with_optim { Some(&opt) } else { None };
    let mut meta = BTreeMap::new();
    meta.insert("step".to_string(), "7".to_string());
    checkpoint::save(&path, &store, optim, &meta).expect("save");
    std::fs::read(&path).expect("read back")
}

fn edit(bytes: &mut Vec<u8>, e: &Edit) {
    let at = |p: u16, len: usize| if len == 0 { 0 } else { p as usize % (len + 1) };
    match e {
        Edit::Truncate(p) => {
            let n = at(*p, bytes.len());
            bytes.truncate(n);
        }
        Edit::Flip(p, m) if !bytes.is_empty() => {
            let i = *p as usize % bytes.len();
            bytes[i] ^= m | 1;
        }
        Edit::Set(p, v) if !bytes.is_empty() => {
            let i = *p as usize % bytes.len();
            bytes[i] = *v;
        }
        Edit::Insert(p, v) => {
            let i = at(*p, bytes.len());
            bytes.splice(i..i, v.iter().copied().take(64));
        }
        Edit::Remove(p, n) => {
            let i = at(*p, bytes.len());
            let end = (i + *n as usize).min(bytes.len());
            bytes.drain(i..end);
        }
        Edit::HeaderLen(n) if bytes.len() >= 8 => bytes[..8].copy_from_slice(&n.to_le_bytes()),
        Edit::Header(text) if bytes.len() >= 8 => {
            let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
            let end = 8usize.saturating_add(len).min(bytes.len());
            let mut h: Vec<u8> = text.bytes().take(end - 8).collect();
            h.resize(end - 8, b' ');
            bytes[8..end].copy_from_slice(&h);
        }
        _ => {}
    }
}

fn snapshot(store: &ParamStore) -> Vec<(String, Vec<u64>)> {
    store.iter().map(|(_, n, t)| (n.to_string(), t.to_vec_f64().iter().map(|v| v.to_bits()).collect())).collect()
}

fn adam_snapshot(opt: &Adam) -> (u64, Vec<Vec<Vec<u64>>>) {
    let st = opt.state_dict();
    let slots =
        st.slots.iter().map(|s| s.iter().map(|t| t.to_vec_f64().iter().map(|v| v.to_bits()).collect()).collect());
    (st.step, slots.collect())
}

/// A directory of this process for the case's files: under cargo's
/// `target/tmp` for a test (cleaned with the build, where one in the
/// system's temporary folder outlived every run), the system's for a
/// fuzz target.
pub fn scratch_dir() -> PathBuf {
    let root = option_env!("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let d = root.join(format!("tapir-fuzz-ck-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Runs one case; panics when a load panics, half-loads, or leaks.
pub fn check(c: &Case, base: &[u8], dir: &Path) {
    let mut bytes = match &c.raw {
        Some(raw) => raw.clone(),
        None => base.to_vec(),
    };
    for e in c.edits.iter().take(8) {
        edit(&mut bytes, e);
    }
    let path = dir.join("case.safetensors");
    std::fs::write(&path, &bytes).expect("write case");
    let mut store = model(-1.0).expect("model");
    let mut opt = trained_adam(&mut store).expect("adam");
    let (before, before_opt) = (snapshot(&store), adam_snapshot(&opt));
    let baseline = memory_allocated(Device::Cpu);
    let optim: Option<&mut dyn Optimizer> = if c.load_optim { Some(&mut opt) } else { None };
    match checkpoint::load(&path, &mut store, optim) {
        Ok(meta) => {
            // A file that still loads must still fit the model.
            drop(meta);
            for (_, name, t) in store.iter() {
                let want = model(0.0).expect("model");
                let id = want.id(name).expect("same names");
                assert_eq!(t.shape(), want.get(id).shape(), "{name}");
                assert_eq!(t.dtype(), want.get(id).dtype(), "{name}");
            }
        }
        Err(e) => {
            let _ = e.to_string();
            assert_eq!(snapshot(&store), before, "a failed load changed the store: {e}");
            assert_eq!(adam_snapshot(&opt), before_opt, "a failed load changed the optimizer: {e}");
            assert_eq!(memory_allocated(Device::Cpu), baseline, "a failed load kept memory: {e}");
        }
    }
}
