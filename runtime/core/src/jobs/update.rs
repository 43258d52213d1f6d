//! Changing a job after submission (`vigil update ID KEY=VALUE...`, Flux's `flux update`, Slurm's `scontrol update
//! job`): its time limit, name and urgency.
//!
//! A pending job (NEW, DEPEND, PRIORITY, SCHED) may change any of them; a running job only its time limit, and only
//! down (its tasks were started with the nodes for that long; a longer limit is a new submission); an inactive job
//! nothing. Only the job's owner or the instance owner may change it (`broker/access.rs`, and checked here too);
//! urgency keeps its own rules (`urgency.rs`: more than 16 is the instance owner's). The request is checked whole
//! before anything changes: every key known, every value valid, or nothing happens.
//!
//! The change is in the eventlog as Flux records it: `jobspec-update`, whose context maps the jobspec keys changed
//! to their new values (`attributes.system.duration`, `attributes.system.job.name`); an urgency change is the
//! `urgency` event. A restarted rank 0 applies `jobspec-update` events to the kept jobspec (`journal/restore.rs`).

use super::{Action, JobCore, JobId, JobState};
use crate::message::errno;
use serde_json::{json, Map, Value};

/// The jobspec key of the time limit, as `jobspec-update` names it.
pub const DURATION_KEY: &str = "attributes.system.duration";
/// The jobspec key of the job's name, as `jobspec-update` names it.
pub const NAME_KEY: &str = "attributes.system.job.name";

/// The keys `vigil update` takes.
pub const UPDATE_KEYS: &[&str] = &["duration", "name", "urgency"];

/// What one request changes, checked ([`Update::parse`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Update {
    /// The new time limit: seconds (`Some(None)`: unlimited), or seconds added (`+`) or taken (`-`) from the
    /// current one.
    pub duration: Option<Duration>,
    /// The new name.
    pub name: Option<String>,
    /// The new RFC 21 urgency.
    pub urgency: Option<u32>,
}

/// A new time limit as asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Duration {
    /// This many seconds; `None`: unlimited (`0`, `inf`).
    Set(Option<f64>),
    /// The current limit plus (or minus, when negative) this many seconds.
    Add(f64),
}

impl Update {
    /// Read a request's `KEY: VALUE` map: `duration` an RFC 23 duration (`30m`) or seconds, `0`/`inf` for none,
    /// `+30m`/`-10m` relative to the current limit; `name` one line of text; `urgency` 0 to 31.
    ///
    /// # Errors
    /// Naming the key: `duration: ...`, `name: ...`, `urgency: ...`, `foo: unknown key (known: ...)`.
    pub fn parse(map: &Map<String, Value>) -> Result<Update, String> {
        if map.is_empty() {
            return Err(format!("nothing to update (keys: {})", UPDATE_KEYS.join(", ")));
        }
        let mut u = Update::default();
        for (k, v) in map {
            match k.as_str() {
                "duration" | DURATION_KEY => {
                    u.duration = Some(parse_duration(v).map_err(|e| format!("duration: {e}"))?)
                }
                "name" | NAME_KEY => {
                    let n = v.as_str().ok_or("name: must be a string")?;
                    if n.trim().is_empty() || n.chars().any(char::is_control) || n.len() > 256 {
                        return Err("name: must be non-blank, one line, at most 256 bytes".into());
                    }
                    u.name = Some(n.to_string());
                }
                "urgency" => {
                    let n = match v {
                        Value::Number(n) => n.as_u64(),
                        Value::String(s) => match s.as_str() {
                            "hold" => Some(0),
                            "default" => Some(u64::from(super::DEFAULT_URGENCY)),
                            "expedite" => Some(u64::from(super::MAX_URGENCY)),
                            s => s.parse().ok(),
                        },
                        _ => None,
                    };
                    u.urgency = Some(
                        n.filter(|n| *n <= u64::from(super::MAX_URGENCY))
                            .ok_or("urgency: must be 0 (hold) to 31 (expedite), hold, default or expedite")?
                            as u32,
                    );
                }
                k => return Err(format!("{k}: unknown key (known: {})", UPDATE_KEYS.join(", "))),
            }
        }
        Ok(u)
    }
}

fn parse_duration(v: &Value) -> Result<Duration, String> {
    let secs = |s: &str| -> Result<f64, String> {
        let d = crate::duration::parse_duration_secs(s).map_err(|e| e.to_string())?;
        Ok(d)
    };
    match v {
        Value::Number(n) => {
            let d = n.as_f64().filter(|d| d.is_finite() && *d >= 0.0).ok_or("must be seconds >= 0")?;
            Ok(Duration::Set((d > 0.0).then_some(d)))
        }
        Value::String(s) => {
            let t = s.trim();
            if let Some(r) = t.strip_prefix('+') {
                let d = secs(r)?;
                return if d.is_finite() { Ok(Duration::Add(d)) } else { Ok(Duration::Set(None)) };
            }
            if let Some(r) = t.strip_prefix('-') {
                let d = secs(r)?;
                return if d.is_finite() { Ok(Duration::Add(-d)) } else { Err("cannot take an infinite time".into()) };
            }
            if matches!(t, "unlimited" | "none") {
                return Ok(Duration::Set(None));
            }
            let d = secs(t)?;
            Ok(Duration::Set((d > 0.0 && d.is_finite()).then_some(d)))
        }
        _ => Err("must be a duration such as 30m (RFC 23), +10m, -5m, or seconds".into()),
    }
}

