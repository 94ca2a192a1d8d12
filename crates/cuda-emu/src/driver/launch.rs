//! Kernel launches: argument marshalling, limits, and the call into the interpreter.

use super::*;

/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, `_SIZE` and `_END` of `extra`.
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
const PARAM_END: usize = 0;

#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    f: Handle,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let e = emu();
    let (lm, index, max_dyn, uses) = {
        let funcs = lock(&e.funcs);
        let Some(fo) = funcs.get(&handle_id(f)) else { return INVALID_HANDLE };
        (fo.module.clone(), fo.index, fo.max_dyn_shared, fo.uses)
    };
    let Some(st) = queue::resolve(stream) else { return INVALID_HANDLE };
    if st.device != lm.device {
        return fail(
            INVALID_HANDLE,
            format!("launch of a function of device {}'s module on a stream of device {}", lm.device, st.device),
        );
    }
    let rc = queue::posted(st.device);
    if rc != SUCCESS {
        return rc;
    }
    let func = &lm.module.funcs[index];
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    let limit = func.maxntid.unwrap_or(1024).min(1024);
    if block.contains(&0) || grid.contains(&0) {
        return fail(INVALID_VALUE, format!("launch of {} with a zero grid or block dimension", func.name));
    }
    if threads > u64::from(limit) || block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
        return fail(
            INVALID_VALUE,
            format!(
                "launch of {} with block ({}, {}, {}): {threads} threads, more than the {limit} a block may have \
                 (or a dimension past 1024 x 1024 x 64)",
                func.name, block[0], block[1], block[2]
            ),
        );
    }
    if grid[0] > i32::MAX as u32 || grid[1] > 65535 || grid[2] > 65535 {
        return fail(
            INVALID_VALUE,
            format!(
                "launch of {} with grid ({}, {}, {}), past 2^31-1 x 65535 x 65535",
                func.name, grid[0], grid[1], grid[2]
            ),
        );
    }
    if shared > max_dyn {
        return fail(
            INVALID_VALUE,
            format!(
                "launch of {} with {shared} bytes of dynamic shared memory; with {} static bytes the limit is {max_dyn} \
                 (cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) raises it)",
                func.name, func.shared_size
            ),
        );
    }
    let mut buf = vec![0u8; func.param_size as usize];
    if !extra.is_null() {
        // SAFETY: `extra` is a PARAM_END-terminated list of (key, value) pairs.
        let (mut ptr, mut size) = (std::ptr::null::<u8>(), None);
        let mut k = 0;
        loop {
            let key = unsafe { *extra.add(k) } as usize;
            if key == PARAM_END {
                break;
            }
            let val = unsafe { *extra.add(k + 1) };
            match key {
                PARAM_BUFFER_POINTER => ptr = val.cast(),
                // SAFETY: the value points at a size_t.
                PARAM_BUFFER_SIZE => size = Some(unsafe { *(val as *const usize) }),
                _ => return INVALID_VALUE,
            }
            k += 2;
        }
        let want = func.params.last().map_or(0, |p| (p.offset + p.size) as usize);
        match size {
            Some(n) if n >= want && !ptr.is_null() => {
                // SAFETY: the caller's buffer holds `n` bytes.
                unsafe { std::ptr::copy_nonoverlapping(ptr, buf.as_mut_ptr(), want) };
            }
            _ => {
                return fail(
                    INVALID_VALUE,
                    format!(
                        "launch of {}: the parameter buffer is smaller than the {want} bytes of its signature",
                        func.name
                    ),
                )
            }
        }
    } else if !func.params.is_empty() {
        if params.is_null() {
            return fail(
                INVALID_VALUE,
                format!(
                    "launch of {} without arguments; its signature has {} parameters",
                    func.name,
                    func.params.len()
                ),
            );
        }
        for (k, p) in func.params.iter().enumerate() {
            // SAFETY: `params` holds one pointer per parameter of the signature (the driver's contract).
            let arg = unsafe { *params.add(k) };
            if arg.is_null() {
                return fail(INVALID_VALUE, format!("launch of {}: argument {k} is a null pointer", func.name));
            }
            // SAFETY: each argument points at a value of its parameter's size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    arg.cast::<u8>(),
                    buf.as_mut_ptr().add(p.offset as usize),
                    p.size as usize,
                )
            };
        }
    }
    // The kernel sees its device's memory and that of the peers its
    // device's context enabled access to.
    let own = e.devices[lm.device].memory.snapshot();
    let peers = lock(&e.devices[lm.device].peers).clone();
    let snapshot = if peers.is_empty() {
        own
    } else {
        let mut all = (*own).clone();
        for p in peers {
            let s = e.devices[p].memory.snapshot();
            all.regions.extend(s.regions.iter().cloned());
            all.freed.extend(s.freed.iter().copied());
        }
        all.regions.sort_by_key(|r| r.base);
        Arc::new(all)
    };
    let access = if e.streamcheck { accesses(func, &uses, &buf, &snapshot) } else { Vec::new() };
    let (racecheck, workers) = (e.racecheck, e.workers);
    let what = format!("the launch of {}", func.name);
    let work: queue::Work = Box::new(move || {
        let l = Launch {
            module: &lm.module,
            func: index,
            grid,
            block,
            dyn_shared: shared,
            params: &buf,
            mem: &snapshot,
            racecheck,
            workers,
        };
        let stats = exec::run(&l)?;
        crate::profile::launched();
        emu().instructions.fetch_add(stats.instructions, Ordering::Relaxed);
        Ok(())
    });
    match queue::submit(&st, queue::Submit { what, access, deps: Vec::new(), work }) {
        Ok(_) => SUCCESS,
        Err(rc) => rc,
    }
}

/// The allocations a launch's pointer arguments point into, read or
/// written as the kernel's code uses each parameter (`hazard::param_use`);
/// every aligned 8-byte word of a parameter is looked at, so pointers
/// inside structures passed by value count too.
fn accesses(
    func: &ptx::Func,
    uses: &hazard::ParamUse,
    buf: &[u8],
    mem: &crate::memory::Snapshot,
) -> Vec<hazard::Access> {
    let mut out: Vec<hazard::Access> = Vec::new();
    for (k, p) in func.params.iter().enumerate().take(64) {
        let (r, w) = (uses.read >> k & 1 != 0, uses.write >> k & 1 != 0);
        if !r && !w {
            continue;
        }
        let (start, end) = (p.offset as usize, (p.offset + p.size) as usize);
        let mut at = start.next_multiple_of(8);
        while at + 8 <= end.min(buf.len()) {
            let v = u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
            if let Some(region) = mem.find(v, 1) {
                match out.iter_mut().find(|a| a.base == region.base) {
                    Some(a) => a.write |= w,
                    None => out.push(hazard::Access { base: region.base, len: region.len, write: w }),
                }
            }
            at += 8;
        }
    }
    out
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, params, extra) }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, params, std::ptr::null_mut()) }
}
