//! `reaper-trace top`: a live full-screen view of a running audit, refreshed from its API:
//! the gateways with their live descendants and the memory they hold, the kinds with the
//! most live instances and how their counts went over the last minutes, and the flags or
//! the agent sessions; a flagged process selected shows its `why`, a session what it left;
//! `k` ends the one selected through the run's kill protocol once a confirmation line has
//! named what will be signalled. Drawn with ratatui in whatever the terminal is (80x24 over
//! SSH is enough); no colours with `NO_COLOR`.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, List, ListItem, ListState, Paragraph, Wrap};
use ratatui::{DefaultTerminal, Frame};

use super::client::{get, kill, readable, sessions};
use super::{KillRequest, Process, Sessions, name_session};
use crate::procfs::boottime_now;
use crate::stream::answer::SessionRow;
use crate::stream::words::human_duration;
use crate::text::escape_for_terminal;

mod kill_line;
mod snapshot;
mod trends;

use kill_line::{CONFIRM_FOR, Confirm, confirmation, outcome};
use snapshot::{FlagRow, Snapshot, TREE_EVERY, snapshot};
use trends::Trends;

/// A live view of a running audit: its gateways, kinds, and flags or sessions (`s` switches);
/// select one (↑↓) to see its `why` or what the session left (Enter), or to end it (`k`, then
/// `y` on the line naming what will be signalled; root only); with several runs, Tab shows
/// the next; `q` quits.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace top", version = crate::cli::VERSION)]
pub struct TopCli {
    /// The run's API socket (default: every run in /run/reaper-trace, one at a time).
    #[arg(long, value_name = "SOCKET")]
    pub api: Option<PathBuf>,
    /// How often the view is refreshed.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = crate::cli::parse_duration)]
    pub every: Duration,
}

/// Runs the view until `q`; the terminal is given back as it was.
pub async fn top(cli: &TopCli) -> Result<i32> {
    let sockets = match &cli.api {
        Some(path) => vec![path.clone()],
        None => super::sockets::live()?,
    };
    if sockets.is_empty() {
        bail!(
            "no reaper-trace run serves its API in {}",
            super::SOCKET_DIR
        );
    }
    // Asked once before the screen is taken: a run that cannot be asked is an error in the
    // shell, not a blank screen.
    let first = snapshot(&sockets[0], true).await?;
    let mut terminal = ratatui::init();
    let result = View::new(sockets, first, cli.every)
        .run(&mut terminal)
        .await;
    ratatui::restore();
    result.map(|()| 0)
}

/// What the lower part of the screen lists.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pane {
    Flags,
    Sessions,
}

/// A selected row, by what it shows.
enum Selected {
    Pid(u32),
    Session(Vec<u8>),
}

/// How long `top` waits for the run to answer a question (a run that hangs must not freeze
/// the screen: `q` still quits).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// `asking`, given up after [`ANSWER_WITHIN`].
async fn within<T>(asking: impl Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(ANSWER_WITHIN, asking).await {
        Ok(answer) => answer,
        Err(_) => bail!("no answer within {}s", ANSWER_WITHIN.as_secs()),
    }
}

struct View {
    /// The runs that may be shown, and the one shown.
    sockets: Vec<PathBuf>,
    shown: usize,
    now: Snapshot,
    trends: Trends,
    every: Duration,
    pane: Pane,
    selected: ListState,
    /// The selected process's `why` or session's processes, while it is shown.
    why: Option<String>,
    /// A kill waiting for its confirmation, named on the line at the foot.
    confirm: Option<Confirm>,
    /// The line at the foot: a kill's confirmation or outcome, until the next key.
    said: Option<String>,
    /// Why the last refresh failed (the screen keeps the one before).
    trouble: Option<String>,
    refreshes: u64,
    colour: bool,
}

