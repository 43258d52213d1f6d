//! The examples of RFC 14 (canonical jobspec) and RFC 25 (jobspec V1), rewritten in our own words (other commands,
//! labels and paths; the same resource graphs, counts, task counts and attribute shapes), run through
//! [`Jobspec::parse`] and [`Jobspec::validate`].
//!
//! Every RFC 14 example is a canonical jobspec, so each must parse. Most carry `version: 999`; each is validated as
//! written (refused: `version`) and again with `version: 1`, when it must either validate or be refused naming the
//! field that makes it something V1 does not have. Every RFC 25 example must validate, with the counts the RFC's
//! text gives for it. `docs/conformance.md` lists the verdicts.

use super::*;

/// What a validated example asks for: (nodes, slots, cores per slot, GPUs per slot, tasks).
type Shape = (Option<u32>, u32, u32, u32, u32);

/// A jobspec with the attributes every RFC example carries (a duration written `3600.`, a cwd, one variable).
fn spec(version: u64, resources: &str, tasks: &str, system: &str) -> String {
    format!(
        "version: {version}\nresources:\n{resources}\ntasks:\n{tasks}\nattributes:\n  system:\n    duration: 3600.\n    \
         cwd: /srv/ana\n    environment:\n      HOME: /srv/ana\n{system}"
    )
}

/// One task of `command` in slot `label`, `count` being `per_slot: 1` or the like.
fn task(command: &str, label: &str, count: &str) -> String {
    format!("  - command: [{command}]\n    slot: {label}\n    count:\n      {count}\n")
}

fn shape(r: &JobRequest) -> Shape {
    (r.nnodes, r.nslots, r.cores_per_slot, r.gpus_per_slot, r.ntasks)
}

/// Parse (must succeed: RFC 14 structure) and validate.
fn verdict(name: &str, text: &str) -> Result<Shape, String> {
    let js = Jobspec::parse(text).unwrap_or_else(|e| panic!("{name}: a canonical jobspec must parse: {e}\n{text}"));
    js.validate().map(|r| shape(&r)).map_err(|e| e.to_string())
}

fn check(name: &str, text: &str, want: Result<Shape, &str>) {
    let got = if text.starts_with("version: 999") {
        let as_written = verdict(name, text);
        assert_eq!(as_written, Err("version: must be 1, got 999".to_string()), "{name}");
        verdict(name, &text.replacen("version: 999", "version: 1", 1))
    } else {
        verdict(name, text)
    };
    match (&got, want) {
        (Ok(got), Ok(want)) => assert_eq!(*got, want, "{name}"),
        (Err(got), Err(want)) => assert!(got.starts_with(want), "{name}: want {want:?}\n got {got:?}"),
        _ => panic!("{name}: want {want:?}, got {got:?}"),
    }
}

const NODE_NOT_V1: &str = "resources[0].with[0].type: must be core or gpu, got node";

#[test]
fn rfc25_examples_validate() {
    // The example: 4 nodes, each one slot of 2 cores, one task per slot.
    let nodes = |n: u32, slots: u32, leaves: &str| {
        format!(
            "  - type: node\n    count: {n}\n    with:\n      - type: slot\n        count: {slots}\n        label: \
             rank\n        with:\n{leaves}"
        )
    };
    let cores = |n: u32| format!("          - type: core\n            count: {n}\n");
    let gpus = |n: u32| format!("          - type: gpu\n            count: {n}\n");
    let per_slot = task("sim, --in, a.dat", "rank", "per_slot: 1");
    check("RFC 25 example", &spec(1, &nodes(4, 1, &cores(2)), &per_slot, ""), Ok((Some(4), 4, 2, 0, 4)));
    // 1.1: an instance on each of 4 nodes (`salloc -N4`).
    let start = task("vigil, start", "rank", "per_slot: 1");
    check("RFC 25 use case 1.1", &spec(1, &nodes(4, 1, &cores(1)), &start, ""), Ok((Some(4), 4, 1, 0, 4)));
    // 2.1: 5 tasks over 4 nodes (`srun -n5 -N4`). RFC 25's text says a total is at most the slot count, but
    // this example of its own has 5 tasks for 4 slots; flux-core runs it, and so do we (tasks share slots).
    let five = task("uname", "rank", "total: 5");
    check("RFC 25 use case 2.1", &spec(1, &nodes(4, 1, &cores(1)), &five, ""), Ok((Some(4), 4, 1, 0, 5)));
    // 2.2 and 2.3: 10 slots of 2 cores (and a GPU), no node level.
    let slots = |leaves: &str| {
        format!("  - type: slot\n    count: 10\n    label: rank\n    with:\n{}", leaves.replace("          ", "      "))
    };
    check("RFC 25 use case 2.2", &spec(1, &slots(&cores(2)), &per_slot, ""), Ok((None, 10, 2, 0, 10)));
    let both = cores(2) + &gpus(1);
    check("RFC 25 use case 2.3", &spec(1, &slots(&both), &per_slot, ""), Ok((None, 10, 2, 1, 10)));
    // 2.4: 16 tasks on 4 nodes, each with a core and a GPU.
    let one_each = cores(1) + &gpus(1);
    check("RFC 25 use case 2.4", &spec(1, &nodes(4, 4, &one_each), &per_slot, ""), Ok((Some(4), 16, 1, 1, 16)));
    // Found by running them: a GPU count of 0 (flux-core's V1 validator allows it: no GPU) and a `unit`.
    let no_gpu = cores(1) + &gpus(0);
    check("gpu count 0", &spec(1, &nodes(2, 1, &no_gpu), &per_slot, ""), Ok((Some(2), 2, 1, 0, 2)));
    let unit = "          - type: core\n            count: 3\n            unit: core\n";
    check("unit", &spec(1, &nodes(2, 1, unit), &per_slot, ""), Ok((Some(2), 2, 3, 0, 2)));
}

