//! Where each CPython version keeps what the fork probe and the namer read. 3.13 and later
//! say it themselves in `_Py_DebugOffsets`, at the start of `_PyRuntime` (cookie `xdebugpy`,
//! written for out-of-process debuggers); 3.11 and 3.12 do not, so their offsets are a table
//! here, from those versions' headers (x86_64 and aarch64 alike: LP64, same alignment).
use anyhow::{Result, bail};
use reaper_common::python::{PY_NO_CFRAME, PyLayout};

/// Where a code object and the strings and bytes it names keep their fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub filename: u16,
    pub qualname: u16,
    pub linetable: u16,
    pub firstlineno: u16,
    /// Where the bytecode starts in the code object (`co_code_adaptive`).
    pub code_adaptive: u16,
    /// `PyASCIIObject.length`, `.state`, and its size (where a compact ASCII string's
    /// characters start).
    pub str_length: u16,
    pub str_state: u16,
    pub ascii_size: u16,
    /// The size of `PyCompactUnicodeObject` (where other compact strings' characters start).
    pub compact_size: u16,
    /// `PyBytesObject.ob_size`, `.ob_sval`.
    pub bytes_size: u16,
    pub bytes_data: u16,
}

/// One interpreter version's offsets: the probe's part (its `runtime`, `start` and namespace
/// are the process's, filled in later) and the namer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub probe: PyLayout,
    pub code: CodeLayout,
}

/// The `_PyInterpreterFrame.owner` of a frame on the C stack (3.12+): a shim, not Python code.
const FRAME_OWNED_BY_CSTACK: u8 = 3;

/// 3.11: frames are reached through `tstate->cframe->current_frame`; no C-stack shims.
const V3_11: Offsets = Offsets {
    probe: PyLayout {
        start: 0,
        runtime: 0,
        pidns_dev: 0,
        pidns_ino: 0,
        interpreters_head: 40,
        interp_next: 0,
        interp_threads_head: 16,
        thread_next: 8,
        thread_native_id: 160,
        thread_frame: 56,
        cframe_frame: 8,
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        frame_owner: 69,
        owner_not_python: u8::MAX,
        code_tag_mask: 0,
        _pad: [0; 2],
    },
    code: CodeLayout {
        filename: 112,
        qualname: 128,
        linetable: 136,
        firstlineno: 72,
        code_adaptive: 184,
        str_length: 16,
        str_state: 32,
        ascii_size: 48,
        compact_size: 72,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.12: `_PyCFrame` keeps only `current_frame`; entry frames are C-stack shims.
const V3_12: Offsets = Offsets {
    probe: PyLayout {
        interp_threads_head: 72,
        thread_native_id: 144,
        cframe_frame: 0,
        frame_code: 0,
        frame_previous: 8,
        frame_owner: 70,
        owner_not_python: FRAME_OWNED_BY_CSTACK,
        ..V3_11.probe
    },
    code: CodeLayout {
        firstlineno: 68,
        code_adaptive: 192,
        ascii_size: 40,
        compact_size: 56,
        ..V3_11.code
    },
};

/// The offsets of CPython `major.minor` from its table, or from the `_Py_DebugOffsets` that
/// `runtime` (the first bytes of `_PyRuntime`, as the ELF file holds them) starts with.
pub fn offsets(major: u8, minor: u8, runtime: &[u8]) -> Result<Offsets> {
    match (major, minor) {
        (3, 11) => Ok(V3_11),
        (3, 12) => Ok(V3_12),
        (3, 13 | 14) => super::debug_offsets::parse(minor, runtime),
        _ => bail!("Python {major}.{minor}: only 3.11 to 3.14 are read"),
    }
}

/// A layout whose frames are reached directly from the thread state (3.13+).
pub fn direct_frames(mut probe: PyLayout) -> PyLayout {
    probe.cframe_frame = PY_NO_CFRAME;
    probe
}