impl View {
    fn new(sockets: Vec<PathBuf>, now: Snapshot, every: Duration) -> View {
        let mut trends = Trends::default();
        trends.add(Instant::now(), &now.kinds);
        View {
            sockets,
            shown: 0,
            now,
            trends,
            every,
            pane: Pane::Flags,
            selected: ListState::default().with_selected(Some(0)),
            why: None,
            confirm: None,
            said: None,
            trouble: None,
            refreshes: 0,
            colour: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    async fn run(mut self, terminal: &mut DefaultTerminal) -> Result<()> {
        let mut next = Instant::now() + self.every;
        loop {
            terminal.draw(|f| self.draw(f)).context("drawing")?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait).context("reading the terminal")? {
                if let Event::Key(key) = event::read().context("reading the terminal")? {
                    if key.kind != KeyEventKind::Press {
                        continue;
                    }
                    // A confirmation line takes the next key: `y` kills, any other cancels.
                    if let Some(confirm) = self.confirm.take() {
                        self.said = Some(match key.code {
                            KeyCode::Char('y') if confirm.named.elapsed() > CONFIRM_FOR => {
                                "the confirmation expired: nothing sent (k asks again)".into()
                            }
                            KeyCode::Char('y') => self.kill(confirm.pids).await,
                            _ => "kill cancelled: nothing sent".into(),
                        });
                        continue;
                    }
                    self.said = None;
                    match key.code {
                        KeyCode::Char('q') => return Ok(()),
                        KeyCode::Esc => self.why = None,
                        // The list is hidden while a panel is shown: its selection stays.
                        KeyCode::Down if self.why.is_none() => self.selected.select_next(),
                        KeyCode::Up if self.why.is_none() => self.selected.select_previous(),
                        KeyCode::Enter => self.toggle_why().await,
                        KeyCode::Char('s') => self.switch_pane(),
                        KeyCode::Char('k') => self.propose_kill().await,
                        KeyCode::Tab if self.sockets.len() > 1 => {
                            self.show_next().await;
                            next = Instant::now() + self.every;
                        }
                        _ => {}
                    }
                }
                continue;
            }
            // A refresh that fails (the run ended) says so on the screen and tries again.
            self.refreshes += 1;
            let whole = self.refreshes.is_multiple_of(TREE_EVERY);
            match within(snapshot(self.socket(), whole)).await {
                Ok(mut s) => {
                    self.trends.add(Instant::now(), &s.kinds);
                    if !whole {
                        s.gateways = std::mem::take(&mut self.now.gateways);
                        s.flags = std::mem::take(&mut self.now.flags);
                        s.sessions = std::mem::take(&mut self.now.sessions);
                    }
                    let selected = self.selected_key();
                    (self.now, self.trouble) = (s, None);
                    self.select(selected);
                }
                Err(e) => self.trouble = Some(format!("{e:#}")),
            }
            next = Instant::now() + self.every;
        }
    }

    /// The socket of the run shown.
    fn socket(&self) -> &std::path::Path {
        &self.sockets[self.shown]
    }

    /// Shows the next run: asked at once, its own trends from now on.
    async fn show_next(&mut self) {
        self.shown = (self.shown + 1) % self.sockets.len();
        (self.why, self.trends, self.confirm) = (None, Trends::default(), None);
        self.selected.select(Some(0));
        match within(snapshot(self.socket(), true)).await {
            Ok(s) => {
                self.trends.add(Instant::now(), &s.kinds);
                (self.now, self.trouble) = (s, None);
            }
            Err(e) => {
                self.now = Snapshot::default();
                self.trouble = Some(format!("{e:#}"));
            }
        }
    }

    /// Lists the sessions instead of the flags, or back.
    fn switch_pane(&mut self) {
        self.pane = match self.pane {
            Pane::Flags => Pane::Sessions,
            Pane::Sessions => Pane::Flags,
        };
        self.why = None;
        self.selected.select(Some(0));
    }

    /// What is selected, by pid or by session value: rows move as a refresh finds others.
    fn selected_key(&self) -> Option<Selected> {
        match self.pane {
            Pane::Flags => self.selected_flag().map(|f| Selected::Pid(f.pid)),
            Pane::Sessions => {
                (self.selected_session()).map(|s| Selected::Session(s.session.id.bytes().to_vec()))
            }
        }
    }

    /// Selects `key`'s row again where it is now (the selection stays put when it is gone).
    fn select(&mut self, key: Option<Selected>) {
        let at = match &key {
            Some(Selected::Pid(pid)) => self.now.flags.iter().position(|f| f.pid == *pid),
            Some(Selected::Session(id)) => (self.now.sessions.sessions.iter())
                .position(|s| s.session.id.bytes() == id.as_slice()),
            None => None,
        };
        if let Some(at) = at {
            self.selected.select(Some(at));
        }
    }

    /// The selected session's row, in the sessions' pane.
    fn selected_session(&self) -> Option<&SessionRow> {
        let i = self.selected.selected()?;
        (self.pane == Pane::Sessions)
            .then(|| self.now.sessions.sessions.get(i))
            .flatten()
    }

    /// The selected flag's row, in the flags' pane.
    fn selected_flag(&self) -> Option<&FlagRow> {
        let i = self.selected.selected()?;
        (self.pane == Pane::Flags)
            .then(|| self.now.flags.get(i))
            .flatten()
    }

    /// What `k` asks to end: the selected process (with its live descendants), or the
    /// selected session's processes (its owner apart, as `kill --session`).
    fn kill_request(&self) -> Option<KillRequest> {
        if let Some(flag) = self.selected_flag() {
            return Some(KillRequest {
                pids: Some(flag.pid.to_string()),
                ..KillRequest::default()
            });
        }
        let (session, session_b64) = name_session(self.selected_session()?.session.id.bytes());
        Some(KillRequest {
            session,
            session_b64,
            ..KillRequest::default()
        })
    }

    /// `k`: asks the run what the kill of the selection would signal (a dry run) and names
    /// it on the confirmation line; nothing is sent before `y`, which asks for exactly the
    /// processes named, by pid (the run checks each again then).
    async fn propose_kill(&mut self) {
        let Some(request) = self.kill_request() else {
            return;
        };
        let dry = KillRequest {
            dry_run: true,
            ..request.clone()
        };
        let answer = match within(kill::ask(self.socket(), &dry)).await {
            Ok((answer, _)) => answer,
            Err(e) => {
                self.said = Some(format!("kill: {e:#}"));
                return;
            }
        };
        match confirmation(&answer) {
            Some((pids, line)) => {
                self.said = Some(line);
                self.confirm = Some(Confirm {
                    pids,
                    named: Instant::now(),
                });
            }
            None => self.said = Some(outcome(&answer)),
        }
    }

    /// Asks the run for a confirmed kill of `pids`: what it did, on one line.
    async fn kill(&mut self, pids: Vec<u32>) -> String {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let request = KillRequest {
            pids: Some(pids.join(",")),
            ..KillRequest::default()
        };
        match within(kill::ask(self.socket(), &request)).await {
            Ok((answer, _)) => outcome(&answer),
            Err(e) => format!("kill: {e:#}"),
        }
    }

    async fn toggle_why(&mut self) {
        if self.why.take().is_some() {
            return;
        }
        if let Some(row) = self.selected_session() {
            let one = Sessions {
                now: self.now.sessions.now,
                sessions: vec![row.clone()],
            };
            self.why = Some(sessions::render(&one, "", Some(boottime_now())));
            return;
        }
        let Some(pid) = self.selected_flag().map(|row| row.pid) else {
            return;
        };
        let path = format!("/v1/process/{pid}");
        self.why = Some(match within(get(self.socket(), &path)).await {
            Ok((status, body)) if status.is_success() => {
                match serde_json::from_slice::<Process>(&body) {
                    Ok(p) => readable(&p),
                    Err(e) => format!("pid {pid}: an answer not understood: {e}"),
                }
            }
            Ok((status, _)) => format!("pid {pid}: {status} (it ended?)"),
            Err(e) => format!("pid {pid}: {e:#}"),
        });
    }

    fn style(&self, colour: Color) -> Style {
        match self.colour {
            true => Style::default().fg(colour).add_modifier(Modifier::BOLD),
            false => Style::default().add_modifier(Modifier::BOLD),
        }
    }

    fn draw(&mut self, f: &mut Frame) {
        let s = &self.now.status;
        let gateways = self.now.gateways.len().clamp(1, 6) as u16 + 1;
        let kinds = self.now.kinds.len().clamp(1, 5) as u16 + 1;
        // A kill's line may name many processes: up to three lines, wrapped.
        let foot_lines = match &self.said {
            Some(said) => (said.chars().count() / f.area().width.max(1) as usize + 1).min(3),
            None => 1,
        };
        let [head, gw_area, kind_area, flag_area, foot] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(gateways),
            Constraint::Length(kinds),
            Constraint::Min(3),
            Constraint::Length(foot_lines as u16),
        ])
        .areas(f.area());
        let mut title = match &self.trouble {
            Some(trouble) => format!("reaper-trace {}: {trouble}", s.pid),
            None => format!(
                "reaper-trace {}: up {}, {} tracked, {} flagged",
                s.pid,
                human_duration(s.uptime_secs.saturating_mul(1_000_000_000)),
                s.tracked,
                self.now.flags.len()
            ),
        };
        if self.sockets.len() > 1 {
            let n = self.sockets.len();
            title.push_str(&format!(" (run {} of {n}, Tab: the next)", self.shown + 1));
        }
        f.render_widget(Line::styled(title, self.style(Color::Cyan)), head);