#[test]
fn rfc14_examples_parse_and_get_a_v1_verdict() {
    let attrs_per_slot = task("vigil, start", "all", "per_slot: 1");
    // Example 1 is the V1 example. Example 2 (4 slots of one node each) is canonical but not V1: a slot holds
    // cores and GPUs only.
    let slot_of_node = |count: &str, label: &str, node_extra: &str| {
        format!(
            "  - type: slot\n    count: {count}\n    label: {label}\n    with:\n      - type: node\n        count: \
             1\n{node_extra}"
        )
    };
    check("RFC 14 example 2", &spec(1, &slot_of_node("4", "all", ""), &attrs_per_slot, ""), Err(NODE_NOT_V1));
    // 1.1: same graph, version 999.
    check("RFC 14 use case 1.1", &spec(999, &slot_of_node("4", "all", ""), &attrs_per_slot, ""), Err(NODE_NOT_V1));
    // 1.2: a slot count from 3 to 30 in steps of 1 (operator and operand both given).
    let range = "\n      min: 3\n      max: 30\n      operator: \"+\"\n      operand: 1";
    check("RFC 14 use case 1.2", &spec(999, &slot_of_node(range, "all", ""), &attrs_per_slot, ""), Err(NODE_NOT_V1));
    // 1.3 and 1.4: node > socket > core inside a slot, with `exclusive: false` and `{min: N}` counts.
    let sockets = |min: bool| {
        let c = |n: u32| if min { format!("{{min: {n}}}") } else { n.to_string() };
        format!(
            "        exclusive: false\n        with:\n          - type: socket\n            count: {}\n            \
             with:\n              - type: core\n                count: {}\n",
            c(2),
            c(4)
        )
    };
    let t = task("vigil, start", "nodes", "per_slot: 1");
    check("RFC 14 use case 1.3", &spec(999, &slot_of_node("4", "nodes", &sockets(true)), &t, ""), Err(NODE_NOT_V1));
    check("RFC 14 use case 1.4", &spec(999, &slot_of_node("4", "nodes", &sockets(false)), &t, ""), Err(NODE_NOT_V1));
    // 1.5: two top-level vertices (cluster, switch), memory with a unit, a made-up resource type, two tasks.
    let two = "  - type: cluster\n    count: 1\n    with:\n      - type: slot\n        count: 2\n        label: fast\n        \
               with:\n          - type: node\n            count: 1\n            with:\n              - type: memory\n                \
               count: 4\n                unit: GB\n              - type: nic100g\n                count: 1\n  - type: switch\n    \
               count: 1\n    with:\n      - type: slot\n        count: 2\n        label: pair\n        with:\n          - type: \
               node\n            count: 1\n            with:\n              - type: core\n                count: 2";
    let two_tasks = task("vigil, start", "fast", "per_slot: 1") + &task("vigil, start", "pair", "per_slot: 1");
    check("RFC 14 use case 1.5", &spec(999, two, &two_tasks, ""), Err("resources: must contain exactly one resource"));
    // 1.6 and 1.7: a slot under a cluster (switch), nodes counted `{min: 1}`, tasks `per_resource`.
    let under = |top: &str, n: u32, cores: u32| {
        format!(
            "  - type: {top}\n    count: {n}\n    with:\n      - type: slot\n        count: 1\n        label: all\n        \
             with:\n          - type: node\n            count: {{min: 1}}\n            exclusive: false\n            \
             with:\n              - type: core\n                count: {cores}"
        )
    };
    let per_node = task("vigil, start", "all", "per_resource: {type: node, count: 1}");
    let not_top = |t: &str| format!("resources[0].type: must be node or slot, got {t}");
    check("RFC 14 use case 1.6", &spec(999, &under("cluster", 2, 30), &per_node, ""), Err(&not_top("cluster")));
    check("RFC 14 use case 1.7", &spec(999, &under("switch", 3, 1), &per_node, ""), Err(&not_top("switch")));
    // 1.8: a count string (an RFC 22 idset of the acceptable counts).
    let squares = slot_of_node("\"1,4,9,36\"", "all", "");
    check("RFC 14 use case 1.8", &spec(999, &squares, &attrs_per_slot, ""), Err("resources[0].count: a count string"));
    // 2.1 and 2.2: 4 slots of a node, 5 tasks per slot or 5 in total.
    let t = |count: &str| task("uname, -a", "all", count);
    let four = slot_of_node("4", "all", "");
    check("RFC 14 use case 2.1", &spec(999, &four, &t("per_slot: 5"), ""), Err(NODE_NOT_V1));
    check("RFC 14 use case 2.2", &spec(999, &four, &t("total: 5"), ""), Err(NODE_NOT_V1));
    // 2.3: 10 slots of 2 cores: V1 once its version is 1.
    let ten = "  - type: slot\n    label: all\n    count: 10\n    with:\n      - type: core\n        count: 2";
    check("RFC 14 use case 2.3", &spec(999, ten, &t("per_slot: 1"), ""), Ok((None, 10, 2, 0, 10)));
    // 2.4: one node holding two slots (cores and memory), two tasks.
    let two_slots = "  - type: node\n    count: 1\n    with:\n      - type: slot\n        label: reader\n        count: 10\n        \
                     with:\n          - type: core\n            count: 1\n          - type: memory\n            count: 4\n            \
                     unit: GB\n      - type: slot\n        label: store\n        count: 1\n        with:\n          - type: core\n            \
                     count: 6\n          - type: memory\n            count: 24\n            unit: GB";
    let tasks = task("reader", "reader", "per_slot: 1") + &task("store", "store", "per_slot: 1");
    check(
        "RFC 14 use case 2.4",
        &spec(999, two_slots, &tasks, ""),
        Err("resources[0].with: node must contain exactly one slot"),
    );
    // 2.5: memory `{min: 2}` GB beside a core in each slot.
    let mem = "  - type: slot\n    label: all\n    count: 10\n    with:\n    - type: memory\n      count:\n        min: 2\n      \
               unit: GB\n    - type: core\n      count: 1";
    check(
        "RFC 14 use case 2.5",
        &spec(999, mem, &t("per_slot: 1"), ""),
        Err("resources[0].with[0].type: must be core or gpu, got memory"),
    );
    // 2.6: a node with at least 4 GB of memory in each of 2 slots, 10 tasks.
    let big = slot_of_node(
        "2",
        "all",
        "        with:\n          - type: memory\n            count:\n              min: 4\n            unit: GB\n",
    );
    check("RFC 14 use case 2.6", &spec(999, &big, &t("total: 10"), ""), Err(NODE_NOT_V1));
    // 2.7: two tasks, the second with its own environment in which null unsets a variable; null in
    // attributes.system.environment unsets one too (RFC 14).
    let one = slot_of_node("1", "all", "");
    let env_tasks = t("per_slot: 1")
        + &t("per_slot: 1")
        + "    attributes:\n      environment:\n        SCRATCH: null\n        LEVEL: \"2\"\n";
    let unset = "      SCRATCH: null\n";
    let text =
        spec(999, &one, &env_tasks, "").replace("      HOME: /srv/ana\n", &format!("      HOME: /srv/ana\n{unset}"));
    check("RFC 14 use case 2.7", &text, Err(NODE_NOT_V1));
    let js = Jobspec::parse(&text).expect("parses");
    assert_eq!(js.attributes.system.environment.keys().collect::<Vec<_>>(), ["HOME"], "null unsets");
    // 2.8: RFC 26 dependencies of the OpenMP-style schemes (extra keys `type` and `scope`).
    let deps = "    dependencies:\n      - type: in\n        scope: user\n        scheme: fluid\n        value: brave-red-fox\n      \
                - type: out\n        scope: user\n        scheme: string\n        value: stage2\n";
    check("RFC 14 use case 2.8", &spec(999, &one, &t("per_slot: 1"), deps), Err(NODE_NOT_V1));
    // 2.9: an RFC 31 `properties` constraint.
    let props = "    constraints:\n      properties:\n        - nvme\n";
    check("RFC 14 use case 2.9", &spec(999, &one, &t("per_slot: 1"), props), Err(NODE_NOT_V1));
}

