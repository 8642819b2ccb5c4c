//! Naming a Python frame: its code object's qualified name and file, and the line of its
//! instruction from the code object's location table, all read from the spawner's memory.
use std::fs::File;
use std::os::unix::fs::FileExt;

use reaper_common::python::PyFrame;

use super::versions::CodeLayout;
use crate::procfs::proc_path;
use crate::stream::evidence::Frame;

/// Longest string or location table read (a qualified name, a path, a table).
const READ_MAX: u64 = 64 * 1024;

/// A process's memory, read through `/proc/PID/mem`.
pub struct Memory(File);

impl Memory {
    pub fn open(pid: u32) -> Option<Memory> {
        crate::untrusted::read::open(&proc_path(pid, "mem"))
            .ok()
            .map(Memory)
    }

    fn bytes(&self, at: u64, len: u64) -> Option<Vec<u8>> {
        if at == 0 || len > READ_MAX {
            return None;
        }
        let mut buf = vec![0; len as usize];
        self.0.read_exact_at(&mut buf, at).ok()?;
        Some(buf)
    }

    fn word(&self, at: u64) -> Option<u64> {
        let b = self.bytes(at, 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    fn u32(&self, at: u64) -> Option<u32> {
        let b = self.bytes(at, 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }

    /// A `str` object's text (compact strings: every string a code object names).
    fn string(&self, obj: u64, l: &CodeLayout) -> Option<String> {
        let len = self.word(obj + u64::from(l.str_length))?;
        let state = self.u32(obj + u64::from(l.str_state))?;
        let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
        if compact == 0 {
            return None;
        }
        let data = obj
            + u64::from(if ascii == 1 {
                l.ascii_size
            } else {
                l.compact_size
            });
        let raw = self.bytes(data, len.checked_mul(u64::from(kind))?)?;
        Some(match kind {
            1 => raw.iter().map(|&b| char::from(b)).collect(),
            2 => raw
                .chunks_exact(2)
                .filter_map(|c| char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))))
                .collect(),
            4 => raw
                .chunks_exact(4)
                .filter_map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            _ => return None,
        })
    }

    /// A `bytes` object's contents.
    fn byte_string(&self, obj: u64, l: &CodeLayout) -> Option<Vec<u8>> {
        let len = self.word(obj + u64::from(l.bytes_size))?;
        self.bytes(obj + u64::from(l.bytes_data), len)
    }
}

/// A Python frame whose code could not be read (its spawner gone): it says only that much.
pub fn unnamed() -> Frame {
    Frame {
        language: Some("python".into()),
        ..Frame::default()
    }
}

/// Names one frame from the spawner's memory (`None` there: the frame is left unnamed).
pub fn name(memory: Option<&Memory>, l: &CodeLayout, frame: &PyFrame) -> Frame {
    let mut named = unnamed();
    let Some(mem) = memory else {
        return named;
    };
    let code = frame.code;
    let field = |off: u16| mem.word(code + u64::from(off));
    let bytecode = code + u64::from(l.code_adaptive);
    // The instruction's offset in the bytecode, in bytes (code units are two bytes).
    let lasti = frame.instr.checked_sub(bytecode).filter(|o| o % 2 == 0);
    named.offset = lasti.unwrap_or(0);
    named.function = field(l.qualname).and_then(|s| mem.string(s, l));
    named.file = field(l.filename).and_then(|s| mem.string(s, l));
    let first = mem.u32(code + u64::from(l.firstlineno));
    let table = field(l.linetable).and_then(|t| mem.byte_string(t, l));
    if let (Some(lasti), Some(first), Some(table)) = (lasti, first, table) {
        named.line = line_of(&table, first as i32, lasti / 2);
    }
    named
}

/// The line of the instruction at code unit `index`, from a 3.11+ location table
/// (`Objects/locations.md` in CPython): entries of a header byte `1CCCCLLL` (code `C`, `L` + 1
/// code units) and the code's varint-encoded fields.
pub fn line_of(table: &[u8], first_line: i32, index: u64) -> Option<u32> {
    let mut at = 0usize;
    let mut line = first_line;
    let mut unit = 0u64;
    while at < table.len() {
        let head = table[at];
        if head & 0x80 == 0 {
            return None; // not at an entry's start: a misread table
        }
        at += 1;
        let code = (head >> 3) & 0xf;
        let units = u64::from(head & 7) + 1;
        let mut has_line = true;
        match code {
            15 => has_line = false,
            14 => {
                line += signed_varint(table, &mut at)?;
                for _ in 0..3 {
                    varint(table, &mut at)?;
                }
            }
            13 => line += signed_varint(table, &mut at)?,
            10..=12 => {
                line += i32::from(code) - 10;
                at += 2;
            }
            _ => at += 1,
        }
        if index < unit + units {
            return has_line.then(|| u32::try_from(line).ok()).flatten();
        }
        unit += units;
    }
    None
}

fn varint(table: &[u8], at: &mut usize) -> Option<u32> {
    let mut value = 0u32;
    let mut shift = 0;
    loop {
        let b = *table.get(*at)?;
        *at += 1;
        value |= u32::from(b & 63).checked_shl(shift)?;
        if b & 64 == 0 {
            return Some(value);
        }
        shift += 6;
    }
}

fn signed_varint(table: &[u8], at: &mut usize) -> Option<i32> {
    let v = varint(table, at)?;
    Some(if v & 1 == 1 {
        -((v >> 1) as i32)
    } else {
        (v >> 1) as i32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table written as CPython 3.11+ writes one (`Python/assemble.c`): a function on line
    /// 10 whose first 3 units are on line 10 (short form), next 2 on line 12 (one-line form,
    /// +2), next 4 on line 9 (no-column form, -3), 1 with no location, then 8 on line 40
    /// (long form, +31).
    fn table() -> Vec<u8> {
        vec![
            0x80 | 2, // short form (code 0)
            0x05,
            0x80 | (12 << 3) | 1,
            4,
            9,
            0x80 | (13 << 3) | 3,
            7, // zigzag(-3) = 3 << 1 | 1
            0x80 | (15 << 3),
            0x80 | (14 << 3) | 7,
            62, // zigzag(31)
            0,
            5,
            9,
        ]
    }

    #[test]
    fn each_form_of_the_location_table_moves_the_line() {
        let t = table();
        let lines: Vec<Option<u32>> = (0..18).map(|i| line_of(&t, 10, i)).collect();
        let mut want = vec![Some(10); 3];
        want.extend([Some(12); 2]);
        want.extend([Some(9); 4]);
        want.push(None);
        want.extend([Some(40); 8]);
        assert_eq!(lines, want);
        assert_eq!(line_of(&t, 10, 18), None, "past the table");
    }

    #[test]
    fn a_table_not_at_an_entry_is_refused() {
        assert_eq!(line_of(&[0x05, 0x80], 1, 0), None);
    }

    #[test]
    fn multi_byte_varints_carry_on() {
        // zigzag(1000) = 2000 = 0b11111_010000: low six bits 16 with the continue bit, then 31.
        let t = vec![0x80 | (13 << 3), 16 | 64, 31];
        assert_eq!(line_of(&t, 1, 0), Some(1001));
    }
}
