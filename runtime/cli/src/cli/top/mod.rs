//! `vigil top`: a full-screen live view of an instance, as `flux top`: the TBON's health, the nodes by state, the
//! queue with pending reasons and the recent liveness verdicts, refreshed every `--delay`.
//!
//! Shape: `model` gathers from rank 0's services into a plain `Model`; `draw` is a pure function of
//! it onto a ratatui frame (tested with ratatui's `TestBackend`); this module runs the loop: a gathering in flight
//! as a task, keys from a thread reading the terminal, and a redraw after each. Enter on a running batch or alloc
//! job reconnects to its instance's URI (the `uri` `job-manager.list` reports, as `vigil proxy` uses it); Esc goes
//! back out.
//!
//! The TUI lives in its own program, `vigil-top`, which `vigil top` executes from its own directory (as a broker
//! finds `vigil-shell`): the `vigil` binary is also every broker, whose idle resident memory follows the size of
//! its code, so the terminal crates stay out of it.
//!
//! Exit codes: 0 on `q`, Ctrl-C, SIGTERM or SIGHUP (the terminal restored); 1 when the instance cannot be reached
//! (at start, or when the connection is lost and cannot be made again), with the same hint as other commands.

mod draw;
pub(crate) mod model;

use self::draw::{Ui, View};
use self::model::{GatherError, Model};
use crate::client::Client;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use std::time::Duration;

/// Options of `vigil top`.
#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// Time between refreshes, an RFC 23 duration (e.g. 1s, 500ms, 2m); at least 100ms.
    #[arg(short = 'd', long, value_name = "DURATION", default_value = "1s", value_parser = parse_delay)]
    pub delay: Delay,
}

/// `--delay` of `vigil top`.
#[derive(Clone, Copy, Debug)]
pub struct Delay(Duration);

/// Parses `--delay`: an RFC 23 duration of at least 100 ms (a usage error, exit 2, otherwise).
fn parse_delay(s: &str) -> Result<Delay, String> {
    let secs = crate::duration::parse_duration_secs(s)
        .ok()
        .filter(|t| t.is_finite())
        .ok_or_else(|| format!("expected a duration such as 1s or 500ms, not '{s}'"))?;
    if secs < 0.1 {
        return Err(format!("'{s}' is shorter than the shortest refresh, 100ms"));
    }
    if secs > 3600.0 {
        return Err(format!("'{s}' is longer than the longest refresh, 1h"));
    }
    Ok(Delay(Duration::from_secs_f64(secs)))
}

/// The `vigil-top` program's command line.
#[derive(clap::Parser, Debug)]
#[command(name = "vigil top", version, about = "Show an instance's tree, nodes, queue and verdicts, live")]
struct TopCli {
    #[command(flatten)]
    args: TopArgs,
}

/// How long one gathering may wait for rank 0 before the screen says it is late.
const GATHER_LIMIT: Duration = Duration::from_secs(5);

/// `vigil top` in the `vigil` binary: execute `vigil-top` from the same directory (else from `PATH`) with the same
/// options; returns only if it cannot be started.
pub(crate) fn exec_top(a: &TopArgs) -> i32 {
    use std::os::unix::process::CommandExt as _;
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("vigil-top")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "vigil-top".into());
    let err = std::process::Command::new(&exe).arg(format!("--delay={}ms", a.delay.0.as_millis())).exec();
    super::fail(format!(
        "cannot run {}: {err} (vigil top is the vigil-top program, built and installed beside vigil)",
        exe.display()
    ))
}

/// Entry point of the `vigil-top` program; returns the process exit code.
pub fn main() -> i32 {
    let cli = <TopCli as clap::Parser>::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return super::fail(format!("cannot start runtime: {e}")),
    };
    rt.block_on(top(cli.args)).unwrap_or_else(super::fail)
}

/// Connect, take the terminal, run the loop, give the terminal back.
async fn top(a: TopArgs) -> Result<i32, String> {
    use std::io::IsTerminal as _;
    // Before the terminal is taken: a failure to connect prints as any command's does.
    let c = super::connect().await?;
    let uri = std::env::var(crate::client::URI_ENV).unwrap_or_default();
    if !std::io::stdout().is_terminal() {
        return Err("vigil top draws on a terminal: standard output is not one (try vigil jobs, vigil resource \
                    status, vigil overlay status)"
            .into());
    }
    // Raw mode and the alternate screen, with a panic hook that restores the terminal before the panic prints.
    let mut term = ratatui::try_init().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    let r = run(&mut term, c, uri, a.delay.0).await;
    ratatui::restore();
    r
}