#[test]
fn rfc14_system_attributes_on_a_v1_jobspec() {
    // The RFC 14 use cases 2.8 and 2.9 on a V1 resource graph: what V1 then says of each attribute.
    let v1 = |system: &str| {
        let r = "  - type: slot\n    count: 1\n    label: all\n    with:\n      - type: core\n        count: 1";
        let text = spec(1, r, &task("a", "all", "per_slot: 1"), system);
        Jobspec::parse(&text).and_then(|j| j.validate()).map_err(|e| e.to_string())
    };
    let deps = "    dependencies:\n      - scheme: afterok\n        value: f2oLkTLb\n";
    assert!(v1(deps).is_ok(), "RFC 26 afterok on a job id: the job manager checks the id");
    let begin = "    dependencies:\n      - scheme: begin-time\n        value: 1700000000.5\n";
    assert!(v1(begin).is_ok(), "Flux's begin-time takes a number");
    let odd = "    dependencies:\n      - scheme: string\n        value: x\n";
    assert!(v1(odd).err().is_some_and(|e| e.starts_with("attributes.system.dependencies[0].scheme: unknown")));
    assert!(v1("    dependencies: []\n").is_ok(), "no dependency is nothing to refuse");
    let props = "    constraints:\n      properties:\n        - nvme\n";
    assert!(v1(props)
        .err()
        .is_some_and(|e| e.starts_with("attributes.system.constraints.properties: node properties")));
    let ranks = "    constraints:\n      ranks: [\"0-1\"]\n";
    assert!(v1(ranks).is_ok_and(|r| r.constraint.is_some()));
    let named =
        "    queue: batch\n    bank: physics\n    project: p1\n    preemptible-after: 60\n    job: {name: run1}\n";
    let req = v1(named).expect("RFC 14's common attributes");
    assert!(req.warnings.is_empty(), "{:?}", req.warnings);
    // RFC 14's `distribution` on a task is kept and warned about (the shell's taskmap option places tasks).
    let text = spec(
        1,
        "  - type: slot\n    count: 1\n    label: all\n    with:\n      - type: core\n        count: 1",
        &(task("a", "all", "per_slot: 1") + "    distribution: cyclic\n"),
        "",
    );
    let req = Jobspec::parse(&text).and_then(|j| j.validate()).expect("valid");
    assert_eq!(req.warnings, ["tasks[0].distribution: ignored (the shell's taskmap option places tasks)"]);
    // A slot may say `exclusive: true` (RFC 25's schema; RFC 14's default for slots).
    let text = spec(
        1,
        "  - type: slot\n    count: 2\n    label: all\n    exclusive: true\n    with:\n      - type: core\n        count: 1",
        &task("a", "all", "per_slot: 1"),
        "",
    );
    assert_eq!(verdict("exclusive slot", &text), Ok((None, 2, 1, 0, 2)));
}

