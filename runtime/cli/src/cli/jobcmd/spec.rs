//! The jobspec of `run` and `submit`, built from their options ([`build_jobspec`]), and the checks and
//! messages of the options that go into it.

use super::args::{NodeCount, SubmitArgs};
use super::nodes::Hostfile;
use crate::jobspec::{Jobspec, JobspecBuilder};
use serde_json::{json, Value};

/// Parse `--taskmap` (reading a `hostfile:` now, relative to the current directory). Errors name the option once
/// (`--taskmap=hostfile:F: line 4: ...`, where the scheme's own message starts with `hostfile:F: ` too).
pub(crate) fn parse_taskmap(s: &str) -> Result<crate::taskmap::Scheme, String> {
    crate::taskmap::Scheme::parse(s, |path| std::fs::read_to_string(path).map_err(|e| e.to_string())).map_err(|e| {
        let e = e.to_string();
        let scheme = s.split(':').next().unwrap_or(s);
        let why = e.strip_prefix(&format!("{s}: ")).or_else(|| e.strip_prefix(&format!("{scheme}: "))).unwrap_or(&e);
        format!("--taskmap={s}: {why}")
    })
}

/// `e` (a refusal of the jobspec, by [`Jobspec::validate`] here or by rank 0) with each jobspec path of a shell
/// option the command line set said as the user typed it: `-o kill-timeout=100s: ...` or `--taskmap=...: ...`
/// instead of `attributes.system.shell.options.kill-timeout: ...`. A jobspec file keeps its paths.
pub(crate) fn said_as_typed(setopt: &[String], taskmap: Option<&str>, e: String) -> String {
    let mut out = e;
    let typed = setopt
        .iter()
        .map(|o| (o.split_once('=').map_or(o.as_str(), |(k, _)| k), format!("-o {o}")))
        .chain(taskmap.map(|t| ("taskmap", format!("--taskmap={t}"))));
    for (key, typed) in typed {
        out = out.replace(&format!("attributes.system.shell.options.{key}"), &typed);
    }
    // The job manager's check of a warning against the instance's default time limit.
    out.replace("attributes.system.shell.options.signal", "--signal")
}

/// An `--output`/`--error` path may hold the templates the job shell fills in
/// ([`crate::shellproto::OUTPUT_TEMPLATES`]: `{{id}}`, `{{id.f58}}`, `{{id.dec}}`, `{{name}}`) and no other; a
/// `{{cc}}` left here had no `--cc` to fill it in (`copies.rs` does before this check).
pub(crate) fn check_output_template(opt: &str, path: &str) -> Result<(), String> {
    let mut rest = path;
    while let Some(i) = rest.find("{{") {
        let after = &rest[i + 2..];
        let Some(j) = after.find("}}") else { break };
        let name = &after[..j];
        if name == "cc" {
            return Err(format!("{opt} {path}: {{{{cc}}}} is the copy's id of --cc, and no --cc is given"));
        }
        if !crate::shellproto::OUTPUT_TEMPLATES.contains(&name) {
            return Err(format!(
                "{opt} {path}: unknown template {{{{{name}}}}} (known: {{{{id}}}}, {{{{id.f58}}}}, {{{{id.dec}}}}, \
                 {{{{name}}}}, and {{{{cc}}}} with --cc)"
            ));
        }
        rest = &after[j + 2..];
    }
    Ok(())
}

fn parse_time_limit(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if t == "inf" || t == "infinity" || t == "none" {
        return Ok(0.0);
    }
    if let Ok(m) = t.parse::<f64>() {
        if !m.is_finite() {
            return Err(format!("-t {s}: must be a finite number of minutes (or inf, or FSD such as 90s, 2h)"));
        }
        if m < 0.0 {
            return Err(format!("-t {s}: must be >= 0"));
        }
        return Ok(m * 60.0);
    }
    let v = crate::duration::parse_duration_secs(t).map_err(|e| format!("-t {s}: {e}"))?;
    Ok(if v.is_finite() { v } else { 0.0 })
}

fn glob_match(pat: &str, name: &str) -> bool {
    match pat.strip_suffix('*') {
        Some(p) => name.starts_with(p),
        None => pat == name,
    }
}

