//! Reads what occupancy needs from a cubin (the ELF file NVRTC emits for
//! one architecture with `nvrtcGetCUBIN`): each kernel's registers a
//! thread and stack frame, from the `.nv.info` section's attributes.
//!
//! The layout, as NVRTC 12 writes it for sm_90: `.nv.info` holds entries
//! of a format byte and an attribute byte; format 4 (a sized value) is
//! followed by a 2-byte size and that many bytes, format 3 by a 2-byte
//! value; formats 1 and 2 (no value, a byte) are taken to fill 4 bytes too
//! (NVRTC 12.9 wrote none in the cubins checked). `EIATTR_REGCOUNT`
//! (0x2f) and `EIATTR_FRAME_SIZE` (0x11) are sized values of a symbol
//! index and a 4-byte count; the symbol's name, in `.symtab`, is the
//! kernel's.

/// What a cubin says about one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelAttrs {
    pub name: String,
    pub regs: u32,
    /// Local memory a thread (its stack frame: spills and local arrays).
    pub frame: u32,
}

const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_REGCOUNT: u8 = 0x2f;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

struct Section<'a> {
    name: &'a [u8],
    data: &'a [u8],
}

fn c_str(b: &[u8], o: usize) -> &[u8] {
    let s = b.get(o..).unwrap_or(&[]);
    &s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]
}

fn sections(elf: &[u8]) -> Option<Vec<Section<'_>>> {
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 {
        return None;
    }
    let shoff = u64_at(elf, 0x28)? as usize;
    let (entsize, num, strndx) =
        (u16_at(elf, 0x3a)? as usize, u16_at(elf, 0x3c)? as usize, u16_at(elf, 0x3e)? as usize);
    let header = |i: usize| -> Option<(u32, u32, &[u8])> {
        let h = shoff.checked_add(i.checked_mul(entsize)?)?;
        let (name, kind) = (u32_at(elf, h)?, u32_at(elf, h + 4)?);
        let (off, size) = (u64_at(elf, h + 24)? as usize, u64_at(elf, h + 32)? as usize);
        // NOBITS sections (.nv.shared.*) have no bytes in the file.
        let data = if kind == 8 { &[][..] } else { elf.get(off..off.checked_add(size)?)? };
        Some((name, kind, data))
    };
    let names = header(strndx)?.2;
    (0..num).map(|i| header(i).map(|(n, _, data)| Section { name: c_str(names, n as usize), data })).collect()
}

/// Each kernel's registers and frame in a cubin; None when it is not an
/// ELF file of the expected layout.
pub fn kernels(elf: &[u8]) -> Option<Vec<KernelAttrs>> {
    let secs = sections(elf)?;
    let find = |n: &[u8]| secs.iter().find(|s| s.name == n).map(|s| s.data);
    let (symtab, strtab, info) = (find(b".symtab")?, find(b".strtab")?, find(b".nv.info")?);
    let sym_name = |i: u32| -> Option<String> {
        let n = u32_at(symtab, i as usize * 24)?;
        Some(String::from_utf8_lossy(c_str(strtab, n as usize)).into_owned())
    };
    let mut out: Vec<KernelAttrs> = Vec::new();
    let mut i = 0;
    while i + 2 <= info.len() {
        let (fmt, attr) = (info[i], info[i + 1]);
        let len = match fmt {
            4 => 4 + u16_at(info, i + 2)? as usize,
            1..=3 => 4,
            _ => return None,
        };
        if fmt == 4 && (attr == EIATTR_REGCOUNT || attr == EIATTR_FRAME_SIZE) {
            let (sym, v) = (u32_at(info, i + 4)?, u32_at(info, i + 8)?);
            let name = sym_name(sym)?;
            let k = match out.iter().position(|k| k.name == name) {
                Some(p) => p,
                None => {
                    out.push(KernelAttrs { name, regs: 0, frame: 0 });
                    out.len() - 1
                }
            };
            if attr == EIATTR_REGCOUNT {
                out[k].regs = v;
            } else {
                out[k].frame = v;
            }
        }
        i += len;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built ELF with the three sections the reader needs.
    fn elf(info: &[u8], syms: &[&str]) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; 24];
        for s in syms {
            let mut e = vec![0u8; 24];
            e[..4].copy_from_slice(&(strtab.len() as u32).to_le_bytes());
            symtab.extend(e);
            strtab.extend(s.as_bytes());
            strtab.push(0);
        }
        let shstr = b"\0.shstrtab\0.strtab\0.symtab\0.nv.info\0".to_vec();
        let bodies: [(u32, u32, &[u8]); 5] =
            [(0, 0, &[]), (1, 3, &shstr), (11, 3, &strtab), (19, 2, &symtab), (27, 0x7000_0000, info)];
        let mut out = vec![0u8; 64];
        out[..5].copy_from_slice(b"\x7fELF\x02");
        let mut offs = Vec::new();
        for (_, _, b) in &bodies {
            offs.push(out.len());
            out.extend_from_slice(b);
        }
        let shoff = out.len();
        for ((name, kind, b), off) in bodies.iter().zip(offs) {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend(h);
        }
        out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&5u16.to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        out
    }

    fn sval(attr: u8, sym: u32, v: u32) -> Vec<u8> {
        let mut e = vec![4, attr, 8, 0];
        e.extend(sym.to_le_bytes());
        e.extend(v.to_le_bytes());
        e
    }

    #[test]
    fn reads_registers_and_frames_by_symbol() {
        let mut info = sval(0x2f, 2, 10);
        info.extend([3, 0x1b, 255, 0]);
        info.extend(sval(0x2f, 1, 40));
        info.extend(sval(0x11, 1, 16));
        info.extend([1, 0x04, 0, 0]);
        let k = kernels(&elf(&info, &["tile", "axpy"])).unwrap();
        assert_eq!(
            k,
            vec![
                KernelAttrs { name: "axpy".into(), regs: 10, frame: 0 },
                KernelAttrs { name: "tile".into(), regs: 40, frame: 16 },
            ]
        );
    }

    #[test]
    fn refuses_what_is_not_a_cubin() {
        assert_eq!(kernels(b"not an elf"), None);
        let mut e = elf(&sval(0x2f, 1, 10), &["k"]);
        e.truncate(e.len() - 40);
        assert_eq!(kernels(&e), None);
        // An unknown entry format.
        assert_eq!(kernels(&elf(&[9, 9, 9, 9], &["k"])), None);
    }
}
