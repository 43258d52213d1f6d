//! Where a job's tasks go, end to end (issue 36, item 1): `--taskmap` (Flux's RFC 34 schemes) decides which node
//! runs which task rank, and `-N MIN-MAX` (Slurm's node ranges) runs on what is free.

mod common;

use common::*;

/// `vigil run -N2 -n4 --taskmap=cyclic`: ranks are dealt round-robin, so node 0 (broker rank 0) runs tasks 0 and
/// 2 and node 1 runs 1 and 3; PMI_RANK agrees with VIGIL_TASK_RANK; `vigil job info` shows the RFC 34 map. Without
/// the option, ranks stay block-wise.
#[test]
fn cyclic_taskmap_deals_ranks_over_the_nodes() {
    let inst = Instance::start(2, &[]);
    let placed = |extra: &[&str]| {
        let mut args = vec!["run", "-N2", "-n4"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["sh", "-c", "echo $VIGIL_TASK_RANK $PMI_RANK $VIGIL_BROKER_RANK"]);
        let o = inst.vigil(&args);
        o.ok();
        let mut rows: Vec<(u32, u32, u32)> = o
            .lines()
            .iter()
            .map(|l| {
                let f: Vec<u32> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
                assert_eq!(f.len(), 3, "line {l:?}:\n{}", o.dump());
                (f[0], f[1], f[2])
            })
            .collect();
        rows.sort_unstable();
        rows
    };
    assert_eq!(placed(&["--taskmap=cyclic"]), vec![(0, 0, 0), (1, 1, 1), (2, 2, 0), (3, 3, 1)]);
    assert_eq!(placed(&[]), vec![(0, 0, 0), (1, 1, 0), (2, 2, 1), (3, 3, 1)], "block by default");

    let id = inst.submit(&["-N2", "-n4", "--taskmap=cyclic", "true"]);
    assert!(inst.wait_state(&id, "INACTIVE", CMD_TIMEOUT));
    let info = inst.job_info(&id);
    let map = serde_json::json!({"version": 1, "map": [[0, 2, 1, 2]]});
    assert_eq!(info["info"]["taskmap"], map, "{info}");
    let o = inst.vigil(&["job", "eventlog", "--json", &id]);
    let start = o.stdout.lines().find(|l| l.contains("\"start\"")).unwrap_or_else(|| panic!("{}", o.dump()));
    assert!(start.contains("\"taskmap\""), "the start event carries the map: {start}");
}

/// An impossible task map is refused at submit, naming the option; batch and alloc refuse --taskmap, saying
/// where it belongs.
#[test]
fn impossible_taskmaps_are_refused_at_submit() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["run", "-N2", "-n3", "--taskmap=manual:[[0,2,1,2]]", "true"]);
    assert_eq!(
        (o.code, o.stderr.trim()),
        (1, "vigil: --taskmap=manual:[[0,2,1,2]]: got 4 tasks, expected 3"),
        "{}",
        o.dump()
    );
    let o = inst.vigil(&["run", "-N2", "-n2", "--taskmap=manual:[[0,1,2,1]]", "true"]);
    assert!(o.code != 0 && o.stderr.contains("got 1 nodes, expected 2"), "{}", o.dump());
    let o = inst.vigil(&["run", "-N2", "--taskmap=spiral", "true"]);
    assert!(o.code != 0 && o.stderr.contains("--taskmap=spiral: unknown scheme 'spiral'"), "{}", o.dump());
    let hosts = inst.dir.path().join("hosts");
    std::fs::write(&hosts, "no-such-node\n").unwrap();
    let o = inst.vigil(&["run", &format!("--taskmap=hostfile:{}", hosts.display()), "true"]);
    assert!(
        o.code != 0
            && o.stderr.contains(&format!(
                "--taskmap=hostfile:{}: not a node of this instance: line 1: no-such-node (its nodes: ",
                hosts.display()
            )),
        "{}",
        o.dump()
    );
    let o = inst.vigil(&["alloc", "-N2", "--taskmap=cyclic", "true"]);
    assert!(o.code != 0 && o.stderr.contains("give --taskmap to `vigil run` inside the allocation"), "{}", o.dump());
    // A manual map that fits runs as given: task 0 on node 1.
    let o = inst.vigil(&[
        "run",
        "-N2",
        "-n2",
        "--taskmap=manual:[[1,1,1,1],[0,1,1,1]]",
        "sh",
        "-c",
        "echo $VIGIL_TASK_RANK $VIGIL_BROKER_RANK",
    ]);
    o.ok();
    let mut lines = o.lines();
    lines.sort_unstable();
    assert_eq!(lines, vec!["0 1", "1 0"], "{}", o.dump());
}

/// `-N2-3` with one of three nodes drained runs at once on the two that are left; a range whose minimum is more
/// than the instance has, or more than its maximum, is refused with the reason.
#[test]
fn node_range_runs_on_what_is_free() {
    let inst = Instance::start(3, &[]);
    inst.vigil(&["resource", "drain", "2", "maintenance"]).ok();
    let o = inst.vigil(&["run", "-N2-3", "sh", "-c", "echo $VIGIL_BROKER_RANK $VIGIL_JOB_NNODES $VIGIL_JOB_SIZE"]);
    o.ok();
    let mut lines = o.lines();
    lines.sort_unstable();
    assert_eq!(lines, vec!["0 2 2", "1 2 2"], "{}", o.dump());
    let o = inst.vigil(&["run", "-N4-5", "true"]);
    assert!(o.code != 0 && o.stderr.contains("requested 4 nodes but this instance has 3"), "{}", o.dump());
    let o = inst.vigil(&["run", "-N3-2", "true"]);
    assert!(o.code != 0 && o.stderr.contains("MIN (3) is more than MAX (2)"), "{}", o.dump());
    // Undrained, a range takes every node up to its maximum.
    inst.vigil(&["resource", "undrain", "2"]).ok();
    let id = inst.submit(&["-N2-3", "true"]);
    assert!(inst.wait_state(&id, "INACTIVE", CMD_TIMEOUT));
    assert_eq!(inst.job(&id)["nnodes"], 3, "{}", inst.job(&id));
}

