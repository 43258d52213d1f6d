//! RFC 26 job dependencies: a job submitted with `attributes.system.dependencies` waits in DEPEND until each is
//! met (RFC 21), or ends with an exception of type `dependency` (severity 0) as soon as one can never be, as Flux
//! does.
//!
//! | scheme | met when the job named | never met when it |
//! |---|---|---|
//! | `after` | has started (Flux's `after`, Slurm's `after`) | ended without starting |
//! | `afterany` | has ended, any way | — |
//! | `afterok` | ended successfully (COMPLETED: exit 0, no fatal exception) | ended otherwise |
//! | `afternotok` | ended otherwise (failed, canceled, timed out) | completed |
//! | `afterexcept` | ended with a fatal exception | ended without one |
//! | `begin-time` | — (value: seconds since the epoch): that time has come | — |
//! | `singleton` | every earlier active job of the same user and name has ended (Slurm's `singleton`) | — |
//!
//! A job id (`value`, in any accepted form: `f58`, decimal) must name a job this instance holds, checked at
//! submit: an unknown one is refused naming it. Each dependency still waited for is in the eventlog as
//! `dependency-add` and, once met, `dependency-remove` (RFC 21, its `description` such as `afterok:fXYZ`); the
//! last one removed is followed by `depend` and the job goes on to the queue. What is still waited for is rebuilt
//! after a restart of rank 0 from the jobspec and those events.
//!
//! Cost: a job that ends (or starts) looks at the jobs waiting on it, through an index by job waited for; begin
//! times are an ordered index of deadlines. A `singleton` looks over the jobs held when it is checked.

use super::{Action, Exception, JobCore, JobId, JobState};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// What an `after*` dependency waits for of the job it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// `after`: it started.
    Start,
    /// `afterany`: it ended.
    Any,
    /// `afterok`: it completed.
    Ok,
    /// `afternotok`: it ended without completing.
    NotOk,
    /// `afterexcept`: it ended with a fatal exception.
    Except,
}

impl After {
    /// The RFC 26 scheme name.
    pub fn scheme(self) -> &'static str {
        match self {
            After::Start => "after",
            After::Any => "afterany",
            After::Ok => "afterok",
            After::NotOk => "afternotok",
            After::Except => "afterexcept",
        }
    }
}

/// One dependency of a job (an RFC 26 dependency object, read by [`Dependency::parse`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Dependency {
    /// An `after*` scheme on a job.
    After(After, JobId),
    /// `begin-time`: not before this time (seconds since the epoch).
    BeginTime(f64),
    /// `singleton`: after every earlier active job of the same user and name.
    Singleton,
}

impl Dependency {
    /// Read one RFC 26 dependency object (`{"scheme": "afterok", "value": "fXYZ"}`); `path` names it in errors.
    ///
    /// # Errors
    /// `attributes.system.dependencies[0].value: "x" is not a job id: expected f58 (f3Yq9b), decimal, ...`, and
    /// the like (any RFC 19 form [`JobId::parse`] reads is a job id).
    pub fn parse(v: &Value, path: &str) -> Result<Dependency, String> {
        let scheme =
            v.get("scheme").and_then(Value::as_str).ok_or_else(|| format!("{path}.scheme: required string"))?;
        let value = v.get("value").unwrap_or(&Value::Null);
        let after = match scheme {
            "after" => After::Start,
            "afterany" => After::Any,
            "afterok" => After::Ok,
            "afternotok" => After::NotOk,
            "afterexcept" => After::Except,
            "begin-time" => {
                let t = match value {
                    Value::Number(n) => n.as_f64(),
                    Value::String(s) => s.trim().parse::<f64>().ok(),
                    _ => None,
                };
                return match t.filter(|t| t.is_finite() && *t >= 0.0) {
                    Some(t) => Ok(Dependency::BeginTime(t)),
                    None => {
                        Err(format!("{path}.value: a begin time is a number of seconds since the epoch, got {value}"))
                    }
                };
            }
            "singleton" => return Ok(Dependency::Singleton),
            other => {
                return Err(format!(
                    "{path}.scheme: unknown dependency scheme {other:?} (known: {})",
                    crate::jobspec::DEPENDENCY_SCHEMES.join(", ")
                ))
            }
        };
        let s = value.as_str().ok_or_else(|| format!("{path}.value: must be a job id string"))?;
        let id = JobId::parse(s).map_err(|e| format!("{path}.value: {s:?} is not a job id: {}", e.1))?;
        Ok(Dependency::After(after, id))
    }