impl JobCore {
    /// Change job `id` as `u` asks, on behalf of `userid` (`owner`: the instance owner). Returns the
    /// `jobspec-update` context posted (the jobspec keys changed), with `urgency` added if it changed.
    ///
    /// # Errors
    /// `(errno, message)`: ENOENT unknown job; EPERM another user's job, or an urgency above 16 asked by a user;
    /// EINVAL an inactive job, a running job asked for anything but a shorter time limit, a limit that would
    /// not leave room for the job's warning signal (`--signal`), a limit that ends before the job started.
    pub fn update(
        &mut self,
        now: f64,
        id: JobId,
        userid: u32,
        owner: bool,
        u: &Update,
    ) -> Result<Value, (u32, String)> {
        let job = self.jobs.get(&id).ok_or((errno::ENOENT, format!("unknown job id {id}")))?;
        if !owner && job.userid != userid {
            return Err((errno::EPERM, format!("job {id} belongs to uid {}", job.userid)));
        }
        let state = job.state;
        let pending = matches!(state, JobState::New | JobState::Depend | JobState::Priority | JobState::Sched);
        if !pending && state != JobState::Run {
            return Err((
                errno::EINVAL,
                format!("job {id} is {}: it may no longer change", state.name().to_lowercase()),
            ));
        }
        let old = job.req.duration;
        let duration = match u.duration {
            None => None,
            Some(Duration::Set(d)) => Some(d),
            Some(Duration::Add(a)) => match old {
                None => {
                    return Err((errno::EINVAL, format!("duration: job {id} has no time limit to add to or take from")))
                }
                Some(o) if o + a <= 0.0 => {
                    return Err((errno::EINVAL, format!("duration: {} less {} leaves no time", fmt(o), fmt(-a))))
                }
                Some(o) => Some(Some(o + a)),
            },
        };
        if state == JobState::Run {
            if u.name.is_some() || u.urgency.is_some() {
                return Err((
                    errno::EINVAL,
                    format!("job {id} is running: only its time limit may change, and only down (name and urgency are a pending job's)"),
                ));
            }
            if let Some(d) = duration {
                let longer = match (d, old) {
                    (None, Some(_)) => true,
                    (Some(n), Some(o)) => n > o,
                    _ => false,
                };
                if longer {
                    return Err((
                        errno::EINVAL,
                        format!(
                            "duration: job {id} is running with a time limit of {}: a running job's limit may only be \
                             reduced",
                            old.map_or("none".into(), fmt)
                        ),
                    ));
                }
            }
        }
        if let (Some(Some(d)), Some(w)) = (duration, job.req.signal) {
            if w.timeleft >= d {
                return Err((
                    errno::EINVAL,
                    format!(
                        "duration: {} leaves no room for the job's warning {} {} before the limit (--signal)",
                        fmt(d),
                        crate::jobspec::signal_label(w.signum),
                        fmt(w.timeleft)
                    ),
                ));
            }
        }
        if let Some(n) = u.urgency {
            if !owner && n > super::DEFAULT_URGENCY {
                return Err((
                    errno::EPERM,
                    format!("urgency {n}: only the instance owner may give more than {}", super::DEFAULT_URGENCY),
                ));
            }
        }
        // Checked: now it changes.
        let mut ctx = Map::new();
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(Value::Null) };
        let mut spec = job.jobspec();
        if let Some(d) = duration {
            job.req.duration = d;
            ctx.insert(DURATION_KEY.into(), json!(d.unwrap_or(0.0)));
            if let Some(sys) = spec.pointer_mut("/attributes/system").and_then(Value::as_object_mut) {
                sys.insert("duration".into(), json!(d.unwrap_or(0.0)));
            }
            if let Some(t) = job.t_run {
                job.expiration = d.map(|d| t + d);
                if let Some(r) = job.r.as_mut() {
                    r.execution.expiration = job.expiration.unwrap_or(0.0);
                }
            }
        }
        if let Some(n) = &u.name {
            job.name = Some(n.as_str().into());
            ctx.insert(NAME_KEY.into(), json!(n));
            if let Some(sys) = spec.pointer_mut("/attributes/system").and_then(Value::as_object_mut) {
                let j = sys.entry("job").or_insert_with(|| json!({}));
                if let Some(j) = j.as_object_mut() {
                    j.insert("name".into(), json!(n));
                }
            }
        }
        if !ctx.is_empty() {
            job.jobspec_text = spec.to_string().into();
            job.post(now, "jobspec-update", Value::Object(ctx.clone()));
            self.actions.push_back(Action::Updated(id));
        }
        if state == JobState::Run {
            self.rearm(id);
        } else if duration.is_some() {
            // The reservation and what may backfill depend on every pending job's limit.
            self.sched_dirty = true;
            self.schedule(now);
        }
        let mut answer = Value::Object(ctx);
        if let Some(n) = u.urgency {
            let was = self.set_urgency(now, id, userid, owner, n, false)?;
            answer["urgency"] = json!({"old": was, "new": n});
        }
        Ok(answer)
    }
}

/// Apply the `jobspec-update` events of `eventlog` to `jobspec` (as submitted), in order: the jobspec as the job
/// has it now (`journal/restore.rs`).
pub(super) fn apply_updates(jobspec: &mut Value, eventlog: &[crate::eventlog::Event]) {
    for e in eventlog.iter().filter(|e| e.name == "jobspec-update") {
        let Some(sys) = jobspec.pointer_mut("/attributes/system").and_then(Value::as_object_mut) else { return };
        if let Some(d) = e.context.get(DURATION_KEY) {
            sys.insert("duration".into(), d.clone());
        }
        if let Some(n) = e.context.get(NAME_KEY) {
            let j = sys.entry("job").or_insert_with(|| json!({}));
            if let Some(j) = j.as_object_mut() {
                j.insert("name".into(), n.clone());
            }
        }
    }
}

fn fmt(s: f64) -> String {
    crate::attrs::fmt_duration(s)
}