/// `-N2-3 -n6` on nodes of 2 cores: 2 nodes cannot hold 3 tasks each, so the job takes 3 (Slurm's rule: the
/// largest count of the range that fits), 2 tasks on each; `-n8` fits no count of the range and is refused,
/// saying what each end would need.
#[test]
fn node_range_with_a_task_total_runs_on_the_most_nodes_that_fit() {
    let inst = Instance::start(3, &["resource.synthetic=pack:1 core:2 pu:1"]);
    let o = inst.vigil(&["run", "-N2-3", "-n6", "sh", "-c", "echo $VIGIL_BROKER_RANK $VIGIL_JOB_NNODES"]);
    o.ok();
    let mut lines = o.lines();
    lines.sort_unstable();
    assert_eq!(lines, vec!["0 3", "0 3", "1 3", "1 3", "2 3", "2 3"], "{}", o.dump());
    let o = inst.vigil(&["run", "-N2-3", "-n8", "true"]);
    assert!(
        o.code != 0
            && o.stderr.contains(
                "requested 8 tasks on 2-3 nodes but no node count in that range fits this instance: 3 nodes would \
                 need 3 cores each (none has that); 2 nodes would need 4 cores each (none has that)"
            ),
        "{}",
        o.dump()
    );
}

/// A hostfile task map: `#` comments and blank lines are skipped, each line without `-n` is a task, and what
/// cannot run is refused naming the option and the line: a host `-n` leaves without a task (not "-n must be >=
/// -N"), a `-N` other than its host count.
#[test]
fn hostfile_lines_comments_and_errors() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["getattr", "hostname"]);
    o.ok();
    let me = o.stdout.trim().to_string();
    let file = inst.dir.path().join("hosts");
    std::fs::write(&file, format!("# where each rank's data is\n\n{me}\n{me}   # rank 1 too\n")).unwrap();
    let opt = format!("--taskmap=hostfile:{}", file.display());
    let o = inst.vigil(&["run", &opt, "sh", "-c", "echo $VIGIL_TASK_RANK $VIGIL_JOB_SIZE"]);
    o.ok();
    let mut lines = o.lines();
    lines.sort_unstable();
    assert_eq!(lines, vec!["0 2", "1 2"], "one task per line: {}", o.dump());
    std::fs::write(&file, "# two hosts\nhostA\n\nhostB\n").unwrap();
    let o = inst.vigil(&["run", "-n1", &opt, "true"]);
    assert_ne!(o.code, 0, "refused: {}", o.dump());
    assert!(o.stderr.contains(&format!("{opt}: line 4: host hostB would run no task")), "{}", o.dump());
    assert!(!o.stderr.contains("-n must be >= -N"), "{}", o.dump());
    let o = inst.vigil(&["run", "-N3", &opt, "true"]);
    assert!(o.code != 0 && o.stderr.contains("the file names 2 host(s) (hostA,hostB)"), "{}", o.dump());
    // A bad line: the option named once, not `--taskmap=hostfile:F: hostfile:F: line 2: ...` (trial item 4c).
    std::fs::write(&file, "hostA\nnode[\n").unwrap();
    let o = inst.vigil(&["run", &opt, "true"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.starts_with(&format!("vigil: {opt}: line 2: ")), "{}", o.dump());
    assert!(!o.stderr.contains("hostfile:hostfile:") && o.stderr.matches("hostfile:").count() == 1, "{}", o.dump());
}

/// A refusal of what a command-line option put in the jobspec names the option as typed, not its jobspec path
/// (trial item 4d); a jobspec file keeps its paths.
#[test]
fn refusals_name_the_option_as_typed() {
    let inst = Instance::start(3, &[]);
    let said = |args: &[&str]| {
        let o = inst.vigil(args);
        assert_eq!(o.code, 1, "{}", o.dump());
        o.stderr.trim().to_string()
    };
    let e = said(&["run", "-o", "kill-timeout", "true"]);
    assert!(e.starts_with("vigil: -o kill-timeout: expected kill-timeout=DURATION"), "{e}");
    let e = said(&["run", "-o", "kill-timeout=100s", "true"]);
    assert!(e.contains("-o kill-timeout=100s: ") && e.contains("is more than this instance allows"), "{e}");
    assert!(!e.contains("attributes.system"), "{e}");
    let e = said(&["run", "-N3", "--taskmap=manual:[[0,2,1,2]]", "true"]);
    assert!(e.starts_with("vigil: --taskmap=manual:[[0,2,1,2]]: "), "{e}");
    assert!(!e.contains("attributes.system"), "{e}");
    let o = inst.vigil(&["run", "--dry-run", "-o", "kill-timeout=100s", "true"]);
    o.ok();
    let file = inst.dir.path().join("job.json");
    std::fs::write(&file, &o.stdout).unwrap();
    let e = said(&["job", "submit", file.to_str().unwrap()]);
    assert!(e.contains("attributes.system.shell.options.kill-timeout: ") && e.contains("is more than"), "{e}");
}