        let mut lines = vec![Line::styled(
            format!("{:<52} {:>11} {:>12}", "GATEWAY", "DESCENDANTS", "RSS"),
            self.style(Color::Yellow),
        )];
        lines.extend(self.now.gateways.iter().map(|g| {
            Line::raw(format!(
                "{:<52} {:>11} {:>8} MiB",
                clip(&g.text, 52),
                g.descendants,
                g.rss_kib / 1024
            ))
        }));
        if self.now.gateways.is_empty() {
            lines.push(Line::raw("no gateway alive"));
        }
        f.render_widget(Paragraph::new(lines), gw_area);

        let mut lines = vec![Line::styled(
            format!("{:>9}  {:<10}  {}", "INSTANCES", "LAST 5 MIN", "KIND"),
            self.style(Color::Yellow),
        )];
        let at = Instant::now();
        lines.extend(self.now.kinds.iter().map(|k| {
            Line::raw(format!(
                "{:>9}  {}  {}",
                k.instances,
                self.trends.of(&k.kind, at),
                clip(
                    &escape_for_terminal(program_by_file_name(&k.kind).as_bytes()),
                    56
                )
            ))
        }));
        if self.now.kinds.is_empty() {
            lines.push(Line::raw("no kind counted yet"));
        }
        f.render_widget(Paragraph::new(lines), kind_area);

