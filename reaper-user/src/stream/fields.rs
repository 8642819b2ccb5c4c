//! The stream's lossless text fields: a process's name, path or arguments as readable text and,
//! only when the bytes are not UTF-8, a `*_b64` twin with the exact bytes. Shared by every
//! event that names a process (see [`super::events`]) and read back by the audit report.
use std::{borrow::Cow, sync::Arc};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde::{Deserialize, Serialize};

use crate::text::{Args, Comm, escape_for_terminal, exact_b64, lossy};

/// Where a [`ProcText`]'s bytes live: inline for a comm, shared with the graph otherwise.
/// Neither copies on the event path.
#[derive(Clone, Debug)]
pub enum ProcBytes {
    Comm(Comm),
    Shared(Arc<[u8]>),
}

impl ProcBytes {
    fn as_bytes(&self) -> &[u8] {
        match self {
            ProcBytes::Comm(c) => c.as_bytes(),
            ProcBytes::Shared(b) => b,
        }
    }
}

impl From<Comm> for ProcBytes {
    fn from(c: Comm) -> Self {
        ProcBytes::Comm(c)
    }
}

impl From<&[u8]> for ProcBytes {
    fn from(b: &[u8]) -> Self {
        ProcBytes::Shared(b.into())
    }
}

impl From<Arc<[u8]>> for ProcBytes {
    fn from(b: Arc<[u8]>) -> Self {
        ProcBytes::Shared(b)
    }
}

/// A process's name or path as a field `name` (lossy text) and, only when the bytes are not
/// UTF-8, its twin `name_b64` (the exact bytes). Text is made while serialising: valid UTF-8
/// (nearly always) is written straight from the bytes.
#[derive(Clone, Debug)]
pub struct ProcText {
    name: &'static str,
    raw: ProcBytes,
}

impl ProcText {
    pub fn new(name: &'static str, bytes: impl Into<ProcBytes>) -> ProcText {
        ProcText {
            name,
            raw: bytes.into(),
        }
    }

    /// The exact bytes, escaped for a terminal.
    pub fn for_terminal(&self) -> String {
        escape_for_terminal(self.raw.as_bytes())
    }

    /// Its exact bytes.
    pub fn bytes(&self) -> &[u8] {
        self.raw.as_bytes()
    }

    /// Its field's name and its exact bytes.
    pub(super) fn parts(&self) -> (&'static str, &[u8]) {
        (self.name, self.raw.as_bytes())
    }

    /// The text (invalid UTF-8 replaced), as the stream's string field shows it.
    pub fn text(&self) -> Cow<'_, str> {
        lossy(self.raw.as_bytes())
    }
}

/// An empty `comm`.
impl Default for ProcText {
    fn default() -> Self {
        ProcText::new("comm", Comm::default())
    }
}

/// The bytes of a string field and its `_b64` twin, as read back from the stream: the exact
/// bytes when the twin is there and valid, the text's otherwise.
fn exact_bytes(text: Option<String>, b64: Option<String>) -> Vec<u8> {
    b64.and_then(|b| STANDARD.decode(b).ok())
        .or_else(|| text.map(String::into_bytes))
        .unwrap_or_default()
}

/// Reads back a [`ProcText`] named `$name` (and its `$name_b64` twin), flattened into the
/// object that holds it.
macro_rules! read_named {
    ($fn_name:ident, $name:literal, $b64:literal) => {
        pub fn $fn_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ProcText, D::Error> {
            #[derive(Deserialize)]
            struct Named {
                #[serde(rename = $name)]
                text: Option<String>,
                #[serde(rename = $b64)]
                b64: Option<String>,
            }
            let n = Named::deserialize(d)?;
            let bytes: Arc<[u8]> = exact_bytes(n.text, n.b64).into();
            Ok(ProcText::new($name, bytes))
        }
    };
}

impl ProcText {
    read_named!(read_comm, "comm", "comm_b64");
    read_named!(read_filename, "filename", "filename_b64");
    read_named!(read_executable, "executable", "executable_b64");
    read_named!(read_session, "session", "session_b64");
    read_named!(read_id, "id", "id_b64");
}

/// A `comm`, the name most events carry; a field of another name reads with
/// `deserialize_with` (`ProcText::read_filename`, `ProcText::read_executable`).
impl<'de> Deserialize<'de> for ProcText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ProcText::read_comm(d)
    }
}

impl Serialize for ProcText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let bytes = self.raw.as_bytes();
        let mut map = s.serialize_map(None)?;
        map.serialize_entry(self.name, &lossy(bytes))?;
        if let Some(b64) = exact_b64(bytes) {
            map.serialize_entry(&format!("{}_b64", self.name), &b64)?;
        }
        map.end()
    }
}

/// An argv, lossless: `argv` (strings) and, when any argument is not UTF-8, `argv_b64` (every
/// argument in base64). Shares the graph's bytes; text is made while serialising.
#[derive(Clone, Debug, Default)]
pub struct Argv(Args);

impl Argv {
    pub fn new(args: Args) -> Argv {
        Argv(args)
    }

    /// The exact arguments, escaped for a terminal and separated by spaces.
    pub fn for_terminal(&self) -> String {
        self.0.for_terminal()
    }

    /// The exact arguments.
    pub fn args(&self) -> &Args {
        &self.0
    }

    /// The arguments as text (invalid UTF-8 replaced), separated by spaces.
    pub fn text(&self) -> String {
        self.0.iter().map(lossy).collect::<Vec<_>>().join(" ")
    }
}

/// Read back (the audit report): `argv` and its `argv_b64` twin.
impl<'de> Deserialize<'de> for Argv {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Lists {
            argv: Option<Vec<String>>,
            argv_b64: Option<Vec<String>>,
        }
        let l = Lists::deserialize(d)?;
        let exact = l.argv_b64.and_then(|list| {
            list.iter()
                .map(|a| STANDARD.decode(a).ok())
                .collect::<Option<Vec<_>>>()
        });
        Ok(Argv(match exact {
            Some(args) => Args::from_list(args),
            None => Args::from_list(l.argv.unwrap_or_default()),
        }))
    }
}

/// Arguments as one JSON array of lossy strings, written without collecting them.
struct LossyList<'a>(&'a Args);

impl Serialize for LossyList<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(lossy))
    }
}

/// Arguments as one JSON array of base64 strings.
struct Base64List<'a>(&'a Args);

impl Serialize for Base64List<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|a| STANDARD.encode(a)))
    }
}

impl Serialize for Argv {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("argv", &LossyList(&self.0))?;
        if self.0.iter().any(|a| std::str::from_utf8(a).is_err()) {
            map.serialize_entry("argv_b64", &Base64List(&self.0))?;
        }
        map.end()
    }
}
