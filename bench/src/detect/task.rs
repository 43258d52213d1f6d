//! (e) task kill → job exception under `-o exit-on-error`, and the `waitpid` reference.
//!
//! The task program is a small C file compiled at bench time with `cc` ([`TASK_C`]). Task rank 0 maps and
//! touches `MIB` MiB of anonymous memory (one write per 4 KiB page, so every page is resident), then both
//! ranks write `DIR/TAG.RANK.pid` and wait in `pause()`. The harness reads the pid file, checks that the pid's
//! argv carries the trial's tag, takes t0 and sends SIGKILL to rank 0 itself. The verdict is the job's
//! `exception` event in rank 0's eventlog. The reference is the same program spawned directly by the harness:
//! the time from SIGKILL until `waitpid` returns (which happens only after the kernel has freed the memory).

use super::{job_events, sigkill, sleep_s, wait_job, Cluster, Ctx, Mode, Series, POLL_S};
use crate::{last_line, now_epoch_s, r4, run_captured, Captured};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vigil::jobs::JobId;

/// Source of the task program: `vigil-bench-task DIR TAG MIB` (see the module documentation).
const TASK_C: &str = r#"/* vigil-bench task: rank 0 (VIGIL_TASK_RANK, default 0) touches MIB MiB, then every rank writes
   DIR/TAG.RANK.pid and waits for a signal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DIR TAG MIB\n", argv[0]);
        return 2;
    }
    const char *r = getenv("VIGIL_TASK_RANK");
    int rank = r ? atoi(r) : 0;
    size_t mib = rank == 0 ? (size_t)strtoull(argv[3], NULL, 10) : 0;
    if (mib > 0) {
        size_t n = mib << 20;
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 3;
        }
        for (size_t i = 0; i < n; i += 4096)
            p[i] = (char)(i >> 12) | 1;
    }
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s.%d.pid", argv[1], argv[2], rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        return 4;
    }
    for (;;)
        pause();
}
"#;

/// How long a task may take to start and touch its memory before the trial fails.
const READY_TIMEOUT_S: f64 = 120.0;
/// How long to wait for the job's exception after the kill.
const EXCEPTION_TIMEOUT_S: f64 = 30.0;
/// The jobs' exit-timeout: if exit-on-error misses a kill, the job fails this long after it instead (and the
/// trial is counted as a missed exception), which keeps such a trial short.
pub(super) const EXIT_TIMEOUT_S: u32 = 5;

/// Compile [`TASK_C`] with `cc -O2` into `work`; the program's path.
pub(super) fn build_task_program(work: &Path) -> Result<PathBuf, String> {
    let src = work.join("vigil-bench-task.c");
    let exe = work.join("vigil-bench-task");
    std::fs::write(&src, TASK_C).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut cmd = Command::new("cc");
    cmd.arg("-O2").arg("-o").arg(&exe).arg(&src);
    match run_captured(cmd, Duration::from_secs(60))? {
        Captured::Exited { status, .. } if status.success() => Ok(exe),
        Captured::Exited { status, stderr, .. } => Err(format!("cc failed: {status}: {}", last_line(&stderr))),
        Captured::TimedOut => Err("cc hung".into()),
    }
}

/// Wait until `path` holds a pid whose argv contains `tag`; the pid.
fn wait_pidfile(path: &Path, tag: &str, timeout_s: f64) -> Result<i32, String> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_s);
    loop {
        if let Some(pid) = std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.split(|b| *b == 0).any(|a| a == tag.as_bytes()) {
                return Ok(pid);
            }
            return Err(format!("pid {pid} in {} does not carry the tag {tag} in its argv", path.display()));
        }
        if Instant::now() >= deadline {
            return Err(format!("{} did not appear within {timeout_s} s", path.display()));
        }
        sleep_s(POLL_S);
    }
}

/// VmRSS of `pid`, MiB.
fn rss_mib(pid: i32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 =
        s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb / 1024.0)
}

/// A fresh directory for one trial's pid files.
fn trial_dir(work: &Path, tag: &str) -> Result<PathBuf, String> {
    let d = work.join(tag);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    Ok(d)
}

