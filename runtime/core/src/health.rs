//! Node health checks (`health.program`, the counterpart of Slurm's `HealthCheckProgram`): when a broker runs
//! the admin's program, and what it asks rank 0 to do with the answer. Sans-IO, like [`crate::jobs`]: the driver
//! passes the time in (seconds on any monotonic clock), carries out the [`Action`]s drained with
//! [`HealthCheck::poll_action`], and hands back how each run ended ([`HealthCheck::finished`]) and how rank 0
//! answered each request ([`HealthCheck::answered`]).
//!
//! The rules:
//! - **When.** A run at start, then one `health.interval` after each run started (never two at once: a run that
//!   outlasts the interval delays the next). A run still going `health.timeout` after it started is killed with
//!   its process group ([`Action::Kill`]) and counts as a failure.
//! - **Failure.** A non-zero exit, death by a signal, a timeout, or a program that cannot be started (missing,
//!   not executable) fails the check. The reason is [`REASON_PREFIX`] and the first line the program wrote
//!   (standard output and error, the first [`LINE_MAX`] bytes at most), or what happened when it wrote none:
//!   `health check: /tmp full`, `health check: /etc/vigil/hc.sh timed out after 60s`.
//! - **Drain.** A failure asks rank 0 to drain this node with that reason ([`Action::Drain`]; rank 0's
//!   `resource.drain` with `"by": "health"`): a node not drained is drained, one drained by an earlier failure
//!   gets the new reason, one an admin drained keeps the admin's reason ([`crate::jobs::JobCore::health_drain`]).
//! - **Undrain.** A pass asks rank 0 to undrain the node only if a health check drained it ([`Action::Undrain`],
//!   [`crate::jobs::JobCore::health_undrain`]): an admin's drain is never undone. The first result of a broker
//!   that passes asks too, so that a drain by the check of a broker that restarted meanwhile is not left behind.
//!   Rank 0 tells a health check's drain by its reason's prefix ([`REASON_PREFIX`]), which survives a restart of
//!   rank 0 as any drain does.
//! - **Report once.** The same failure run after run asks rank 0 once and is reported once
//!   ([`Action::Report`]); a new reason, a pass after failures, a request rank 0 refused are each reported once.
//!   A request rank 0 did not take (unreachable, refused) is sent again [`RETRY`] later, until it is taken or no
//!   longer wanted.

use std::collections::VecDeque;

/// Default `health.interval`, seconds: Slurm's `HealthCheckInterval` is commonly set to a few minutes; five
/// minutes costs a node one short program run per five minutes and catches a full `/tmp` before many jobs fail.
pub const DEFAULT_INTERVAL: f64 = 300.0;

/// Default `health.timeout`, seconds: a check that takes a minute is hung (a dead NFS mount, a GPU tool that
/// waits for a device that fell off the bus).
pub const DEFAULT_TIMEOUT: f64 = 60.0;

/// Prefix of every drain reason a health check sets: how rank 0 tells its drains from an admin's.
pub const REASON_PREFIX: &str = "health check: ";

/// Most bytes of the program's first output line kept (the driver reads no more; the rest is discarded).
pub const LINE_MAX: usize = 256;

/// Seconds after which a request rank 0 did not take is sent again.
pub const RETRY: f64 = 5.0;

/// What the rule needs of `health.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `health.program`, as shown in reasons.
    pub program: String,
    /// `health.interval`, seconds (> 0).
    pub interval: f64,
    /// `health.timeout`, seconds (> 0).
    pub timeout: f64,
}

/// How one run of the program ended, as the driver saw it (a timeout is the rule's own verdict).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// It exited with this code; `line` is its first output line (empty: none).
    Exited {
        /// Exit code.
        code: i32,
        /// First output line, as read (at most [`LINE_MAX`] bytes, lossy UTF-8).
        line: String,
    },
    /// A signal killed it (not ours).
    Signaled {
        /// Signal number.
        signal: i32,
        /// First output line (empty: none).
        line: String,
    },
    /// It could not be started: why (`No such file or directory`, `Permission denied`).
    NotRun(String),
}

/// Which log level a [`Action::Report`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The node became unhealthy, or a request failed.
    Warn,
    /// The node is healthy again.
    Info,
}

