//! `_Py_DebugOffsets` (CPython 3.13+): the interpreter's own account of where its structures
//! keep their fields, at the very start of `_PyRuntime`. The struct itself grows between
//! versions, so where each of its fields sits is per version (from each version's
//! `pycore_runtime.h` / `pycore_debug_offsets.h`); what it says is then read, not assumed.
use anyhow::{Context, Result, bail};
use reaper_common::python::PyLayout;

use super::versions::{CodeLayout, Offsets, direct_frames};

const COOKIE: &[u8; 8] = b"xdebugpy";

/// Where a version's `_Py_DebugOffsets` keeps each field this reader needs.
struct Fields {
    interpreters_head: usize,
    interp_next: usize,
    interp_threads_head: usize,
    thread_next: usize,
    thread_current_frame: usize,
    thread_native_id: usize,
    frame_previous: usize,
    frame_executable: usize,
    frame_instr_ptr: usize,
    frame_owner: usize,
    code_filename: usize,
    code_qualname: usize,
    code_linetable: usize,
    code_firstlineno: usize,
    code_adaptive: usize,
    bytes_size: usize,
    bytes_data: usize,
    str_state: usize,
    str_length: usize,
    str_ascii_size: usize,
    /// The first frame owner that is not Python code: 3.13's C-stack shim (3), 3.14's
    /// interpreter-owned entry frame (3, then the C stack's 4).
    owner_not_python: u8,
    /// The tag bits of a `_PyStackRef` (3.14's `f_executable`).
    code_tag_mask: u8,
}

const V3_13: Fields = Fields {
    interpreters_head: 40,
    interp_next: 64,
    interp_threads_head: 72,
    thread_next: 168,
    thread_current_frame: 184,
    thread_native_id: 200,
    frame_previous: 232,
    frame_executable: 240,
    frame_instr_ptr: 248,
    frame_owner: 264,
    code_filename: 280,
    code_qualname: 296,
    code_linetable: 304,
    code_firstlineno: 312,
    code_adaptive: 344,
    bytes_size: 520,
    bytes_data: 528,
    str_state: 544,
    str_length: 552,
    str_ascii_size: 560,
    owner_not_python: 3,
    code_tag_mask: 0,
};

const V3_14: Fields = Fields {
    interpreters_head: 40,
    interp_next: 64,
    interp_threads_head: 72,
    thread_next: 192,
    thread_current_frame: 208,
    thread_native_id: 224,
    frame_previous: 256,
    frame_executable: 264,
    frame_instr_ptr: 272,
    frame_owner: 288,
    code_filename: 320,
    code_qualname: 336,
    code_linetable: 344,
    code_firstlineno: 352,
    code_adaptive: 384,
    bytes_size: 600,
    bytes_data: 608,
    str_state: 624,
    str_length: 632,
    str_ascii_size: 640,
    owner_not_python: 3,
    // Objects are at least 8-byte aligned; 3.14's default build tags the lowest bit.
    code_tag_mask: 7,
};

/// How far into `_PyRuntime` the reader needs to see.
pub const NEEDED: usize = 648;

/// The offsets 3.`minor`'s `_Py_DebugOffsets` (the first bytes of `runtime`) gives.
pub fn parse(minor: u8, runtime: &[u8]) -> Result<Offsets> {
    let fields = match minor {
        13 => &V3_13,
        14 => &V3_14,
        _ => bail!("no _Py_DebugOffsets layout known for Python 3.{minor}"),
    };
    if runtime.get(..8) != Some(COOKIE) {
        bail!("_PyRuntime does not start with the _Py_DebugOffsets cookie");
    }
    let word = |at: usize| -> Result<u64> {
        let bytes = runtime
            .get(at..at + 8)
            .context("_Py_DebugOffsets cut short")?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    };
    let version = word(8)?;
    if (version >> 24, (version >> 16) & 0xff) != (3, u64::from(minor)) {
        bail!("_Py_DebugOffsets names version {version:#x}, not 3.{minor}");
    }
    if word(16)? != 0 {
        bail!("a free-threaded build: its frames are not read");
    }
    // Every offset is within one structure (the interpreter state, the largest, runs to a
    // few KiB); anything past 64 KiB is misread.
    let off = |at: usize| -> Result<u16> {
        let v = word(at)?;
        u16::try_from(v)
            .with_context(|| format!("_Py_DebugOffsets: implausible offset {v} at byte {at}"))
    };
    let probe = direct_frames(PyLayout {
        interpreters_head: off(fields.interpreters_head)?,
        interp_next: off(fields.interp_next)?,
        interp_threads_head: off(fields.interp_threads_head)?,
        thread_next: off(fields.thread_next)?,
        thread_native_id: off(fields.thread_native_id)?,
        thread_frame: off(fields.thread_current_frame)?,
        frame_code: off(fields.frame_executable)?,
        frame_previous: off(fields.frame_previous)?,
        frame_instr: off(fields.frame_instr_ptr)?,
        frame_owner: off(fields.frame_owner)?,
        owner_not_python: fields.owner_not_python,
        code_tag_mask: fields.code_tag_mask,
        ..PyLayout::default()
    });
    let ascii_size = off(fields.str_ascii_size)?;
    let code = CodeLayout {
        filename: off(fields.code_filename)?,
        qualname: off(fields.code_qualname)?,
        linetable: off(fields.code_linetable)?,
        firstlineno: off(fields.code_firstlineno)?,
        code_adaptive: off(fields.code_adaptive)?,
        str_length: off(fields.str_length)?,
        str_state: off(fields.str_state)?,
        ascii_size,
        // utf8_length and utf8 follow the ASCII header (3.12 dropped wstr).
        compact_size: ascii_size + 16,
        bytes_size: off(fields.bytes_size)?,
        bytes_data: off(fields.bytes_data)?,
    };
    Ok(Offsets { probe, code })
}