        match &self.why {
            Some(text) => {
                let title = match self.pane {
                    Pane::Flags => " why (Esc or Enter: back) ",
                    Pane::Sessions => " session (Esc or Enter: back) ",
                };
                let block = Block::bordered().title(title);
                let why = Paragraph::new(text.as_str())
                    .block(block)
                    .wrap(Wrap { trim: false });
                f.render_widget(why, flag_area);
            }
            None => {
                let (title, rows) = match self.pane {
                    Pane::Flags => ("FLAGS (s: sessions)", self.flag_rows()),
                    Pane::Sessions => ("SESSIONS (s: flags)", self.session_rows()),
                };
                let list = List::new(rows.into_iter().map(ListItem::new))
                    .block(Block::new().title(Line::styled(title, self.style(Color::Yellow))))
                    .highlight_style(Style::default().add_modifier(Modifier::REVERSED));
                f.render_stateful_widget(list, flag_area, &mut self.selected);
            }
        }
        match &self.said {
            Some(said) => {
                let said = Paragraph::new(said.as_str())
                    .style(self.style(Color::Red))
                    .wrap(Wrap { trim: false });
                f.render_widget(said, foot);
            }
            None => {
                let help = "q quit  ↑↓ select  Enter why  s flags/sessions  k kill  Esc back";
                f.render_widget(Line::raw(help), foot);
            }
        }
    }

    /// The flags' pane: a line a flagged process.
    fn flag_rows(&self) -> Vec<String> {
        match self.now.flags.is_empty() {
            true => vec!["no flag holds".into()],
            false => self.now.flags.iter().map(|r| r.text.clone()).collect(),
        }
    }

    /// The sessions' pane: a line a session, whether it ended, what of it is alive and
    /// flagged, and its memory.
    fn session_rows(&self) -> Vec<String> {
        let answer = &self.now.sessions;
        if answer.sessions.is_empty() {
            return vec!["no live process is in an agent session".into()];
        }
        let now = boottime_now().max(answer.now);
        (answer.sessions.iter())
            .map(|s| {
                let state = match s.session.ended {
                    Some(ended) => {
                        format!("ENDED {} ago", human_duration(now.saturating_sub(ended)))
                    }
                    None => "running".into(),
                };
                format!(
                    "{:<24} {:<16} {:>4} alive {:>3} flagged {:>6} MiB",
                    clip(&s.session.id.for_terminal(), 24),
                    clip(&state, 16),
                    s.alive.len(),
                    s.flagged.len(),
                    s.rss_kib / 1024
                )
            })
            .collect()
    }
}

/// A command line (a kind's, a gateway's) as the narrow columns show it: its program by file
/// name (`/usr/bin/node server.js` is `node server.js`), the width left to the arguments,
/// which tell kinds and gateways apart. A deep install path would otherwise push them past
/// the column's end.
fn program_by_file_name(command: &str) -> &str {
    let program = &command[..command.find(' ').unwrap_or(command.len())];
    match program.rfind('/') {
        Some(slash) => &command[slash + 1..],
        None => command,
    }
}

/// At most `width` characters of `text`.
fn clip(text: &str, width: usize) -> String {
    match text.chars().count() > width {
        true => text
            .chars()
            .take(width.saturating_sub(1))
            .chain(['…'])
            .collect(),
        false => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_is_shown_with_its_program_by_file_name() {
        let deep = "/check/work/main/target/debug/reaper-shapes stdio-server --session-key *";
        assert_eq!(
            program_by_file_name(deep),
            "reaper-shapes stdio-server --session-key *"
        );
        assert_eq!(program_by_file_name("/usr/bin/node"), "node");
        assert_eq!(program_by_file_name("npx -y srv/a b/c"), "npx -y srv/a b/c");
        assert_eq!(program_by_file_name(""), "");
    }
}