/// One instance of the descent: its connection, the label shown in the path, and its URI.
struct Level {
    client: Client,
    label: String,
    uri: String,
}

/// What a key asks of the loop.
#[derive(Debug, PartialEq, Eq)]
enum Act {
    /// Nothing beyond a redraw.
    Redraw,
    /// Leave `vigil top`.
    Quit,
    /// Descend into the selected job's instance.
    Descend,
    /// Go back to the enclosing instance.
    Back,
}

/// Apply key `k` to `ui` (`njobs`: rows in the queue).
fn on_key(ui: &mut Ui, k: KeyEvent, njobs: usize) -> Act {
    if k.kind == KeyEventKind::Release {
        return Act::Redraw;
    }
    match k.code {
        KeyCode::Char('q') | KeyCode::Char('Q') => return Act::Quit,
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Act::Quit,
        KeyCode::Tab => ui.view = ui.view.next(),
        KeyCode::BackTab => {
            let i = View::ALL.iter().position(|v| *v == ui.view).unwrap_or(0);
            ui.view = View::ALL[(i + View::ALL.len() - 1) % View::ALL.len()];
        }
        KeyCode::Char(d @ '1'..='5') => ui.view = View::ALL[(d as u8 - b'1') as usize],
        KeyCode::Up | KeyCode::Char('k') => ui.selected = ui.selected.saturating_sub(1),
        KeyCode::Down | KeyCode::Char('j') => ui.selected = (ui.selected + 1).min(njobs.saturating_sub(1)),
        KeyCode::Enter => return Act::Descend,
        KeyCode::Esc | KeyCode::Backspace => return Act::Back,
        _ => {}
    }
    Act::Redraw
}

/// The loop: gather every `delay` (one gathering at a time), redraw after each answer and each key.
async fn run(term: &mut ratatui::DefaultTerminal, c: Client, uri: String, delay: Duration) -> Result<i32, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
    // Reading the terminal blocks: a thread of its own, ending when the loop has gone.
    std::thread::spawn(move || {
        while let Ok(ev) = event::read() {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    let mut term_sig = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut hup_sig = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    let mut stack = vec![Level { client: c, label: "instance".into(), uri }];
    let mut model = Model::default();
    let mut ui = Ui::default();
    let mut tick = tokio::time::interval(delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut inflight: Option<tokio::task::JoinHandle<Result<Model, GatherError>>> = None;
    let mut late_since: Option<std::time::Instant> = None;
    // The notice shown says something of the answers (late, refused): the next good answer clears it.
    let mut gather_notice = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if inflight.is_none() {
                    let c = stack.last().map(|l| l.client.clone()).expect("a level");
                    inflight = Some(tokio::spawn(async move { model::gather(&c, GATHER_LIMIT).await }));
                }
            }
            r = async { inflight.as_mut().expect("guarded").await }, if inflight.is_some() => {
                inflight = None;
                match r.unwrap_or(Err(GatherError::Slow)) {
                    Ok(m) => {
                        model = m;
                        ui.selected = ui.selected.min(model.jobs.len().saturating_sub(1));
                        // A notice about the answers goes with them; one about a key stays until the next key.
                        if std::mem::take(&mut gather_notice) {
                            ui.notice = None;
                        }
                        late_since = None;
                    }
                    Err(GatherError::Slow) => {
                        let since = *late_since.get_or_insert_with(std::time::Instant::now);
                        ui.notice = Some(format!(
                            "no answer from rank 0 for {:.0} s (restarting? its brokers keep requests for it)",
                            (since.elapsed() + GATHER_LIMIT).as_secs_f64()
                        ));
                        gather_notice = true;
                    }
                    Err(GatherError::Refused(why)) => {
                        ui.notice = Some(why);
                        gather_notice = true;
                    }
                    Err(GatherError::Disconnected) => {
                        if stack.len() > 1 {
                            let gone = stack.pop().map(|l| l.label).unwrap_or_default();
                            ui.path.pop();
                            model = Model::default();
                            ui.notice = Some(format!("the instance of job {gone} has ended; back in its parent"));
                            tick.reset_immediately();
                        } else {
                            // Once more, to tell a broker that has gone from a connection that broke.
                            let level = &mut stack[0];
                            match Client::connect(&level.uri).await {
                                Ok(c) => {
                                    level.client = c;
                                    ui.notice = Some("connection lost and made again".into());
                                    tick.reset_immediately();
                                }
                                Err(e) => return Err(format!("lost connection to broker: {}", super::connect_error(&e))),
                            }
                        }
                    }
                }
            }
            ev = keys.recv() => {
                let Some(ev) = ev else { return Ok(0) };
                let Event::Key(k) = ev else {
                    // A resize (or anything else): just draw again.
                    term.draw(|f| draw::draw(f, &model, &ui)).map_err(|e| e.to_string())?;
                    continue;
                };
                if k.kind != KeyEventKind::Release {
                    ui.notice = None;
                }
                match on_key(&mut ui, k, model.jobs.len()) {
                    Act::Quit => return Ok(0),
                    Act::Redraw => {}
                    Act::Descend => match model.jobs.get(ui.selected) {
                        Some(j) if j.uri.is_some() => {
                            let child_uri = j.uri.clone().unwrap_or_default();
                            match Client::connect(&child_uri).await {
                                Ok(child) => {
                                    if let Some(h) = inflight.take() {
                                        h.abort();
                                    }
                                    stack.push(Level { client: child, label: j.id.clone(), uri: child_uri });
                                    ui.path.push(j.id.clone());
                                    ui.selected = 0;
                                    ui.notice = None;
                                    model = Model::default();
                                    tick.reset_immediately();
                                }
                                Err(e) => ui.notice = Some(format!("job {}: {}", j.id, super::connect_error(&e))),
                            }
                        }
                        Some(j) => {
                            ui.notice = Some(format!("job {} is not a running batch or alloc instance", j.id));
                        }
                        None => ui.notice = Some("no job selected".into()),
                    },
                    Act::Back => {
                        if stack.len() > 1 {
                            if let Some(h) = inflight.take() {
                                h.abort();
                            }
                            stack.pop();
                            ui.path.pop();
                            ui.notice = None;
                            model = Model::default();
                            // Back on the job descended into.
                            ui.selected = 0;
                            tick.reset_immediately();
                        }
                    }
                }
            }
            _ = term_sig.recv() => return Ok(0),
            _ = hup_sig.recv() => return Ok(0),
        }
        ui.now = if model.now > 0.0 { model.now } else { crate::broker_now() };
        term.draw(|f| draw::draw(f, &model, &ui)).map_err(|e| e.to_string())?;
    }
}