    /// Every dependency of a jobspec (`attributes.system.dependencies`), in order.
    ///
    /// # Errors
    /// As [`Dependency::parse`], naming the element.
    pub fn all_of(jobspec: &Value) -> Result<Vec<Dependency>, String> {
        let Some(list) = jobspec.pointer("/attributes/system/dependencies").and_then(Value::as_array) else {
            return Ok(Vec::new());
        };
        list.iter()
            .enumerate()
            .map(|(i, d)| Dependency::parse(d, &format!("attributes.system.dependencies[{i}]")))
            .collect()
    }

    /// As the eventlog says it (`dependency-add`'s `description`): `afterok:fXYZ`, `begin-time:1700000000.000`,
    /// `singleton`.
    pub fn description(&self) -> String {
        match self {
            Dependency::After(a, id) => format!("{}:{}", a.scheme(), id.f58()),
            Dependency::BeginTime(t) => format!("begin-time:{t:.3}"),
            Dependency::Singleton => "singleton".into(),
        }
    }
}

/// Where one dependency stands.
enum Verdict {
    Met,
    /// Waits, for these jobs (empty: for its time).
    Wait(Vec<JobId>),
    /// Can never be met: why.
    Never(String),
}

/// The jobs waiting on others, and on times.
#[derive(Debug, Default)]
pub(super) struct Waits {
    /// Job waited for → jobs in DEPEND waiting on it.
    pub(super) on: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Begin times: the time's bits (a finite time >= 0 orders as its bits do) and the job.
    pub(super) begin: BTreeSet<(u64, JobId)>,
    /// Jobs that started or ended whose waiting jobs are still to be looked at.
    fired: Vec<JobId>,
    /// Looking at them now (a job ended by its dependency fires in turn: looked at in the same loop).
    busy: bool,
    /// A job went on to the queue since the flag was last taken: a scheduling pass is due.
    pub(super) released: bool,
}

