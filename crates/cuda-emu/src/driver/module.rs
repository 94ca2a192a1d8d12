//! Modules, functions, their attributes and occupancy.

use super::*;

/// Loads PTX text into a module, allocating its global variables.
pub fn load_module(src: &str) -> Result<usize, (CUresult, String)> {
    let rc = queue::ctx_error();
    if rc != SUCCESS {
        return Err((rc, last_error()));
    }
    let e = emu();
    let device = current_device();
    let mem = &e.devices[device].memory;
    let mut allocs: Vec<(String, u64, u64)> = Vec::new();
    let failed = std::cell::Cell::new(false);
    let module = ptx::load(src, &|globals| {
        let mut out = Vec::new();
        for g in globals {
            let len = (g.init.len() as u64).max(1);
            match mem.alloc(len) {
                Ok(a) => {
                    if let Some(p) = mem.host_ptr(a, g.init.len() as u64) {
                        // SAFETY: the allocation has room for the initialiser.
                        unsafe { std::ptr::copy_nonoverlapping(g.init.as_ptr(), p, g.init.len()) };
                    }
                    out.push(a);
                }
                Err(_) => {
                    failed.set(true);
                    out.push(0);
                }
            }
        }
        out
    })
    .map_err(|m| (INVALID_PTX, format!("PTX rejected: {m}")))?;
    for (g, a) in module.globals.iter().zip(module.global_addrs.iter().copied()) {
        allocs.push((g.name.clone(), a, g.init.len() as u64));
    }
    if failed.get() {
        free_globals(device, &allocs);
        return Err((OUT_OF_MEMORY, "no device memory for the module's global variables".into()));
    }
    if !module.unsupported.is_empty() {
        free_globals(device, &allocs);
        return Err((
            NOT_SUPPORTED,
            format!("the PTX uses instructions the emulator does not implement: {}", module.unsupported.join(", ")),
        ));
    }
    let id = e.next.fetch_add(1, Ordering::Relaxed);
    lock(&e.modules).insert(id, Arc::new(LoadedModule { device, module, globals: allocs }));
    Ok(id)
}

fn free_globals(device: usize, allocs: &[(String, u64, u64)]) {
    for (_, a, _) in allocs {
        if *a != 0 {
            emu().devices[device].memory.free(*a);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut Handle, image: *const c_void) -> CUresult {
    if out.is_null() || image.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a PTX image is a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(image.cast()) }.to_bytes();
    if bytes.starts_with(b"\x7fELF") || bytes.len() < 4 {
        return fail(INVALID_IMAGE, "the emulator loads PTX text only, not cubin or fatbin images".into());
    }
    let Ok(src) = std::str::from_utf8(bytes) else {
        return fail(INVALID_PTX, "the PTX is not UTF-8".into());
    };
    match load_module(src) {
        Ok(id) => write(out, id as Handle),
        Err((rc, msg)) => fail(rc, msg),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    out: *mut Handle,
    image: *const c_void,
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuModuleLoadData(out, image) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(out: *mut Handle, fname: *const c_char) -> CUresult {
    if fname.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) }.to_string_lossy().into_owned();
    let Ok(mut text) = std::fs::read(&path) else { return NOT_FOUND };
    text.push(0);
    // SAFETY: NUL-terminated above.
    unsafe { cuModuleLoadData(out, text.as_ptr().cast()) }
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(m: Handle) -> CUresult {
    let e = emu();
    let Some(lm) = lock(&e.modules).remove(&handle_id(m)) else { return INVALID_HANDLE };
    free_globals(lm.device, &lm.globals);
    lock(&e.funcs).retain(|_, f| !Arc::ptr_eq(&f.module, &lm));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(out: *mut Handle, m: Handle, name: *const c_char) -> CUresult {
    if out.is_null() || name.is_null() {
        return INVALID_VALUE;
    }
    let e = emu();
    let Some(lm) = lock(&e.modules).get(&handle_id(m)).cloned() else { return INVALID_HANDLE };
    // SAFETY: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let Some(index) = lm.module.funcs.iter().position(|f| f.entry && f.name == name) else { return NOT_FOUND };
    let static_shared = lm.module.funcs[index].shared_size;
    let uses = hazard::param_use(&lm.module.funcs[index]);
    let id = e.next.fetch_add(1, Ordering::Relaxed);
    lock(&e.funcs)
        .insert(id, FuncObj { module: lm, index, max_dyn_shared: SHARED_DEFAULT.saturating_sub(static_shared), uses });
    write(out, id as Handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    if name.is_null() {
        return INVALID_VALUE;
    }
    let Some(lm) = lock(&emu().modules).get(&handle_id(m)).cloned() else { return INVALID_HANDLE };
    // SAFETY: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let Some((_, a, n)) = lm.globals.iter().find(|(g, _, _)| *g == name) else { return NOT_FOUND };
    if !dptr.is_null() {
        write(dptr, *a);
    }
    if !bytes.is_null() {
        write(bytes, *n as usize);
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attr: c_int, f: Handle) -> CUresult {
    let funcs = lock(&emu().funcs);
    let Some(fo) = funcs.get(&handle_id(f)) else { return INVALID_HANDLE };
    let func = &fo.module.module.funcs[fo.index];
    let v = match attr {
        0 => func.maxntid.unwrap_or(1024) as c_int,
        1 => func.shared_size as c_int,
        2 => 0,
        3 => func.local_size as c_int,
        4 => (func.nregs as c_int).min(255),
        5 => 90,
        6 => 90,
        7 => 0,
        8 => fo.max_dyn_shared as c_int,
        9 => -1,
        _ => return INVALID_VALUE,
    };
    write(pi, v)
}

#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(f: Handle, attr: c_int, value: c_int) -> CUresult {
    let mut funcs = lock(&emu().funcs);
    let Some(fo) = funcs.get_mut(&handle_id(f)) else { return INVALID_HANDLE };
    match attr {
        8 => {
            let static_shared = fo.module.module.funcs[fo.index].shared_size;
            if value < 0 || value as u32 + static_shared > SHARED_OPTIN {
                return INVALID_VALUE;
            }
            fo.max_dyn_shared = value as u32;
            SUCCESS
        }
        9 => SUCCESS,
        _ => INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuFuncSetCacheConfig(f: Handle, _c: c_int) -> CUresult {
    if lock(&emu().funcs).contains_key(&handle_id(f)) {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    _f: Handle,
    block: c_int,
    _shared: usize,
) -> CUresult {
    write(n, (2048 / block.max(1)).clamp(1, 32))
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: Handle,
    block: c_int,
    shared: usize,
    _flags: c_uint,
) -> CUresult {
    cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, block, shared)
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    _f: Handle,
    _b2s: *mut c_void,
    _shared: usize,
    limit: c_int,
) -> CUresult {
    let b = if limit > 0 { limit.min(1024) } else { 1024 };
    if !min_grid.is_null() {
        write(min_grid, 132 * (2048 / b));
    }
    write(block, b)
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: Handle,
    b2s: *mut c_void,
    shared: usize,
    limit: c_int,
    _flags: c_uint,
) -> CUresult {
    cuOccupancyMaxPotentialBlockSize(min_grid, block, f, b2s, shared, limit)
}

#[no_mangle]
pub extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    out: *mut usize,
    _f: Handle,
    _n: c_int,
    _b: c_int,
) -> CUresult {
    write(out, SHARED_DEFAULT as usize)
}