#[test]
fn rfc14_parts_survive_a_round_trip() {
    // What parse keeps of RFC 14 (unit, id, count strings, per_resource, distribution) prints back as read.
    let text = r#"{"version": 999, "resources": [{"type": "slot", "count": "1,4,9", "label": "all", "with": [
        {"type": "node", "count": 1, "id": "0-3", "with": [{"type": "memory", "count": {"min": 2}, "unit": "GB"}]}]}],
        "tasks": [{"command": ["a"], "slot": "all", "count": {"per_resource": {"type": "node", "count": 2}},
        "distribution": "cyclic"}], "attributes": {"system": {"duration": 0}}}"#;
    let js = Jobspec::parse(text).expect("canonical");
    assert_eq!(Jobspec::parse(&js.to_json()), Ok(js.clone()));
    assert_eq!(js.to_yaml().and_then(|y| Jobspec::parse(&y)), Ok(js));
}

#[test]
fn rfc26_no_dependency_no_key() {
    // RFC 26: "If job requests no dependencies, the key attributes.system.dependencies SHALL NOT be added".
    let system = |b: JobspecBuilder| {
        let v: serde_json::Value = serde_json::from_str(&b.build().expect("valid").to_json()).expect("JSON");
        v["attributes"]["system"].clone()
    };
    let none = system(JobspecBuilder::new(vec!["a".to_string()]));
    assert!(none.get("dependencies").is_none(), "{none}");
    let dep = serde_json::json!({"scheme": "afterany", "value": "f2oLkTLb", "type": "out"});
    let one = system(JobspecBuilder::new(vec!["a".to_string()]).dependency(dep.clone()));
    assert_eq!(one["dependencies"], serde_json::json!([dep]), "extra keys are kept (RFC 26: the scheme's)");
}