/// (e): `trials` jobs of 2 tasks on one node of a 2-node netns cluster, with `-o exit-on-error`; SIGKILL task
/// 0 (holding `mib` MiB) and time the job's `exception` event.
pub(super) fn measure_task_kill(ctx: &Ctx<'_>, mode: &Mode, prog: &Path, mib: u64, trials: usize) -> Series {
    let mut s = Series::default();
    let r = (|| -> Result<(), String> {
        let cl = Cluster::up(ctx, 2, mode)?;
        s.note_cluster(&cl);
        for i in 0..trials {
            let tag = format!("vbt-{}-{mib}-{i}", mode.name);
            let dir = trial_dir(ctx.work, &tag)?;
            let (dir_s, prog_s, mib_s) = (dir.display().to_string(), prog.display().to_string(), mib.to_string());
            let out = cl.vigil_cmd(
                &[
                    "submit",
                    "-N1",
                    "-n2",
                    "-o",
                    "exit-on-error",
                    "-o",
                    &format!("exit-timeout={EXIT_TIMEOUT_S}s"),
                    "-t",
                    "10m",
                    &prog_s,
                    &dir_s,
                    &tag,
                    &mib_s,
                ],
                ctx.work,
            )?;
            let id = JobId::parse(out.trim()).map_err(|e| format!("vigil submit printed {out:?}: {e}"))?;
            let pid = wait_pidfile(&dir.join(format!("{tag}.0.pid")), &tag, READY_TIMEOUT_S)?;
            wait_pidfile(&dir.join(format!("{tag}.1.pid")), &tag, READY_TIMEOUT_S)?;
            let rss = rss_mib(pid);
            let info = super::job_info(ctx.rt, cl.client(), id)?;
            let t0 = now_epoch_s();
            sigkill(pid)?;
            let deadline = Instant::now() + Duration::from_secs_f64(EXCEPTION_TIMEOUT_S);
            let exc = loop {
                let evs = job_events(ctx.rt, cl.client(), id)?;
                if let Some(e) =
                    evs.into_iter().find(|e| e["name"] == "exception" && e["timestamp"].as_f64().unwrap_or(0.0) >= t0)
                {
                    break e;
                }
                if Instant::now() >= deadline {
                    return Err(format!("job {id}: no exception within {EXCEPTION_TIMEOUT_S} s of killing task 0"));
                }
                sleep_s(POLL_S);
            };
            let ts = exc["timestamp"].as_f64().unwrap_or(0.0);
            let kind = exc["context"]["type"].as_str().unwrap_or("").to_string();
            let severity = exc["context"]["severity"].as_u64();
            let note = exc["context"]["note"].as_str().unwrap_or("").to_string();
            let end =
                wait_job(ctx.rt, cl.client(), id, "inactive after the exception", 60.0, |i| i["state"] == "INACTIVE")?;
            let _ = std::fs::remove_dir_all(&dir);
            s.trials.push(json!({
                "job": id.to_string(), "job_ranks": info["ranks"], "pid": pid, "rss_mib": rss.map(|x| x.round()),
                "t0": t0, "exception_ts": ts, "latency_s": r4(ts - t0), "type": kind, "severity": severity,
                "note": note, "result": end["result"], "exit_on_error_fired": note.contains("exit-on-error"),
            }));
            if severity != Some(0) {
                return Err(format!(
                    "job {id}: killing task 0 raised {kind} severity {severity:?} ({note:?}), not fatal"
                ));
            }
            if !note.contains("exit-on-error") {
                // The job failed some other way (e.g. exit-timeout): exit-on-error never fired. Count it, go on.
                eprintln!("vigil-bench:   job {id}: no exit-on-error exception; the job ended by {kind}: {note}");
                s.no_exception += 1;
                sleep_s(super::SETTLE_S);
                continue;
            }
            if !note.contains("signal 9") {
                return Err(format!("job {id}: exit-on-error exception does not name SIGKILL: {note:?}"));
            }
            s.samples.push(ts - t0);
            sleep_s(super::SETTLE_S);
        }
        Ok(())
    })();
    s.error = r.err();
    s
}

/// Reference: spawn the task program directly, SIGKILL it once its memory is touched, time `waitpid`.
pub(super) fn measure_waitpid(work: &Path, prog: &Path, mib: u64, trials: usize) -> Series {
    let mut s = Series::default();
    let r = (|| -> Result<(), String> {
        for i in 0..trials {
            let tag = format!("vbw-{mib}-{i}");
            let dir = trial_dir(work, &tag)?;
            let mut child = Command::new(prog)
                .arg(&dir)
                .arg(&tag)
                .arg(mib.to_string())
                .env("VIGIL_TASK_RANK", "0")
                .stdin(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", prog.display()))?;
            let pid = match wait_pidfile(&dir.join(format!("{tag}.0.pid")), &tag, READY_TIMEOUT_S) {
                Ok(p) => p,
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
            };
            let rss = rss_mib(pid);
            let t0 = Instant::now();
            let e0 = now_epoch_s();
            sigkill(pid)?;
            let st = child.wait().map_err(|e| format!("waitpid {pid}: {e}"))?;
            let dt = t0.elapsed().as_secs_f64();
            let _ = std::fs::remove_dir_all(&dir);
            s.samples.push(dt);
            s.trials.push(json!({"pid": pid, "rss_mib": rss.map(|x| x.round()), "t0": e0, "latency_s": r4(dt),
                "status": format!("{st}")}));
            sleep_s(super::SETTLE_S);
        }
        Ok(())
    })();
    s.error = r.err();
    s
}