/// What the driver is asked to do ([`HealthCheck::poll_action`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start the program (in its own process group, with `VIGIL_BROKER_RANK` and `VIGIL_URI`); hand its end back
    /// with [`HealthCheck::finished`] and this `run`.
    Run {
        /// This run's number.
        run: u64,
    },
    /// Kill run `run`'s process group: it ran past `health.timeout` (already counted as a failure; its exit, when
    /// it comes, is ignored).
    Kill {
        /// The run.
        run: u64,
    },
    /// Ask rank 0 to drain this node by the health check with this reason; answer with [`HealthCheck::answered`].
    Drain {
        /// The reason, starting with [`REASON_PREFIX`].
        reason: String,
    },
    /// Ask rank 0 to undrain this node if a health check drained it; answer with [`HealthCheck::answered`].
    Undrain,
    /// Log this, once.
    Report {
        /// Level.
        level: Level,
        /// What happened.
        text: String,
    },
}

/// What this node asks of rank 0.
#[derive(Clone, Debug, PartialEq)]
enum Want {
    Drained(String),
    Undrained,
}

/// The health check's state, shown by `broker.info` (`vigil uptime`'s status): a short word and the detail.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Status {
    /// `starting` (no result yet), `ok` or `failing`.
    pub state: &'static str,
    /// The failure reason when failing.
    pub reason: Option<String>,
    /// When the last run ended (the driver's clock), if any.
    pub last: Option<f64>,
    /// Runs ended so far.
    pub runs: u64,
}

/// One broker's health check (see the module doc).
#[derive(Debug)]
pub struct HealthCheck {
    cfg: Config,
    /// When the next run is due (while none runs).
    next_run: f64,
    /// The run going on: its number and when it started.
    running: Option<(u64, f64)>,
    /// Runs started so far.
    runs: u64,
    /// Runs ended so far (a timeout counted).
    ended: u64,
    /// When the last run ended.
    last: Option<f64>,
    /// The current failure reason; `None` when passing or before the first result.
    failing: Option<String>,
    /// What rank 0 is asked for; `None` before the first result.
    want: Option<Want>,
    /// The request in flight.
    sent: Option<Want>,
    /// What rank 0 took last.
    taken: Option<Want>,
    /// When a request rank 0 did not take goes again.
    retry_at: Option<f64>,
    /// The last request error reported (reported once).
    last_error: Option<String>,
    actions: VecDeque<Action>,
}

impl HealthCheck {
    /// A health check whose first run is due at `now`.
    pub fn new(cfg: Config, now: f64) -> HealthCheck {
        HealthCheck {
            cfg,
            next_run: now,
            running: None,
            runs: 0,
            ended: 0,
            last: None,
            failing: None,
            want: None,
            sent: None,
            taken: None,
            retry_at: None,
            last_error: None,
            actions: VecDeque::new(),
        }
    }

    /// When [`HealthCheck::tick`] has something to do: the next run, the running one's timeout, or a retry.
    pub fn next_deadline(&self) -> f64 {
        let run = match self.running {
            Some((_, started)) => started + self.cfg.timeout,
            None => self.next_run,
        };
        self.retry_at.map_or(run, |r| r.min(run))
    }

    /// The time is `now`: start a run that is due, time out one that ran too long, send a request again.
    pub fn tick(&mut self, now: f64) {
        if let Some((run, started)) = self.running {
            if now >= started + self.cfg.timeout {
                self.running = None;
                self.actions.push_back(Action::Kill { run });
                let why =
                    format!("{} timed out after {}", self.cfg.program, crate::attrs::fmt_duration(self.cfg.timeout));
                self.result(now, Err(why));
            }
        }
        if self.running.is_none() && now >= self.next_run {
            self.runs += 1;
            self.running = Some((self.runs, now));
            self.next_run = now + self.cfg.interval;
            self.actions.push_back(Action::Run { run: self.runs });
        }
        if self.retry_at.is_some_and(|r| now >= r) {
            self.retry_at = None;
            self.send();
        }
    }

