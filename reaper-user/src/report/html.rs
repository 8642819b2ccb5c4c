//! The report page: one self-contained HTML file (inline CSS, inline SVG plots, a few lines of
//! inline script for sorting), nothing fetched. Every string from the audit is escaped, and
//! control and bidi characters are shown as escapes, as on a terminal.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::audit::{Audit, FlagRow, LiveProc, MAX_ARGV_CHARS, OTHER_EXECUTABLES};
use crate::stream::evidence::ESCAPED_MEANING;
use crate::stream::words::{human_duration, human_rss};
use crate::text::{escape_for_terminal, escape_markup};

mod plots;
mod sites;

/// Text from a process, safe in HTML text and attributes.
fn esc(s: &str) -> String {
    escape_markup(&escape_for_terminal(s.as_bytes()))
}

fn short(s: &str) -> String {
    match s.char_indices().nth(MAX_ARGV_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn at(audit: &Audit, ts: u64) -> String {
    let start = audit.first_ts.unwrap_or(ts);
    format!("+{}", human_duration(ts.saturating_sub(start)))
}

const STYLE: &str = "
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3;cursor:pointer;user-select:none}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px ui-monospace,monospace}
pre.tree{background:#f8f8f8;padding:1em;overflow-x:auto}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 1.5em}
.warn{color:#a40}
svg text{font:11px sans-serif;fill:#444}
.legend span{margin-right:1.5em}
.sw{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:4px}
";

/// Sorts a table by the clicked column (numbers numerically), then marks the page ready.
const SCRIPT: &str = "
document.querySelectorAll('table.sortable th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var dir = th.dataset.dir === 'asc' ? -1 : 1;
    th.dataset.dir = dir === 1 ? 'asc' : 'desc';
    var key = function (r) {
      var c = r.cells[col];
      return c && c.dataset.sort !== undefined ? Number(c.dataset.sort) : (c ? c.textContent : '');
    };
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
document.body.dataset.ready = 'yes';
";

/// Renders the whole page.
pub fn render(audit: &Audit, title: &str) -> String {
    let mut h = String::with_capacity(64 << 10);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>reaper audit: {}</title><style>{STYLE}</style></head><body>\n",
        esc(title)
    );
    let _ = writeln!(h, "<h1>reaper audit: {}</h1>", esc(title));
    facts(&mut h, audit);
    h.push_str("<h2 id=\"timeline\">Timeline</h2>\n");
    plots::timeline(&mut h, audit);
    if !audit.instances.is_empty() {
        h.push_str("<h2 id=\"instances\">Gateway instances</h2>\n");
        instances(&mut h, audit);
    }
    let _ = writeln!(
        h,
        "<h2 id=\"leaks\">Leaks ({} flags)</h2>",
        audit.flags.len() as u64 + audit.flags_omitted
    );
    leak_table(&mut h, audit);
    if !audit.leak_sites.sites.is_empty() {
        h.push_str("<h2 id=\"sites\">Where leaks were spawned</h2>\n");
        sites::leak_sites(&mut h, audit);
    }
    if !audit.crowds.kinds.is_empty() {
        h.push_str("<h2 id=\"accumulating\">Kinds that accumulated</h2>\n");
        plots::crowds(&mut h, audit);
    }
    h.push_str("<h2 id=\"tree\">Alive at the end, by lineage</h2>\n");
    tree(&mut h, audit);
    h.push_str("<h2 id=\"executables\">By executable</h2>\n");
    executables(&mut h, audit);
    let _ = write!(h, "<script>{SCRIPT}</script>\n</body></html>\n");
    h
}

fn facts(h: &mut String, a: &Audit) {
    let span = a.last_ts.saturating_sub(a.first_ts.unwrap_or(a.last_ts));
    let events: Vec<String> = a.events.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let gateways: Vec<String> = a.gateways.iter().map(u32::to_string).collect();
    h.push_str("<div class=\"facts\">\n");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(h, "<b>{k}</b><span>{v}</span>");
    };
    row("span", esc(&human_duration(span)));
    row("gateways at start", esc(&gateways.join(", ")));
    if !a.instances.is_empty() {
        let total = a.instances.len() as u64 + a.instances_omitted;
        row(
            "gateway instances",
            format!("{total} ({} after the start)", restarts(a).count()),
        );
    }
    row("kernel", esc(a.kernel.as_deref().unwrap_or("unknown")));
    row("lines", a.lines.to_string());
    row("events", esc(&events.join(", ")));
    row("lost", a.lost.to_string());
    row("alive at the end", format!("{} processes", a.live.len()));
    if !a.kills.is_empty() {
        let kills: Vec<String> = a
            .kills
            .iter()
            .map(|((reason, result), n)| format!("{reason}/{result} {n}"))
            .collect();
        row("kill steps", esc(&kills.join(", ")));
    }
    if !a.complete {
        row(
            "<span class=\"warn\">incomplete</span>",
            "no closing summary: the audit was cut short (tracer killed, or still running)".into(),
        );
    }
    if a.live_omitted > 0 {
        row(
            "<span class=\"warn\">not followed</span>",
            format!(
                "{} processes beyond the {} alive at once this page follows",
                a.live_omitted,
                super::audit::MAX_LIVE
            ),
        );
    }
    if a.unreadable > 0 {
        row(
            "<span class=\"warn\">unreadable</span>",
            format!(
                "{} lines were not events (first: line {})",
                a.unreadable,
                a.first_unreadable.unwrap_or(0)
            ),
        );
    }
    h.push_str("</div>\n");
}

/// Instances that appeared after the audit began (restarts, new containers): marked on the
/// timeline.
fn restarts(a: &Audit) -> impl Iterator<Item = &super::audit::Instance> {
    let first = a.timeline.points().first().map_or(0, |p| p.ts);
    let ready = a.first_ts.unwrap_or(0);
    a.instances.iter().filter(move |i| i.ts > ready.max(first))
}

/// Says that a table lists only the first `listed` of its `what` (a bounded audit).
fn omitted_note(h: &mut String, what: &str, listed: usize, omitted: u64) {
    if omitted > 0 {
        let _ = writeln!(
            h,
            "<p class=\"warn\">The first {listed} {what} are listed; {omitted} more were counted \
             only.</p>"
        );
    }
}

/// Each gateway instance: when it came and went, which selector found it, what it leaked.
fn instances(h: &mut String, a: &Audit) {
    omitted_note(h, "instances", a.instances.len(), a.instances_omitted);
    h.push_str(
        "<table id=\"instance-table\" class=\"sortable\"><thead><tr><th>#</th><th>pid</th>\
         <th>selector</th><th>process</th><th>became a gateway</th><th>exited</th>\
         <th>flags</th></tr></thead><tbody>\n",
    );
    for (n, i) in a.instances.iter().enumerate() {
        let exited = i
            .exited
            .map_or("alive at the end".to_owned(), |ts| at(a, ts));
        let _ = writeln!(
            h,
            "<tr><td class=\"num\" data-sort=\"{n}\">{}</td><td class=\"num\" data-sort=\"{}\">{}</td>\
             <td>{}</td><td><b>{}</b><br><code>{}</code></td><td data-sort=\"{}\">{}</td>\
             <td>{}</td><td class=\"num\" data-sort=\"{}\">{}</td></tr>",
            n + 1,
            i.pid,
            i.pid,
            esc(&i.selector),
            esc(&i.comm),
            esc(&short(&i.argv)),
            i.ts,
            esc(&at(a, i.ts)),
            esc(&exited),
            i.flags,
            i.flags
        );
    }
    h.push_str("</tbody></table>\n");
}

fn leak_table(h: &mut String, a: &Audit) {
    if a.flags.is_empty() {
        h.push_str("<p id=\"no-leaks\">No process was flagged.</p>\n");
        return;
    }
    omitted_note(h, "flags", a.flags.len(), a.flags_omitted);
    h.push_str(
        "<table id=\"leak-table\" class=\"sortable\"><thead><tr><th>flagged</th><th>pid</th>\
         <th>reason</th><th>process</th><th>RSS</th><th>lineage (gateway first)</th>\
         <th>evidence</th><th>outcome</th><th>gateway instance</th></tr></thead><tbody>\n",
    );
    // Grouped by the instance that spawned them, in time within one.
    let mut rows: Vec<&FlagRow> = a.flags.iter().collect();
    rows.sort_by_key(|f| (f.instance.map_or(usize::MAX, |i| i), f.ts));
    for f in rows {
        flag_row(h, a, f);
    }
    h.push_str("</tbody></table>\n");
}

fn flag_row(h: &mut String, a: &Audit, f: &FlagRow) {
    let d = &f.flag.detail;
    let escaped = match d.escaped {
        true => format!("<br>escaped ({})", esc(ESCAPED_MEANING)),
        false => String::new(),
    };
    let process = format!(
        "<b>{}</b><br><code>{}</code>{escaped}",
        esc(&d.comm.text()),
        esc(&short(&d.argv.text())),
    );
    let mut lineage = String::new();
    for anc in &d.ancestors {
        let state = match anc.exited {
            Some(ts) => format!("exited {}", at(a, ts)),
            None => "alive".into(),
        };
        let _ = write!(
            lineage,
            "{} ({}) <i>{}</i><br>",
            anc.process.pid,
            esc(&anc.process.comm.text()),
            esc(&state)
        );
    }
    let mut evidence = format!("state {}, parent {}", esc(&d.state), d.ppid);
    if let Some(idle) = f.flag.idle_secs {
        let _ = write!(
            evidence,
            ", idle {}",
            esc(&human_duration((idle * 1e9) as u64))
        );
    }
    if d.chain.len() > 1 {
        let members: Vec<String> = d
            .chain
            .iter()
            .map(|m| format!("{} ({})", m.pid, esc(&m.comm.text())))
            .collect();
        let _ = write!(evidence, "<br>server {}", members.join(" &gt; "));
    }
    let internal = d.pipes.iter().filter(|p| p.internal).count();
    for p in d.pipes.iter().filter(|p| !p.internal) {
        let holders: Vec<String> = p
            .peers
            .iter()
            .map(|peer| format!("{} ({}) fd {}", peer.pid, esc(&peer.comm.text()), peer.fd))
            .collect();
        let _ = write!(
            evidence,
            "<br>fd {} {} {} end, other end {}{}",
            p.fd,
            esc(&p.kind),
            esc(&p.end),
            esc(&p.other_end),
            match holders.is_empty() {
                true => String::new(),
                false => format!(": {}", holders.join(", ")),
            }
        );
    }
    if internal > 0 {
        let _ = write!(evidence, "<br>{internal} fds of its own internal channels");
    }
    let mut outcome = match &f.cleared {
        Some((ts, because)) => format!("cleared {}: {}", at(a, *ts), esc(because)),
        None => "still holding".into(),
    };
    if let Some((signal, result)) = &f.kill {
        let _ = write!(outcome, "<br>kill: {} {}", esc(signal), esc(result));
    }
    let rss = d.rss_kib.unwrap_or(0);
    let instance = match f
        .instance
        .and_then(|i| a.instances.get(i).map(|inst| (i, inst)))
    {
        Some((i, inst)) => format!(
            "<td class=\"num\" data-sort=\"{i}\">#{} {} ({})</td>",
            i + 1,
            inst.pid,
            esc(&inst.comm)
        ),
        None => "<td data-sort=\"-1\"></td>".to_owned(),
    };
    let _ = writeln!(
        h,
        "<tr><td data-sort=\"{}\">{}</td><td class=\"num\" data-sort=\"{}\">{}</td><td>{}</td>\
         <td>{process}</td><td class=\"num\" data-sort=\"{rss}\">{}</td><td>{lineage}</td>\
         <td>{evidence}</td><td>{outcome}</td>{instance}</tr>",
        f.ts,
        esc(&at(a, f.ts)),
        f.pid,
        f.pid,
        f.reason.name(),
        human_rss(rss),
    );
}

fn tree(h: &mut String, a: &Audit) {
    if a.live.is_empty() {
        h.push_str("<p id=\"spawn-tree\">Nothing traced was alive at the end.</p>\n");
        return;
    }
    // Children by parent along lineage edges; a lineage ancestor that is gone is shown once.
    let mut children: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
    let mut shown: BTreeMap<u32, Option<&LiveProc>> = BTreeMap::new();
    for p in a.live.values() {
        let mut parent = None;
        for &pid in &p.lineage {
            if let std::collections::btree_map::Entry::Vacant(e) = shown.entry(pid) {
                e.insert(a.live.get(&pid));
                children.entry(parent).or_default().push(pid);
            }
            parent = Some(pid);
        }
    }
    let mut text = String::new();
    fn walk(
        text: &mut String,
        children: &BTreeMap<Option<u32>, Vec<u32>>,
        shown: &BTreeMap<u32, Option<&LiveProc>>,
        at: Option<u32>,
        prefix: &str,
    ) {
        let Some(kids) = children.get(&at) else {
            return;
        };
        for (i, pid) in kids.iter().enumerate() {
            let last = i + 1 == kids.len();
            let (branch, next) = match (at.is_none(), last) {
                (true, _) => ("", String::new()),
                (false, true) => ("└─ ", format!("{prefix}   ")),
                (false, false) => ("├─ ", format!("{prefix}│  ")),
            };
            let label = match shown.get(pid).copied().flatten() {
                Some(p) => format!(
                    "{pid} ({}) `{}` [parent {}]",
                    esc(&p.comm),
                    esc(&short(&p.argv)),
                    p.ppid
                ),
                None => format!("{pid} [exited]"),
            };
            let _ = writeln!(text, "{prefix}{branch}{label}");
            walk(text, children, shown, Some(*pid), &next);
        }
    }
    walk(&mut text, &children, &shown, None, "");
    let _ = writeln!(h, "<pre class=\"tree\" id=\"spawn-tree\">{text}</pre>");
}

fn executables(h: &mut String, a: &Audit) {
    let mut rows: Vec<(&String, _)> = a.executables.iter().collect();
    rows.sort_by(|x, y| (y.1.flags, y.1.execs, x.0).cmp(&(x.1.flags, x.1.execs, y.0)));
    h.push_str(
        "<table id=\"exe-table\" class=\"sortable\"><thead><tr><th>executable</th>\
         <th>execs</th><th>flags</th></tr></thead><tbody>\n",
    );
    for (name, c) in rows.iter().take(500) {
        let shown = match name.as_str() {
            OTHER_EXECUTABLES => format!("<i>{}</i>", esc(name)),
            _ => format!("<code>{}</code>", esc(name)),
        };
        let _ = writeln!(
            h,
            "<tr><td>{shown}</td><td class=\"num\" data-sort=\"{0}\">{0}</td>\
             <td class=\"num\" data-sort=\"{1}\">{1}</td></tr>",
            c.execs, c.flags
        );
    }
    h.push_str("</tbody></table>\n");
    if rows.len() > 500 {
        let _ = writeln!(h, "<p>and {} more executables.</p>", rows.len() - 500);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_text_cannot_become_markup() {
        assert_eq!(
            esc("<script>\"x\"&'\u{202e}\n"),
            "&lt;script&gt;&quot;x&quot;&amp;&#39;\\u{202e}\\x0a"
        );
    }

    #[test]
    fn the_page_holds_everything_it_shows_and_fetches_nothing() {
        let audit_text = concat!(
            r#"{"event":"ready","seq":0,"ts":1000000000,"gateway":[10],"tracked":1,"setsid_hook":"tracepoint","kernel":"6.18"}"#,
            "\n",
            r#"{"event":"fork","seq":1,"ts":1100000000,"pid":11,"ppid":10,"spawner":10,"comm":"gw","start":1,"sid":1,"pgid":1,"uid":0,"cgroup_id":1}"#,
            "\n",
            r#"{"event":"exec","seq":2,"ts":1200000000,"pid":11,"filename":"/bin/<evil>","argv":["<img src=x>"],"truncated":false,"tid":11}"#,
            "\n",
            r#"{"event":"flag","seq":3,"ts":3000000000,"pid":11,"reason":"orphaned","since":2,"lineage":[10,11],"ancestors":[{"pid":10,"comm":"gw","argv":["gw"],"exited":2900000000},{"pid":11,"comm":"<evil>","argv":["<img src=x>"],"exited":null}],"chain":[{"pid":11,"comm":"<evil>","argv":["<img src=x>"]},{"pid":13,"comm":"node","argv":["node"]}],"pipes":[{"fd":0,"kind":"pipe","inode":5,"end":"read","other_end":"open","peers":[{"pid":12,"fd":1,"end":"write","comm":"holder"}]},{"fd":4,"kind":"pipe","inode":77,"end":"read","other_end":"open","internal":true,"peers":[]}],"state":"S (sleeping)","rss_kib":2048,"spawned_at":[{"function":"Popen._execute_child","file":"/usr/lib/python3.11/subprocess.py","line":1834,"offset":8,"language":"python"},{"function":"_run_<stdio>","file":"tools/mcp_tool.py","line":812,"offset":4,"language":"python"}],"ppid":1,"escaped":true,"comm":"<evil>","argv":["<img src=x>"]}"#,
            "\n",
            "not json at all\n",
        );
        let audit = Audit::read(audit_text.as_bytes()).unwrap();
        assert_eq!(audit.unreadable, 1);
        assert_eq!(audit.first_unreadable, Some(5));
        let page = render(&audit, "t");
        assert!(page.contains("id=\"plot-counts\"") && page.contains("id=\"leak-table\""));
        assert!(page.contains("12 (holder) fd 1"), "pipe peers shown");
        assert!(
            page.contains("server 11 (&lt;evil&gt;) &gt; 13 (node)"),
            "the server's chain shown"
        );
        assert!(
            page.contains("1 fds of its own internal channels") && !page.contains("fd 4 pipe"),
            "internal channels counted, not listed"
        );
        assert!(page.contains("exited +1s"), "ancestor exit times shown");
        assert!(
            page.contains("id=\"site-table\"")
                && page.contains("<code>_run_&lt;stdio&gt; (mcp_tool.py:812)</code>"),
            "leaks grouped by spawn site, past subprocess's frames"
        );
        assert!(page.contains("2.0 MiB"));
        assert!(
            !page.contains("<img") && !page.contains("<evil>"),
            "nothing from a process is markup"
        );
        assert!(
            !page.contains("://") && !page.contains("src=\"") && !page.contains("href=\""),
            "nothing is fetched"
        );
        assert!(page.contains("incomplete"), "no summary: said so");
    }
}
