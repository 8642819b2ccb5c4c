//! `reaper-trace report` in a real browser: an audit of a real leak, rendered to HTML, loaded
//! by headless Chromium (Debian's, installed by `cargo xtask test`): no console message, the
//! script ran, the plots and the leak table are there. A deliberately broken page shows the
//! check can fail. Not part of the kernel matrix (no browser in the guests; nothing here
//! depends on the kernel beyond making the audit).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use reaper_tests::{Then, pid, reaper_trace, require_root, run_shape_until, scratch};

/// Chromium, or `None` to skip (never under CI=true: the set-up installs it).
fn chromium(test: &str) -> Option<PathBuf> {
    reaper_tests::host_tool("chromium", "chromium", test)
}

/// What the browser made of a page: the DOM after scripts ran, and every console message.
struct Loaded {
    dom: String,
    console: Vec<String>,
}

fn load(browser: &Path, page: &Path, profile: &Path) -> Loaded {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox", // root has no user namespace sandbox here
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    Loaded {
        dom: String::from_utf8_lossy(&out.stdout).into_owned(),
        console,
    }
}

#[test]
fn the_report_of_a_real_leak_renders_in_chromium() {
    let test = "the_report_of_a_real_leak_renders_in_chromium";
    let Some(browser) = chromium(test) else {
        return;
    };
    if !require_root(test) {
        return;
    }
    let dir = scratch("report");
    let audit = dir.join("audit.ndjson");
    let audit_arg = audit.to_str().unwrap().to_owned();
    let (run, truth) = run_shape_until(
        &["--scan-interval", "250ms", "--output", &audit_arg],
        "leak-orphan",
        &[],
        ("the orphan's flag", Then::Release),
        |events| events.iter().any(|e| e["event"] == "flag"),
    );
    assert!(run.status.success(), "{}", run.stderr);
    let orphan = pid(&truth["b"]);
    assert!(!run.all("flag").is_empty(), "the audit has a flag");

    let page = dir.join("report.html");
    let stderr = reaper_tests::render_report(&audit, &page);
    assert!(stderr.contains("wrote"), "{stderr}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("://"),
        "the page names no URL: it fetches nothing"
    );

    let loaded = load(&browser, &page, &dir.join("profile"));
    assert!(loaded.console.is_empty(), "console: {:?}", loaded.console);
    let dom = &loaded.dom;
    assert!(
        dom.contains("data-ready=\"yes\""),
        "the page's script ran to its end"
    );
    for id in [
        "plot-counts",
        "plot-rss",
        "leak-table",
        "spawn-tree",
        "exe-table",
    ] {
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "#{id} is on the page"
        );
    }
    assert!(dom.contains("class=\"series\""), "the plots have lines");
    let table = dom.split("id=\"leak-table\"").nth(1).unwrap();
    let table = table.split("</table>").next().unwrap();
    assert!(
        table.contains(&format!("data-sort=\"{orphan}\">{orphan}</td>")),
        "the orphan {orphan} has a row in the leak table"
    );
    assert!(table.contains("orphaned"));
}

#[test]
fn a_kind_that_accumulated_has_its_section_with_its_count_over_time() {
    let test = "a_kind_that_accumulated_has_its_section_with_its_count_over_time";
    let Some(browser) = chromium(test) else {
        return;
    };
    if !require_root(test) {
        return;
    }
    let dir = scratch("report-accumulating");
    let audit = dir.join("audit.ndjson");
    let audit_arg = audit.to_str().unwrap().to_owned();
    let mut opts = reaper_tests::ACCUMULATING.to_vec();
    opts.extend(["--output", &audit_arg]);
    let (run, _) = run_shape_until(
        &opts,
        "leak-accumulate",
        &[],
        ("3 accumulating flags", Then::Release),
        |events| {
            events
                .iter()
                .filter(|e| e["event"] == "flag" && e["reason"] == "accumulating")
                .count()
                >= 3
        },
    );
    assert!(run.status.success(), "{}", run.stderr);
    let page = dir.join("report.html");
    reaper_tests::render_report(&audit, &page);
    let loaded = load(&browser, &page, &dir.join("profile"));
    assert!(loaded.console.is_empty(), "console: {:?}", loaded.console);
    let dom = &loaded.dom;
    assert!(dom.contains("data-ready=\"yes\""));
    let section = dom
        .split("id=\"accumulating\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no accumulating section"));
    let section = section.split("id=\"tree\"").next().unwrap();
    assert!(
        section.contains("stdio-server --session-key * --model m</code> under gateway"),
        "the kind's pattern: {section}"
    );
    assert!(section.contains("at most 6 alive at once"), "{section}");
    assert!(section.contains("3 older instances flagged"), "{section}");
    assert!(
        section.contains("id=\"plot-kind-0\"") && section.contains("class=\"series\""),
        "its count over time is plotted: {section}"
    );
    assert!(
        !section.contains("stdio-server pool"),
        "the pool at its limit never accumulated"
    );
}

#[test]
fn the_browser_check_catches_a_broken_page() {
    let test = "the_browser_check_catches_a_broken_page";
    let Some(browser) = chromium(test) else {
        return;
    };
    let dir = scratch("broken-page");
    let page = dir.join("broken.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();\
         document.body.dataset.ready = 'yes';</script></body></html>",
    )
    .unwrap();
    let loaded = load(&browser, &page, &dir.join("profile"));
    assert!(
        loaded
            .console
            .iter()
            .any(|l| l.contains("Uncaught ReferenceError")),
        "console: {:?}",
        loaded.console
    );
    assert!(!loaded.dom.contains("data-ready=\"yes\""));
}

#[test]
fn bad_report_inputs_are_clear_errors() {
    let dir = scratch("report-inputs");
    let report = |args: &[&str]| {
        let out = Command::new(reaper_trace())
            .arg("report")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = report(&["missing.ndjson"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot read missing.ndjson"), "{err}");
    std::fs::write(dir.join("notes.txt"), "just some text\nnothing else\n").unwrap();
    let (code, err) = report(&["notes.txt"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("holds no reaper-trace events"), "{err}");
    assert!(!dir.join("report.html").exists(), "no page for no audit");
    let (code, err) = report(&[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("reaper-trace report <AUDIT>"), "{err}");
    // A cut-short last line (a killed tracer) is counted, not fatal.
    std::fs::write(
        dir.join("cut.ndjson"),
        "{\"event\":\"reaped\",\"seq\":0,\"ts\":1,\"pid\":5}\n{\"event\":\"fo",
    )
    .unwrap();
    let (code, err) = report(&["cut.ndjson", "-o", "cut.html"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("1 unreadable lines skipped"), "{err}");
    let page = std::fs::read_to_string(dir.join("cut.html")).unwrap();
    assert!(page.contains("were not events (first: line 2)"));
}