/// Build the jobspec for `run`/`submit`.
pub(crate) fn build_jobspec(a: &SubmitArgs) -> Result<Jobspec, String> {
    let mut b = JobspecBuilder::new(a.command.clone())
        .cores_per_task(a.cores_per_task)
        .gpus_per_task(a.gpus_per_task)
        .exclusive(a.exclusive)
        .requeue(a.requeue)
        .constraint(a.select.constraint()?);
    if let Some(n) = a.queue.name()? {
        b = b.name(n);
    }
    for d in a.queue.dependencies(crate::broker_now())? {
        b = b.dependency(d);
    }
    let taskmap = a.taskmap.as_deref().map(parse_taskmap).transpose()?;
    let mut nodes = a.nodes;
    let mut ntasks = a.ntasks;
    if let Some(hf) = Hostfile::of(a)? {
        // A hostfile names the job's nodes: their number is the node count when -N is left out, and without -n
        // each of its entries (lines) is a task.
        if a.ntasks != Some(0) {
            ntasks = Some(hf.check(a.nodes, a.ntasks)?);
        }
        let hosts = hf.hosts().len() as u32;
        nodes = Some(NodeCount { min: hosts, max: hosts });
    }
    if let Some(t) = &taskmap {
        b = b.taskmap(t.clone());
    }
    if let Some(n) = nodes {
        if n.min == 0 {
            return Err("-N must be at least 1".into());
        }
        b = if n.max > n.min { b.nnodes_range(n.min, n.max) } else { b.nnodes(n.min) };
    }
    if let Some(n) = ntasks {
        if n == 0 {
            return Err("-n must be at least 1".into());
        }
        b = b.ntasks(n);
    }
    if a.cores_per_task == 0 {
        return Err("-c must be at least 1".into());
    }
    let limit = a.time_limit.as_deref().map(parse_time_limit).transpose()?;
    if let Some(l) = limit {
        b = b.duration(l);
    }
    if let Some(w) = a.queue.warning(limit)? {
        b = b.shell_option(crate::jobspec::SIGNAL_KEY, w.to_value());
    }
    // Relative to where the command runs, as Slurm's --chdir.
    let here = || std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"));
    let cwd = match &a.cwd {
        Some(c) if std::path::Path::new(c).is_absolute() => c.clone(),
        Some(c) => here()?.join(c).display().to_string(),
        None => here()?.display().to_string(),
    };
    b = b.cwd(cwd);
    let mut env: std::collections::BTreeMap<String, String> =
        std::env::vars().filter(|(k, _)| !k.starts_with("VIGIL_")).collect();
    for rule in &a.env {
        if let Some(p) = rule.strip_prefix('-') {
            env.retain(|k, _| !glob_match(p, k));
        } else if let Some((k, v)) = rule.split_once('=') {
            if k.is_empty() {
                return Err(format!("--env {rule}: empty variable name"));
            }
            env.insert(k.into(), v.into());
        } else if let Ok(v) = std::env::var(rule) {
            env.insert(rule.clone(), v);
        }
    }
    for (k, v) in env {
        b = b.env(k, v);
    }
    for o in &a.setopt {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Value::String(v.into())),
            None => (o.as_str(), Value::Bool(true)),
        };
        match (k, &v) {
            ("cpu-affinity", Value::String(s)) => {
                s.parse::<crate::hwloc::CpuAffinity>().map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("gpu-affinity", Value::String(s)) => {
                s.parse::<crate::hwloc::GpuAffinity>().map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("exit-on-error", Value::String(s))
                if !matches!(s.as_str(), "1" | "true" | "yes" | "on" | "0" | "false" | "no" | "off") =>
            {
                return Err(format!("-o {o}: expected exit-on-error[=1|0|true|false|yes|no|on|off]"));
            }
            ("memory", Value::String(s)) => {
                crate::shellproto::parse_memory_size(s).map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("memory", _) => return Err(format!("-o {o}: expected memory=SIZE (per node, e.g. 4G)")),
            // The job shell's `PmiChoice` (shell/src/pmix.rs) reads the same grammar.
            ("pmi", Value::String(s))
                if !matches!(s.as_str(), "on" | "off" | "none")
                    && !s.split(',').all(|n| matches!(n.trim(), "simple" | "pmi1" | "pmix")) =>
            {
                return Err(format!(
                    "-o {o}: expected pmi=LIST of simple (PMI-1, MPICH) and pmix (PMIx, Open MPI), pmi=on \
                     (both) or pmi=off (default: simple)"
                ));
            }
            ("exit-timeout", Value::String(s)) if s != "none" => {
                crate::duration::parse_duration_secs(s).map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("kill-timeout", Value::String(s)) => {
                let t = crate::duration::parse_duration_secs(s).map_err(|e| format!("-o {o}: {e}"))?;
                if !t.is_finite() {
                    return Err(format!("-o {o}: a kill timeout must be finite (at most the instance's exec.kill-timeout-max)"));
                }
            }
            ("kill-timeout" | "exit-timeout", Value::Bool(_)) => {
                return Err(format!("-o {o}: expected {o}=DURATION (e.g. 2s, an RFC 23 duration)"));
            }
            ("requeue", Value::String(s))
                if !matches!(s.as_str(), "1" | "true" | "yes" | "on" | "0" | "false" | "no" | "off") =>
            {
                return Err(format!("-o {o}: expected requeue[=1|0|true|false|yes|no|on|off]"));
            }
            ("taskmap", Value::String(s)) => {
                // Its JSON form: a hostfile is read now, as for --taskmap.
                let t = parse_taskmap(s).map_err(|e| format!("-o {o}: {e}"))?;
                b = b.shell_option(k, t.to_value());
                continue;
            }
            (
                "cpu-affinity" | "gpu-affinity" | "exit-timeout" | "kill-timeout" | "pmi" | "output" | "exit-on-error"
                | "requeue" | "on-node-loss",
                _,
            ) => {}
            _ => eprintln!(
                "vigil: warning: unknown shell option '{k}' (known: cpu-affinity, gpu-affinity, exit-timeout, kill-timeout, pmi, exit-on-error, requeue, on-node-loss, memory, taskmap)"
            ),
        }
        b = b.shell_option(k, v);
    }
    let mut out = serde_json::Map::new();
    if let Some(p) = &a.output {
        check_output_template("--output", p)?;
        out.insert("stdout".into(), json!({"type": "file", "path": p}));
    }
    if let Some(p) = &a.error {
        check_output_template("--error", p)?;
        out.insert("stderr".into(), json!({"type": "file", "path": p}));
    }
    if !out.is_empty() {
        b = b.shell_option("output", Value::Object(out));
    }
    b.build().map_err(|e| said_as_typed(&a.setopt, a.taskmap.as_deref(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{check_output_template, parse_time_limit};

    #[test]
    fn output_templates_other_than_id_are_refused() {
        assert!(check_output_template("--output", "/tmp/o-{{id}}.txt").is_ok());
        assert!(check_output_template("--output", "plain.txt").is_ok());
        let e = check_output_template("--output", "/tmp/o-{{id}}-{{bogus}}.txt").unwrap_err();
        assert!(e.contains("unknown template {{bogus}}"), "{e}");
        assert!(check_output_template("--error", "{{name}}-{{id.dec}}-{{id.f58}}.err").is_ok());
        let e = check_output_template("--output", "o-{{cc}}.txt").unwrap_err();
        assert!(e.contains("no --cc is given"), "{e}");
    }

    #[test]
    fn time_limits_in_minutes_or_fsd_and_bad_ones_say_why() {
        assert_eq!(parse_time_limit("2"), Ok(120.0));
        assert_eq!(parse_time_limit("90s"), Ok(90.0));
        assert_eq!(parse_time_limit("inf"), Ok(0.0));
        for bad in ["1e400", "nan", "-inf"] {
            let e = parse_time_limit(bad).unwrap_err();
            assert!(e.contains("must be a finite number of minutes"), "{bad}: {e}");
        }
        assert!(parse_time_limit("-1").unwrap_err().contains("must be >= 0"));
    }
}