impl JobCore {
    /// Check a submission's dependencies before any job is made: each job named must be one this instance holds.
    pub(super) fn depend_check(&self, deps: &[Dependency]) -> Result<(), String> {
        for (i, d) in deps.iter().enumerate() {
            if let Dependency::After(_, id) = d {
                if !self.jobs.contains_key(id) {
                    return Err(format!(
                        "attributes.system.dependencies[{i}].value: no job {} in this instance ({}: unknown, or \
                         purged)",
                        id.f58(),
                        d.description()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Job `id` (just validated, in DEPEND) waits for `deps`: each is in the eventlog (`dependency-add`), then
    /// looked at at once (some may be met already).
    pub(super) fn depend_start(&mut self, now: f64, id: JobId, deps: Vec<Dependency>) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        for d in &deps {
            job.post(now, "dependency-add", json!({"description": d.description()}));
        }
        job.deps = deps;
        self.actions.push_back(Action::Updated(id));
        self.depend_recheck(now, id);
    }

    /// A restored job in DEPEND: what it still waits for is its jobspec's dependencies less those the eventlog
    /// removed (one not yet added, in a record cut short, is added now); then looked at, as at submit.
    pub(super) fn depend_resume(&mut self, now: f64, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let deps = Dependency::all_of(&job.jobspec()).unwrap_or_default();
        let said = |name: &str| -> BTreeSet<String> {
            job.eventlog
                .iter()
                .filter(|e| e.name == name)
                .filter_map(|e| e.context.get("description").and_then(Value::as_str).map(str::to_string))
                .collect()
        };
        let (added, removed) = (said("dependency-add"), said("dependency-remove"));
        let left: Vec<Dependency> = deps.into_iter().filter(|d| !removed.contains(&d.description())).collect();
        for d in left.iter().filter(|d| !added.contains(&d.description())) {
            job.post(now, "dependency-add", json!({"description": d.description()}));
        }
        job.deps = left;
        self.depend_recheck(now, id);
    }

    /// Where dependency `d` of job `id` stands now.
    fn verdict(&self, now: f64, id: JobId, d: &Dependency) -> Verdict {
        match d {
            Dependency::BeginTime(t) if *t <= now => Verdict::Met,
            Dependency::BeginTime(_) => Verdict::Wait(Vec::new()),
            Dependency::Singleton => {
                let Some(me) = self.jobs.get(&id) else { return Verdict::Met };
                let name = me.display_name();
                let before: Vec<JobId> = self
                    .jobs
                    .range(..id)
                    .filter(|(_, j)| j.state.is_active() && j.userid == me.userid && j.display_name() == name)
                    .map(|(k, _)| *k)
                    .collect();
                if before.is_empty() {
                    Verdict::Met
                } else {
                    Verdict::Wait(before)
                }
            }
            Dependency::After(how, target) => {
                let Some(t) = self.jobs.get(target) else {
                    // Purged since (only an INACTIVE job is): it ended, how is not known any more.
                    return match how {
                        After::Any => Verdict::Met,
                        _ => Verdict::Never(format!("job {} was purged before its end could be known", target.f58())),
                    };
                };
                let ended = t.state == JobState::Inactive;
                let result = t.result().unwrap_or("");
                let how_ended = || match &t.fatal {
                    Some(e) => format!("job {} ended {result} ({}: {})", target.f58(), e.kind, e.note),
                    None => format!("job {} ended {result} (exit {})", target.f58(), t.exit_code().unwrap_or(0)),
                };
                match how {
                    After::Start if t.t_run.is_some() || t.state == JobState::Run => Verdict::Met,
                    After::Start if ended => Verdict::Never(format!("job {} ended without starting", target.f58())),
                    _ if !ended => Verdict::Wait(vec![*target]),
                    After::Start | After::Any => Verdict::Met,
                    After::Ok if result == "COMPLETED" => Verdict::Met,
                    After::Ok => Verdict::Never(how_ended()),
                    After::NotOk if result != "COMPLETED" => Verdict::Met,
                    After::NotOk => Verdict::Never(format!("job {} completed", target.f58())),
                    After::Except if t.fatal.is_some() => Verdict::Met,
                    After::Except => Verdict::Never(format!("job {} ended without an exception", target.f58())),
                }
            }
        }
    }

    /// Look at what job `id` (in DEPEND) still waits for: each dependency met is removed (`dependency-remove`);
    /// one that never can be ends the job (exception `dependency`, severity 0); with none left, the job goes on
    /// (`depend`, then the queue).
    fn depend_recheck(&mut self, now: f64, id: JobId) {
        let Some(job) = self.jobs.get(&id).filter(|j| j.state == JobState::Depend) else { return };
        let deps = job.deps.clone();
        let mut left = Vec::new();
        let mut waits: Vec<(Option<JobId>, Option<f64>)> = Vec::new();
        for d in deps {
            match self.verdict(now, id, &d) {
                Verdict::Met => {
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.post(now, "dependency-remove", json!({"description": d.description()}));
                    }
                }
                Verdict::Wait(on) => {
                    if let Dependency::BeginTime(t) = d {
                        waits.push((None, Some(t)));
                    }
                    waits.extend(on.into_iter().map(|j| (Some(j), None)));
                    left.push(d);
                }
                Verdict::Never(why) => {
                    self.depend_forget(id);
                    let note = format!("{} can never be satisfied: {why}", d.description());
                    let exc = Exception { kind: "dependency".into(), severity: 0, note };
                    if self.drop_pending(now, id, exc) {
                        self.depend.released = true; // it held nothing, but say a pass is due all the same
                    }
                    return;
                }
            }
        }
        self.depend_forget(id);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.deps = left;
        self.actions.push_back(Action::Updated(id));
        if !job.deps.is_empty() {
            for (on, at) in waits {
                if let Some(on) = on {
                    self.depend.on.entry(on).or_default().insert(id);
                }
                if let Some(t) = at {
                    self.depend.begin.insert((t.to_bits(), id));
                }
            }
            return;
        }
        job.post(now, "depend", json!({}));
        self.enter_queue(now, id);
    }

    /// Job `id` left DEPEND: it takes its priority and goes on to the queue (a scheduling pass is due).
    pub(super) fn enter_queue(&mut self, now: f64, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let urgency = job.urgency;
        job.post(now, "priority", json!({"priority": urgency}));
        self.queue.insert(id, urgency);
        self.actions.push_back(Action::Updated(id));
        self.depend.released = true;
        self.sched_dirty = true;
    }

    /// Job `id` waits on nothing any more (it left DEPEND or ended): its entries in the indexes go.
    pub(super) fn depend_forget(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else { return };
        if job.deps.is_empty() {
            return;
        }
        for d in &job.deps {
            match d {
                Dependency::BeginTime(t) => {
                    self.depend.begin.remove(&(t.to_bits(), id));
                }
                Dependency::After(_, on) => {
                    if let Some(s) = self.depend.on.get_mut(on) {
                        s.remove(&id);
                        if s.is_empty() {
                            self.depend.on.remove(on);
                        }
                    }
                }
                Dependency::Singleton => {
                    // Registered on every earlier job of its name: looked for where it may be.
                    self.depend.on.retain(|_, s| {
                        s.remove(&id);
                        !s.is_empty()
                    });
                }
            }
        }
    }

    /// Job `id` started or ended: the jobs waiting on it are looked at (in a loop: a job its dependency ends
    /// fires in turn). True when one went on to the queue, or ended: the caller then runs a scheduling pass.
    pub(super) fn depend_fired(&mut self, now: f64, id: JobId) -> bool {
        if self.depend.busy {
            // Within the loop below (a job its dependency ended): looked at there.
            if self.depend.on.contains_key(&id) {
                self.depend.fired.push(id);
            }
            return false;
        }
        if !self.depend.on.contains_key(&id) {
            return std::mem::take(&mut self.depend.released);
        }
        self.depend.fired.push(id);
        self.depend.busy = true;
        while let Some(j) = self.depend.fired.pop() {
            let waiting: Vec<JobId> = self.depend.on.get(&j).map(|s| s.iter().copied().collect()).unwrap_or_default();
            for w in waiting {
                self.depend_recheck(now, w);
            }
        }
        self.depend.busy = false;
        std::mem::take(&mut self.depend.released)
    }

    /// The earliest begin time still waited for.
    pub(super) fn depend_deadline(&self) -> Option<f64> {
        self.depend.begin.first().map(|(t, _)| f64::from_bits(*t))
    }

    /// Begin times that have come: their jobs are looked at. True when one went on to the queue.
    pub(super) fn depend_timeout(&mut self, now: f64) -> bool {
        let mut due = Vec::new();
        while let Some(&(t, id)) = self.depend.begin.first() {
            if f64::from_bits(t) > now {
                break;
            }
            self.depend.begin.remove(&(t, id));
            due.push(id);
        }
        for id in due {
            self.depend_recheck(now, id);
        }
        std::mem::take(&mut self.depend.released)
    }

    /// Why job `id`, in DEPEND, waits (for `vigil jobs`, as squeue's `(Dependency)` and `(BeginTime)`):
    /// `dependency: afterok:fXYZ, singleton` or, when only begin times are left, `begin-time: not before
    /// 2026-12-07T05:00:00Z (in 4m05s)` (UTC; `vigil` shows it in local time). `None`
    /// unless the job is in DEPEND.
    pub fn depend_reason(&self, id: JobId, now: f64) -> Option<String> {
        let job = self.jobs.get(&id).filter(|j| j.state == JobState::Depend)?;
        let begin = job.deps.iter().filter_map(|d| if let Dependency::BeginTime(t) = d { Some(*t) } else { None });
        let others: Vec<String> =
            job.deps.iter().filter(|d| !matches!(d, Dependency::BeginTime(_))).map(Dependency::description).collect();
        if others.is_empty() {
            let t = begin.fold(f64::NEG_INFINITY, f64::max);
            return Some(format!("begin-time: not before {} (in {})", utc_iso8601(t), time_left(t - now)));
        }
        Some(format!("dependency: {}", others.join(", ")))
    }
}

/// `t` (seconds since the Unix epoch) as an ISO 8601 UTC time to the second, `2026-12-07T05:00:00Z` (the broker
/// knows no user's time zone: `vigil` shows it in local time).
pub fn utc_iso8601(t: f64) -> String {
    let secs = t.floor() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// A time left, to the second, in its two largest units: `45s`, `4m05s`, `2h03m`, `3d04h`.
pub fn time_left(secs: f64) -> String {
    let s = secs.max(0.0).ceil() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{:02}h", s / 86_400, s / 3600 % 24),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_times_read_as_utc_and_what_is_left() {
        assert_eq!(utc_iso8601(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_iso8601(1_796_619_600.0), "2026-12-07T05:00:00Z");
        assert_eq!(utc_iso8601(951_782_400.5), "2000-02-29T00:00:00Z");
        assert_eq!((time_left(0.2), time_left(59.0), time_left(245.0)), ("1s".into(), "59s".into(), "4m05s".into()));
        assert_eq!((time_left(7380.0), time_left(273_600.0)), ("2h03m".into(), "3d04h".into()));
    }

    #[test]
    fn dependency_objects_are_read_naming_the_element() {
        let p = |v: Value| Dependency::parse(&v, "d[0]");
        let id = JobId::from_parts(1000, 3);
        assert_eq!(p(json!({"scheme": "afterok", "value": id.f58()})), Ok(Dependency::After(After::Ok, id)));
        assert_eq!(p(json!({"scheme": "after", "value": id.0.to_string()})), Ok(Dependency::After(After::Start, id)));
        // RFC 26: "the antecedent jobid, in any valid FLUID encoding from RFC 19".
        for form in [format!("ƒ{}", &id.f58()[1..]), id.hex(), id.dothex()] {
            assert_eq!(
                p(json!({"scheme": "afterany", "value": form})),
                Ok(Dependency::After(After::Any, id)),
                "{form}"
            );
        }
        assert_eq!(p(json!({"scheme": "begin-time", "value": 17.5})), Ok(Dependency::BeginTime(17.5)));
        assert_eq!(p(json!({"scheme": "singleton", "value": ""})), Ok(Dependency::Singleton));
        assert_eq!(
            p(json!({"scheme": "afterok", "value": "fx0"})).unwrap_err(),
            "d[0].value: \"fx0\" is not a job id: expected f58 (f3Yq9b), decimal, hex (0x1a2b) or dotted hex \
             (0000.0001.a2b0.0000)"
        );
        assert!(p(json!({"scheme": "afterfoo", "value": "f1"})).unwrap_err().starts_with("d[0].scheme: unknown"));
        assert!(p(json!({"scheme": "begin-time", "value": "soon"})).unwrap_err().starts_with("d[0].value:"));
        let d = Dependency::After(After::NotOk, id);
        assert_eq!(d.description(), format!("afternotok:{}", id.f58()));
    }
}
