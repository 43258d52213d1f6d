//! Options that say when and in which order a job is taken from the queue, shared by `run`, `submit`, `batch` and
//! `alloc`: its name (`--job-name`, Slurm's `-J`, kept as Flux keeps it in `attributes.system.job.name`).

use clap::Args;

/// Queue options of `run`, `submit`, `batch` and `alloc`.
#[derive(Args, Debug, Clone, Default)]
pub struct QueueOpts {
    /// The job's name, shown by `vigil jobs` (NAME) and matched by `vigil jobs --name` (default: the command's
    /// basename; for `batch`, the script's). Kept in the jobspec as `attributes.system.job.name`, as Flux does.
    #[arg(short = 'J', long = "job-name", visible_alias = "name", value_name = "NAME")]
    pub job_name: Option<String>,
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
        Ok(())
    }

    /// The job name given, checked: non-empty, one line.
    ///
    /// # Errors
    /// `--job-name ...: ...` naming what is wrong.
    pub(crate) fn name(&self) -> Result<Option<&str>, String> {
        match self.job_name.as_deref() {
            Some(n) if n.is_empty() || n.chars().any(char::is_control) => Err(format!(
                "--job-name {n:?}: a job name must be non-empty, without control characters (a newline, a tab)"
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
        let q = |n: &str| QueueOpts { job_name: Some(n.into()) };
        assert_eq!(q("first").name().unwrap(), Some("first"));
        assert!(q("").name().unwrap_err().starts_with("--job-name"));
        assert!(q("a\nb").name().unwrap_err().contains("control characters"));
        assert_eq!(QueueOpts::default().name().unwrap(), None);
    }
}
