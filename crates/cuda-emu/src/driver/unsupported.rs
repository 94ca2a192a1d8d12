//! Graphs and external memory: not emulated, each answers `CUDA_ERROR_NOT_SUPPORTED`.

use super::*;

#[no_mangle]
pub extern "C" fn cuGraphInstantiateWithFlags(_e: *mut Handle, _g: Handle, _f: u64) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphLaunch(_e: Handle, _s: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphUpload(_e: Handle, _s: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphDestroy(_g: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(_e: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuImportExternalMemory(_m: *mut Handle, _d: *const c_void) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuExternalMemoryGetMappedBuffer(_d: *mut CUdeviceptr, _m: Handle, _b: *const c_void) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuDestroyExternalMemory(_m: Handle) -> CUresult {
    NOT_SUPPORTED
}
