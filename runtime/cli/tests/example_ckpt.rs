//! `examples/ckpt/app.sh` on its own, without an instance: its restart rule (every rank resumes from the newest
//! checkpoint complete on every rank, as an SCR restart of a coupled code does), its barrier (no rank more than one
//! step ahead), its cache of two checkpoints per rank, and its refusal to run without the checkpoint it resumes from.
//! Each rank is run as a Vigil task would run it (its `VIGIL_*` variables set by the test) with a `vigil` on `PATH`
//! that answers only `getattr hostname`. The whole example under node kills is in `failure_netns.rs` (`n_plus_one_*`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn app() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/ckpt/app.sh")
}

/// Two "nodes", n0 and n1, each with its storage (`VIGIL_ALLOC_TMPDIR`) reachable as `CKPT_ROOT/node.nI`, rank I on
/// node nI (so n1 holds rank 0's partner copies and n0 rank 1's).
struct Nodes {
    dir: tempfile::TempDir,
}

impl Nodes {
    fn new() -> Nodes {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        let shim = bin.join("vigil");
        std::fs::write(
            &shim,
            "#!/bin/sh\n[ \"$*\" = \"getattr hostname\" ] && exec echo \"$CKPT_TEST_NODE\"\nexit 1\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        for n in ["n0", "n1"] {
            let storage = dir.path().join(format!("storage.{n}"));
            std::fs::create_dir_all(&storage).unwrap();
            std::os::unix::fs::symlink(&storage, dir.path().join(format!("root/node.{n}"))).unwrap();
        }
        Nodes { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// Node `n`'s storage.
    fn storage(&self, n: u32) -> PathBuf {
        self.dir.path().join(format!("storage.n{n}"))
    }

    /// Rank `r`'s last complete checkpoint, as the previous launch left it.
    fn set_complete(&self, r: u32, step: u32) {
        std::fs::write(self.root().join(format!("complete.{r}")), format!("{step}\n")).unwrap();
    }

    fn complete(&self, r: u32) -> Option<u32> {
        std::fs::read_to_string(self.root().join(format!("complete.{r}"))).ok()?.trim().parse().ok()
    }

    /// A checkpoint of rank `r` at `step` on node `n` (`ckpt.r.step` on its own node, `partner.r.step` on another).
    fn put(&self, n: u32, name: &str) {
        std::fs::write(self.storage(n).join(name), "x\n").unwrap();
    }

    /// The files on node `n`'s storage.
    fn files(&self, n: u32) -> BTreeSet<String> {
        std::fs::read_dir(self.storage(n))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| !f.ends_with(".tmp"))
            .collect()
    }

    /// app.sh as rank `rank` of 2 on node n`rank`, for `steps` steps of 10 ms.
    fn rank(&self, rank: u32, steps: u32) -> Child {
        let path = format!("{}:{}", self.dir.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
        Command::new("sh")
            .arg(app())
            .arg(steps.to_string())
            .env("PATH", path)
            .env("VIGIL_TASK_RANK", rank.to_string())
            .env("VIGIL_JOB_SIZE", "2")
            .env("VIGIL_ALLOC_TMPDIR", self.storage(rank))
            .env("CKPT_ROOT", self.root())
            .env("CKPT_HOSTS", "n0 n1")
            .env("CKPT_TEST_NODE", format!("n{rank}"))
            .env("STEP_S", "0.01")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh app.sh")
    }
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Rank 0 completed step 5, rank 1 only step 4 when the launch ended: both resume from step 4 (rank 0 drops its
/// step 5), run to the end, and each node keeps only the two newest checkpoints of each rank.
#[test]
fn every_rank_resumes_from_the_newest_checkpoint_complete_on_every_rank() {
    let n = Nodes::new();
    n.set_complete(0, 5);
    n.set_complete(1, 4);
    for name in ["ckpt.0.4", "ckpt.0.5", "partner.1.3", "partner.1.4"] {
        n.put(0, name);
    }
    for name in ["ckpt.1.3", "ckpt.1.4", "partner.0.4", "partner.0.5"] {
        n.put(1, name);
    }
    let (r0, r1) = (n.rank(0, 8), n.rank(1, 8));
    let (o0, o1) = (r0.wait_with_output().unwrap(), r1.wait_with_output().unwrap());
    let ctx = format!("rank 0: {}\nrank 1: {}", text(&o0), text(&o1));
    assert!(o0.status.success() && o1.status.success(), "{ctx}");
    let (s0, s1) = (String::from_utf8_lossy(&o0.stdout), String::from_utf8_lossy(&o1.stdout));
    assert!(s0.contains("rank 0 on n0: resuming from step 4 (last complete checkpoint: step 5)"), "{ctx}");
    assert!(s1.contains("rank 1 on n1: resuming from step 4 (last complete checkpoint: step 4)"), "{ctx}");
    assert!(s0.contains("rank 0 on n0: completed 8 steps") && s1.contains("rank 1 on n1: completed 8 steps"), "{ctx}");
    assert_eq!((n.complete(0), n.complete(1)), (Some(8), Some(8)), "{ctx}");
    let want = |own: u32, other: u32| -> BTreeSet<String> {
        [format!("ckpt.{own}.7"), format!("ckpt.{own}.8"), format!("partner.{other}.7"), format!("partner.{other}.8")]
            .into_iter()
            .collect()
    };
    assert_eq!(n.files(0), want(0, 1), "node n0 keeps two checkpoints of each rank:\n{ctx}");
    assert_eq!(n.files(1), want(1, 0), "node n1 keeps two checkpoints of each rank:\n{ctx}");
}

/// The newest checkpoint complete on every rank is step 3, and rank 1's node does not hold it (its data was not put
/// where it runs): rank 1 fails with exit code 3 and says why, before computing anything.
#[test]
fn a_rank_whose_node_lacks_the_restart_checkpoint_fails() {
    let n = Nodes::new();
    n.set_complete(0, 3);
    n.set_complete(1, 3);
    n.put(1, "ckpt.1.2");
    let o = n.rank(1, 8).wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "rank 1 on n1: ERROR: no checkpoint of step 3 on this node, the newest checkpoint complete on every rank"
        ),
        "{}",
        text(&o)
    );
    assert_eq!(n.complete(1), Some(3), "nothing recorded: {}", text(&o));
}

/// Rank 1 is stuck after step 2 (it never runs here): rank 0 completes step 3 and then waits in the barrier, one
/// step ahead at most, for as long as rank 1 does not move.
#[test]
fn no_rank_runs_more_than_one_step_ahead() {
    let n = Nodes::new();
    n.set_complete(0, 2);
    n.set_complete(1, 2);
    n.put(0, "ckpt.0.2");
    let mut r0 = n.rank(0, 10);
    let t0 = Instant::now();
    while n.complete(0) != Some(3) && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Thirty steps' worth of time: a rank not held back would be done.
    std::thread::sleep(Duration::from_millis(300));
    let running = r0.try_wait().unwrap().is_none();
    let at = n.complete(0);
    r0.kill().ok();
    let o = r0.wait_with_output().unwrap();
    assert!(running && at == Some(3), "rank 0 at step {at:?}, running {running}:\n{}", text(&o));
    // Rank 1 catches up: rank 0 goes on.
    n.set_complete(1, 3);
    n.put(0, "ckpt.0.3");
    let o = n.rank(0, 4).wait_with_output().unwrap();
    assert!(o.status.success() && n.complete(0) == Some(4), "{}", text(&o));
}
