//! The report's "Where leaks were spawned" table: one row per spawn site, most flags first.
use std::fmt::Write as _;

use super::esc;
use crate::report::audit::Audit;

/// Rows shown (the rest are counted).
const ROWS: usize = 100;

pub(super) fn leak_sites(h: &mut String, a: &Audit) {
    h.push_str(
        "<table id=\"site-table\" class=\"sortable\"><thead><tr><th>flags</th><th>spawned at</th>\
         <th>reasons</th><th>processes</th></tr></thead><tbody>\n",
    );
    let sites = a.leak_sites.by_count();
    for site in sites.iter().take(ROWS) {
        let reasons: Vec<String> = site
            .reasons
            .iter()
            .map(|(r, n)| format!("{} {n}", esc(r)))
            .collect();
        let pids: Vec<String> = site.pids.iter().map(u32::to_string).collect();
        let _ = writeln!(
            h,
            "<tr><td class=\"num\" data-sort=\"{0}\">{0}</td><td><code>{1}</code></td>\
             <td>{2}</td><td>{3}</td></tr>",
            site.flags(),
            esc(&site.site),
            reasons.join(", "),
            pids.join(", ")
        );
    }
    h.push_str("</tbody></table>\n");
    let more = sites.len().saturating_sub(ROWS) as u64 + a.leak_sites.omitted;
    if more > 0 {
        let _ = writeln!(h, "<p>and {more} more sites.</p>");
    }
}