    /// Run `run` ended this way at `now` (ignored when it is not the run going on: one killed for its timeout).
    pub fn finished(&mut self, now: f64, run: u64, outcome: Outcome) {
        if self.running.map(|(r, _)| r) != Some(run) {
            return;
        }
        self.running = None;
        let p = &self.cfg.program;
        let said = |line: &str, otherwise: String| if line.is_empty() { otherwise } else { line.to_string() };
        let r = match outcome {
            Outcome::Exited { code: 0, .. } => Ok(()),
            Outcome::Exited { code, line } => {
                Err(said(&line, format!("{p} exited with status {code}, saying nothing")))
            }
            Outcome::Signaled { signal, line } => {
                let how = format!("{p} killed by signal {signal}");
                Err(if line.is_empty() { how } else { format!("{line} ({how})") })
            }
            Outcome::NotRun(why) => Err(format!("cannot run {p}: {why}")),
        };
        self.result(now, r);
    }

    /// Rank 0's answer to the request in flight: `Ok` it took it, `Err` why not (sent again [`RETRY`] later).
    pub fn answered(&mut self, now: f64, answer: Result<(), String>) {
        let Some(sent) = self.sent.take() else { return };
        match answer {
            Ok(()) => {
                self.last_error = None;
                self.taken = Some(sent);
                self.send();
            }
            Err(e) => {
                let what = match sent {
                    Want::Drained(_) => "drain",
                    Want::Undrained => "undrain",
                };
                let text = format!("health check: rank 0 did not {what} this node ({e}); trying again");
                if self.last_error.as_deref() != Some(text.as_str()) {
                    self.actions.push_back(Action::Report { level: Level::Warn, text: text.clone() });
                    self.last_error = Some(text);
                }
                self.retry_at = Some(now + RETRY);
            }
        }
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The state, for status output.
    pub fn status(&self) -> Status {
        let state = match (self.ended, &self.failing) {
            (0, _) => "starting",
            (_, None) => "ok",
            (_, Some(_)) => "failing",
        };
        Status { state, reason: self.failing.clone(), last: self.last, runs: self.ended }
    }

    /// A run's verdict: `Err(why)` a failure.
    fn result(&mut self, now: f64, r: Result<(), String>) {
        self.ended += 1;
        self.last = Some(now);
        match r {
            Ok(()) => {
                if let Some(reason) = self.failing.take() {
                    let text = format!("health check passes again (was: {reason})");
                    self.actions.push_back(Action::Report { level: Level::Info, text });
                }
                self.want_now(Want::Undrained);
            }
            Err(why) => {
                let reason = format!("{REASON_PREFIX}{}", clean(&why));
                if self.failing.as_ref() != Some(&reason) {
                    let text = format!("{reason}: draining this node");
                    self.actions.push_back(Action::Report { level: Level::Warn, text });
                    self.failing = Some(reason.clone());
                }
                self.want_now(Want::Drained(reason));
            }
        }
    }

    fn want_now(&mut self, w: Want) {
        if self.want.as_ref() != Some(&w) {
            self.want = Some(w);
            self.send();
        }
    }

    /// Send what is wanted, unless a request is in flight or waits to go again, or rank 0 took it already.
    fn send(&mut self) {
        if self.sent.is_some() || self.retry_at.is_some() || self.want == self.taken {
            return;
        }
        let Some(w) = self.want.clone() else { return };
        self.actions.push_back(match &w {
            Want::Drained(reason) => Action::Drain { reason: reason.clone() },
            Want::Undrained => Action::Undrain,
        });
        self.sent = Some(w);
    }
}

/// A reason as one printable line of at most [`LINE_MAX`] bytes: control characters become spaces, whitespace
/// at the ends goes.
fn clean(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if out.len() > LINE_MAX {
        let mut end = LINE_MAX;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: f64 = 100.0;

    fn check(interval: f64, timeout: f64) -> HealthCheck {
        HealthCheck::new(Config { program: "/hc".into(), interval, timeout }, T0)
    }

    fn actions(h: &mut HealthCheck) -> Vec<Action> {
        std::iter::from_fn(|| h.poll_action()).collect()
    }

    /// The requests among `a`: `Some(reason)` a drain, `None` an undrain.
    fn requests(a: &[Action]) -> Vec<Option<String>> {
        a.iter()
            .filter_map(|a| match a {
                Action::Drain { reason } => Some(Some(reason.clone())),
                Action::Undrain => Some(None),
                _ => None,
            })
            .collect()
    }

    fn reports(a: &[Action]) -> Vec<String> {
        a.iter().filter_map(|a| if let Action::Report { text, .. } = a { Some(text.clone()) } else { None }).collect()
    }

    /// Starts the run due at `now`; returns its number.
    fn start(h: &mut HealthCheck, now: f64) -> u64 {
        assert!(h.next_deadline() <= now, "a run is due by {now}: next deadline {}", h.next_deadline());
        h.tick(now);
        let a = actions(h);
        match a.as_slice() {
            [Action::Run { run }] => *run,
            other => panic!("expected one Run at {now}, got {other:?}"),
        }
    }

    fn fail(line: &str) -> Outcome {
        Outcome::Exited { code: 1, line: line.into() }
    }

    fn pass() -> Outcome {
        Outcome::Exited { code: 0, line: "fine".into() }
    }

    #[test]
    fn runs_at_start_then_every_interval_from_each_start() {
        let mut h = check(60.0, 10.0);
        assert_eq!(h.next_deadline(), T0);
        let r = start(&mut h, T0);
        assert_eq!(h.next_deadline(), T0 + 10.0, "while it runs: its timeout");
        h.finished(T0 + 2.0, r, pass());
        assert_eq!(h.next_deadline(), T0 + 60.0);
        h.tick(T0 + 59.0);
        assert!(actions(&mut h).iter().all(|a| !matches!(a, Action::Run { .. })), "not before the interval");
        assert_eq!(start(&mut h, T0 + 60.0), r + 1);
    }

    #[test]
    fn a_failure_drains_once_with_the_first_line_and_a_pass_undrains() {
        let mut h = check(1.0, 0.5);
        let r = start(&mut h, T0);
        h.finished(T0 + 0.1, r, fail("/tmp full"));
        let a = actions(&mut h);
        assert_eq!(requests(&a), [Some("health check: /tmp full".to_string())]);
        assert_eq!(reports(&a).len(), 1, "{a:?}");
        assert_eq!(h.status().state, "failing");
        h.answered(T0 + 0.2, Ok(()));
        // The same failure again: nothing asked, nothing reported.
        for k in 1..5 {
            let r = start(&mut h, T0 + f64::from(k));
            h.finished(T0 + f64::from(k) + 0.1, r, fail("/tmp full"));
            assert_eq!(actions(&mut h), [], "run {k}");
        }
        // Another reason: drained again with it, reported once.
        let r = start(&mut h, T0 + 5.0);
        h.finished(T0 + 5.1, r, fail("no /scratch"));
        let a = actions(&mut h);
        assert_eq!(requests(&a), [Some("health check: no /scratch".to_string())]);
        assert_eq!(reports(&a).len(), 1);
        h.answered(T0 + 5.2, Ok(()));
        // Healthy: undrained (rank 0 undoes only a health check's drain), reported once.
        let r = start(&mut h, T0 + 6.0);
        h.finished(T0 + 6.1, r, pass());
        let a = actions(&mut h);
        assert_eq!(requests(&a), [None]);
        assert!(reports(&a)[0].contains("passes again"), "{a:?}");
        h.answered(T0 + 6.2, Ok(()));
        let r = start(&mut h, T0 + 7.0);
        h.finished(T0 + 7.1, r, pass());
        assert_eq!(actions(&mut h), [], "healthy again and again: nothing more");
        assert_eq!(h.status(), Status { state: "ok", reason: None, last: Some(T0 + 7.1), runs: 8 });
    }

    #[test]
    fn the_first_pass_asks_for_an_undrain_once() {
        // A drain by the check of an earlier broker on this node is not left behind; rank 0 ignores it for a
        // node the check did not drain (an admin's drain).
        let mut h = check(1.0, 0.5);
        let r = start(&mut h, T0);
        h.finished(T0 + 0.1, r, pass());
        let a = actions(&mut h);
        assert_eq!(requests(&a), [None]);
        assert_eq!(reports(&a), Vec::<String>::new(), "nothing to report: it was never unhealthy");
        h.answered(T0 + 0.2, Ok(()));
        let r = start(&mut h, T0 + 1.0);
        h.finished(T0 + 1.1, r, pass());
        assert_eq!(actions(&mut h), []);
    }

    #[test]
    fn a_run_past_its_timeout_is_killed_and_fails_and_its_late_exit_is_ignored() {
        let mut h = check(1.0, 0.5);
        let r = start(&mut h, T0);
        h.tick(T0 + 0.4);
        assert_eq!(actions(&mut h), []);
        assert_eq!(h.next_deadline(), T0 + 0.5);
        h.tick(T0 + 0.5);
        let a = actions(&mut h);
        assert_eq!(a[0], Action::Kill { run: r });
        assert_eq!(requests(&a), [Some("health check: /hc timed out after 500ms".to_string())]);
        // Killed: its end comes late, and counts for nothing (a pass here would undrain otherwise).
        h.finished(T0 + 0.6, r, pass());
        assert_eq!(actions(&mut h), []);
        assert_eq!(h.status().state, "failing");
        // The next run is due an interval after the hung one started.
        assert_eq!(start(&mut h, T0 + 1.0), r + 1);
    }

    #[test]
    fn a_hung_run_delays_the_next_one() {
        let mut h = check(1.0, 5.0);
        let r = start(&mut h, T0);
        h.tick(T0 + 3.0);
        assert_eq!(actions(&mut h), [], "no second run while the first goes on");
        h.finished(T0 + 3.5, r, pass());
        actions(&mut h);
        assert_eq!(start(&mut h, T0 + 3.5), r + 1, "overdue: at once");
    }

    #[test]
    fn reasons_when_the_program_says_nothing_cannot_run_or_is_signalled() {
        let cases = [
            (
                Outcome::Exited { code: 3, line: String::new() },
                "health check: /hc exited with status 3, saying nothing",
            ),
            (Outcome::NotRun("Permission denied".into()), "health check: cannot run /hc: Permission denied"),
            (Outcome::Signaled { signal: 11, line: String::new() }, "health check: /hc killed by signal 11"),
            (
                Outcome::Signaled { signal: 9, line: "gpu 2 gone".into() },
                "health check: gpu 2 gone (/hc killed by signal 9)",
            ),
            (fail("  bad\tchars\u{7}  "), "health check: bad chars"),
        ];
        for (outcome, want) in cases {
            let mut h = check(1.0, 0.5);
            let r = start(&mut h, T0);
            h.finished(T0, r, outcome.clone());
            assert_eq!(requests(&actions(&mut h)), [Some(want.to_string())], "{outcome:?}");
        }
        // A long line is cut at LINE_MAX bytes, on a character boundary.
        let mut h = check(1.0, 0.5);
        let r = start(&mut h, T0);
        h.finished(T0, r, fail(&"é".repeat(LINE_MAX)));
        let reason = requests(&actions(&mut h)).remove(0).unwrap();
        assert!(reason.len() <= REASON_PREFIX.len() + LINE_MAX, "{}", reason.len());
    }

    #[test]
    fn a_request_rank_0_did_not_take_goes_again_and_is_reported_once() {
        let mut h = check(100.0, 5.0);
        let r = start(&mut h, T0);
        h.finished(T0 + 0.1, r, fail("/tmp full"));
        actions(&mut h);
        h.answered(T0 + 0.2, Err("rank(s) 3 not in this instance".into()));
        let a = actions(&mut h);
        assert_eq!(reports(&a).len(), 1, "{a:?}");
        assert_eq!(h.next_deadline(), T0 + 0.2 + RETRY);
        h.tick(T0 + 0.2 + RETRY);
        assert_eq!(requests(&actions(&mut h)), [Some("health check: /tmp full".to_string())]);
        h.answered(T0 + 5.3, Err("rank(s) 3 not in this instance".into()));
        assert_eq!(reports(&actions(&mut h)), Vec::<String>::new(), "the same error: reported once");
        h.tick(T0 + 5.3 + RETRY);
        actions(&mut h);
        h.answered(T0 + 10.4, Ok(()));
        assert_eq!(actions(&mut h), []);
        // Passing while a drain is in flight: the undrain follows the drain's answer, in order.
        let r = start(&mut h, T0 + 100.0);
        h.finished(T0 + 100.1, r, fail("other"));
        assert_eq!(requests(&actions(&mut h)).len(), 1);
        let r = start(&mut h, T0 + 200.0);
        h.finished(T0 + 200.1, r, pass());
        assert_eq!(requests(&actions(&mut h)), [], "one request at a time");
        h.answered(T0 + 200.2, Ok(()));
        assert_eq!(requests(&actions(&mut h)), [None]);
    }
}
