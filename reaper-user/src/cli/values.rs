//! What the value of an option of `reaper-trace` reads as: durations, sizes, addresses,
//! rules, groups and names, each refused with a message that says what was expected.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{Api, KillReasons};
use crate::leaks::Reason;

pub(super) fn parse_api(s: &str) -> Result<Api, String> {
    Ok(match s {
        "auto" => Api::Auto,
        "off" => Api::Off,
        "" => return Err("a socket path, `auto` or `off`".into()),
        path => Api::At(PathBuf::from(path)),
    })
}

/// `--api-group`: a group's name or number, as its gid.
pub(super) fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(s) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(format!("no group named `{s}`")),
        // No group database at all (a bare container) is no such group either.
        Err(e) => Err(format!("no group named `{s}` (looking it up: {e})")),
    }
}

/// `orphaned,deaf`: names of rules a kill may follow; zombies cannot be killed.
pub fn parse_kill_reasons(s: &str) -> Result<KillReasons, String> {
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim) {
        match crate::leaks::rules::killable(name) {
            Some(r) if !out.contains(&r) => out.push(r),
            Some(_) => {}
            None if name == "zombie" => {
                return Err(
                    "zombies cannot be killed (they are dead already): their parent \
                            must reap them; it is named in the zombie flag's lineage"
                        .into(),
                );
            }
            None => {
                let killable = crate::leaks::rules::killable_names().join(", ");
                return Err(format!("`{name}` is not a reason to kill (use {killable})"));
            }
        }
    }
    Ok(KillReasons(out))
}

/// A `--session-env` name: a variable's name (letters, digits, `_`; not starting with a
/// digit), or `none`.
pub fn parse_session_env(s: &str) -> Result<String, String> {
    let name = s.trim();
    let letter = |c: char| c.is_ascii_alphabetic() || c == '_';
    let mut chars = name.chars();
    match chars.next() {
        Some(first) if letter(first) && chars.all(|c| letter(c) || c.is_ascii_digit()) => {
            Ok(name.to_owned())
        }
        _ => Err(format!(
            "`{s}` is not a variable's name (letters, digits and _, like AGENT_SESSION_ID), nor \
             `none`"
        )),
    }
}

/// A rule's name (`orphaned`, `accumulating`, ...), as its flags carry it.
pub fn parse_reason(s: &str) -> Result<Reason, String> {
    let rules = crate::leaks::rules::TABLE;
    match rules.iter().find(|r| r.reason.name() == s.trim()) {
        Some(rule) => Ok(rule.reason),
        None => {
            let names: Vec<&str> = rules.iter().map(|r| r.reason.name()).collect();
            Err(format!("`{s}` is not a rule (use {})", names.join(", ")))
        }
    }
}

/// `30s`, `10m`, `2h`, `1ms`, `1h30m`; a bare `0` means zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let not_one = |e: String| format!("`{s}` is not a duration like 30s, 10m or 2h ({e})");
    // humantime 2.4 panics rather than fail when its running total reaches u64::MAX seconds
    // with its nanoseconds at exactly one second (`18446744073709551615s 1000000000ns`;
    // chronotope/humantime#66). One piece alone never carries a second into a full total,
    // so each piece is read alone and the sum is checked here.
    duration_pieces(text).try_fold(Duration::ZERO, |sum, piece| {
        let part = humantime::parse_duration(piece).map_err(|e| match piece == text {
            true => not_one(e.to_string()),
            false => not_one(format!("`{}`: {e}", piece.trim())),
        })?;
        sum.checked_add(part)
            .ok_or_else(|| format!("`{s}` is too long a duration"))
    })
}

/// A duration's pieces as humantime reads them: a number (digits, maybe a fraction; spaces
/// inside are skipped) and its unit, the next piece beginning at the first digit after a unit.
/// A blank text is one (empty) piece, so humantime names what is wrong with it.
fn duration_pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut in_unit = false;
        let end = rest.char_indices().find_map(|(i, c)| {
            in_unit |= matches!(c, 'a'..='z' | 'A'..='Z' | 'µ');
            (in_unit && c.is_ascii_digit()).then_some(i)
        });
        let (piece, next) = rest.split_at(end.unwrap_or(rest.len()));
        rest = next;
        done = rest.is_empty();
        Some(piece)
    })
}

/// A byte size like `16MiB`, `8M`, `64KiB` or `4096`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 16MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}` (use KiB, MiB or GiB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// A ring-buffer size: a power of two of at least one page (what the kernel accepts).
pub fn parse_ring_size(s: &str) -> Result<u32, String> {
    let bytes = parse_size(s)?;
    if bytes < 4096 || !bytes.is_power_of_two() || bytes > 1 << 30 {
        return Err(format!("`{s}` must be a power of two from 4KiB to 1GiB"));
    }
    Ok(bytes as u32)
}

/// A rotation size: at least 4KiB (smaller files would rotate at nearly every event).
pub fn parse_rotate_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s)?;
    if bytes < 4096 {
        return Err(format!("`{s}` is below the smallest rotation size, 4KiB"));
    }
    Ok(bytes)
}

/// `127.0.0.1:9464`, `[::1]:9464`, or `localhost:9464` (loopback).
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Some(port) = t.strip_prefix("localhost:") {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{s}`: `{port}` is not a port number"))?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    t.parse().map_err(|_| {
        format!("`{s}` is not an address to listen on, like 127.0.0.1:9464 or [::1]:9464")
    })
}
