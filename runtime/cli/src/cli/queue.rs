//! Options that say when and in which order a job is taken from the queue, shared by `run`, `submit`, `batch` and
//! `alloc`: its name (`--job-name`, Slurm's `-J`, kept as Flux keeps it in `attributes.system.job.name`) and what
//! it waits for (`--dependency`, RFC 26 objects in `attributes.system.dependencies`).

use clap::Args;
use serde_json::{json, Value};

/// Queue options of `run`, `submit`, `batch` and `alloc`.
#[derive(Args, Debug, Clone, Default)]
pub struct QueueOpts {
    /// The job's name, shown by `vigil jobs` (NAME) and matched by `vigil jobs --name` (default: the command's
    /// basename; for `batch`, the script's). Kept in the jobspec as `attributes.system.job.name`, as Flux does.
    #[arg(short = 'J', long = "job-name", visible_alias = "name", value_name = "NAME")]
    pub job_name: Option<String>,
    /// Wait for other jobs (repeatable; all must hold): SCHEME:JOBID[:JOBID...][,SCHEME:JOBID...], with SCHEME
    /// `afterok` (the job completed), `afterany` (it ended), `afternotok` (it failed, or was canceled),
    /// `afterexcept` (it ended with an exception), `after` (it started); or `singleton` (every earlier job of
    /// yours with this name has ended). A dependency that can never hold ends the job (exception `dependency`).
    #[arg(short = 'd', long = "dependency", value_name = "SCHEME:JOBID")]
    pub dependency: Vec<String>,
}

/// The `after*` schemes `--dependency` takes, each with the jobs it names.
const AFTER_SCHEMES: &[&str] = &["after", "afterany", "afterok", "afternotok", "afterexcept"];

/// `--dependency` values as RFC 26 dependency objects, in order: `afterok:ID:ID,afterany:ID` (Slurm's list,
/// Flux's `afterok:ID`) and `singleton`; each job id checked to be one (f58 or decimal).
///
/// # Errors
/// `--dependency=afterfoo:f1: unknown dependency scheme "afterfoo" (known: ...)`, and the like.
pub(crate) fn parse_dependencies(list: &[String]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for arg in list {
        let bad = |why: String| format!("--dependency={arg}: {why}");
        if arg.contains('?') {
            return Err(bad(
                "`?` (any one of them) is not supported: give dependencies that must all hold, joined by `,`".into(),
            ));
        }
        for part in arg.split(',') {
            let mut fields = part.split(':');
            let scheme = fields.next().unwrap_or("").trim();
            let ids: Vec<&str> = fields.map(str::trim).collect();
            match scheme {
                "singleton" if ids.is_empty() => out.push(json!({"scheme": "singleton", "value": ""})),
                "singleton" => return Err(bad("singleton takes no job id".into())),
                s if AFTER_SCHEMES.contains(&s) => {
                    if ids.is_empty() || ids.iter().any(|i| i.is_empty()) {
                        return Err(bad(format!("{s} needs a job id: {s}:JOBID")));
                    }
                    for id in ids {
                        let parsed = crate::jobs::JobId::parse(id)
                            .map_err(|_| bad(format!("{id:?} is not a job id (f58 such as fAbC1, or decimal)")))?;
                        // `afterok:A:A` (or a script repeating the line) is one dependency, as Slurm takes it.
                        let dep = json!({"scheme": s, "value": parsed.f58()});
                        if !out.contains(&dep) {
                            out.push(dep);
                        }
                    }
                }
                "" => return Err(bad("empty dependency".into())),
                s => {
                    return Err(bad(format!(
                        "unknown dependency scheme {s:?} (known: {}, singleton)",
                        AFTER_SCHEMES.join(", ")
                    )))
                }
            }
        }
    }
    Ok(out)
}

impl QueueOpts {
    /// Take a batch script's directives (`dir`) where the command line gave nothing; the same option with another
    /// value is an error naming both.
    ///
    /// # Errors
    /// `option --job-name a contradicts the script's directive --job-name b`.
    pub(crate) fn merge(&mut self, dir: QueueOpts) -> Result<(), String> {
        fn one<T: PartialEq + std::fmt::Debug>(name: &str, cli: &mut Option<T>, dir: Option<T>) -> Result<(), String> {
            match (&*cli, dir) {
                (Some(a), Some(b)) if *a != b => {
                    Err(format!("option {name} {a:?} contradicts the script's directive {name} {b:?}"))
                }
                (None, Some(b)) => {
                    *cli = Some(b);
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        one("--job-name", &mut self.job_name, dir.job_name)?;
        // Lists: the script's first.
        let mut deps = dir.dependency;
        deps.append(&mut self.dependency);
        self.dependency = deps;
        Ok(())
    }

    /// The job name given, checked: not blank, one line.
    ///
    /// # Errors
    /// `--job-name ...: ...` naming what is wrong.
    pub(crate) fn name(&self) -> Result<Option<&str>, String> {
        match self.job_name.as_deref() {
            Some(n) if n.trim().is_empty() || n.chars().any(char::is_control) => Err(format!(
                "--job-name {n:?}: a job name must be non-blank, without control characters (a newline, a tab)"
            )),
            n => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_name_is_one_line_of_text() {
        let q = |n: &str| QueueOpts { job_name: Some(n.into()), ..Default::default() };
        assert_eq!(q("first").name().unwrap(), Some("first"));
        assert!(q("").name().unwrap_err().starts_with("--job-name"));
        assert!(q("   ").name().unwrap_err().contains("non-blank"), "spaces alone show as no name");
        assert!(q("a\nb").name().unwrap_err().contains("control characters"));
        assert_eq!(QueueOpts::default().name().unwrap(), None);
    }

    #[test]
    fn dependencies_in_flux_and_slurm_spellings() {
        let p = |v: &[&str]| parse_dependencies(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let deps = p(&["afterok:f2:3,afterany:f4", "singleton"]).unwrap();
        let schemes: Vec<&str> = deps.iter().map(|d| d["scheme"].as_str().unwrap()).collect();
        assert_eq!(schemes, ["afterok", "afterok", "afterany", "singleton"]);
        assert_eq!(deps[1]["value"], json!(crate::jobs::JobId(3).f58()), "a decimal id is sent as f58");
        let e = p(&["afterfoo:f2"]).unwrap_err();
        assert!(e.starts_with("--dependency=afterfoo:f2: unknown dependency scheme \"afterfoo\""), "{e}");
        let e = p(&["afterok:fx0l"]).unwrap_err();
        assert!(e.contains("\"fx0l\" is not a job id"), "{e}");
        assert!(p(&["afterok"]).unwrap_err().contains("needs a job id"));
        let e = p(&["afterok:f2?afterany:f3"]).unwrap_err();
        assert!(
            e.ends_with("`?` (any one of them) is not supported: give dependencies that must all hold, joined by `,`")
        );
        let once = p(&["afterok:f2:f2", "afterok:f2"]).unwrap();
        assert_eq!(once, [json!({"scheme": "afterok", "value": "f2"})], "one dependency, however often named");
    }
}