#[cfg(test)]
mod tests {
    use super::{on_key, parse_delay, Act};
    use crate::cli::top::draw::{Ui, View};
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    #[test]
    fn keys_switch_views_select_and_quit() {
        let mut ui = Ui::default();
        let key = |c| KeyEvent::new(c, KeyModifiers::NONE);
        assert_eq!(on_key(&mut ui, key(KeyCode::Tab), 2), Act::Redraw);
        assert_eq!(ui.view, View::Tree);
        on_key(&mut ui, key(KeyCode::Char('4')), 2);
        assert_eq!(ui.view, View::Queue);
        on_key(&mut ui, key(KeyCode::BackTab), 2);
        assert_eq!(ui.view, View::Nodes);
        for _ in 0..5 {
            on_key(&mut ui, key(KeyCode::Down), 2);
        }
        assert_eq!(ui.selected, 1, "the selection stays on the last job");
        assert_eq!(on_key(&mut ui, key(KeyCode::Enter), 2), Act::Descend);
        assert_eq!(on_key(&mut ui, key(KeyCode::Esc), 2), Act::Back);
        assert_eq!(on_key(&mut ui, key(KeyCode::Char('q')), 2), Act::Quit);
        assert_eq!(on_key(&mut ui, KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL), 2), Act::Quit);
        assert_eq!(on_key(&mut ui, key(KeyCode::Char('c')), 2), Act::Redraw);
    }

    #[test]
    fn delays_are_durations_of_at_least_100ms() {
        assert_eq!(parse_delay("500ms").unwrap().0.as_millis(), 500);
        assert_eq!(parse_delay("2").unwrap().0.as_secs(), 2);
        assert!(parse_delay("10ms").unwrap_err().contains("100ms"));
        assert!(parse_delay("soon").unwrap_err().contains("not 'soon'"));
        assert!(parse_delay("1e30s").unwrap_err().contains("longest refresh, 1h"), "no panic on a huge delay");
    }
}
