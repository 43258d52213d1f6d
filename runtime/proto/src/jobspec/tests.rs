//! Tests of parsing and validation: RFC 25 examples, every rejection naming its field, and proptests that hostile
//! input never panics. The builder's tests are beside it in `builder.rs`.

use super::*;
use proptest::prelude::*;
use serde_json::json;

/// RFC 25 style: a single slot with cores, per-slot task count.
const SIMPLE_YAML: &str = r#"
version: 1
resources:
  - type: slot
    count: 4
    label: default
    with:
      - type: core
        count: 2
tasks:
  - command: [ "hostname" ]
    slot: default
    count:
      per_slot: 1
attributes:
  system:
    duration: 0
"#;

/// RFC 25 style: nodes, each with slots of cores and a GPU, total tasks.
const NODE_GPU_YAML: &str = r#"
version: 1
resources:
  - type: node
    count: 2
    exclusive: true
    with:
      - type: slot
        count: {min: 3}
        label: task
        with:
          - type: core
            count: 4
          - type: gpu
            count: 1
tasks:
  - command: [ "flux", "start", "app --x" ]
    slot: task
    count:
      total: 5
attributes:
  system:
    duration: 3600.5
    cwd: /home/flux
    environment:
      HOME: /home/flux
      LANG: C
    shell:
      options:
        verbose: 1
    queue: batch
    mystery: 7
  user:
    study: 42
"#;

fn parse_ok(s: &str) -> Jobspec {
    Jobspec::parse(s).expect("valid jobspec")
}

#[test]
fn simple_slot_core() {
    let js = parse_ok(SIMPLE_YAML);
    let req = js.validate().expect("valid V1");
    assert_eq!(
        req,
        JobRequest {
            nnodes: None,
            nslots: 4,
            slots_per_node: None,
            cores_per_slot: 2,
            gpus_per_slot: 0,
            ntasks: 4,
            command: vec!["hostname".into()],
            duration: None,
            tasks_per_slot: true,
            ..Default::default()
        }
    );
    assert_eq!(Jobspec::parse(&js.to_json()), Ok(js.clone()));
}

#[test]
fn requeue_is_a_system_attribute_or_a_shell_option() {
    let built = JobspecBuilder::new(["true"]).requeue(true).build().expect("builds");
    let v: Value = serde_json::from_str(&built.to_json()).expect("json");
    assert_eq!(v.pointer("/attributes/system/requeue"), Some(&json!(true)));
    let req = built.validate().expect("valid");
    assert!(req.requeue && req.warnings.is_empty(), "{req:?}");
    assert!(!JobspecBuilder::new(["true"]).build().unwrap().validate().unwrap().requeue);
    for (opt, want) in [(json!(true), true), (json!("yes"), true), (json!("0"), false), (json!(1), true)] {
        let b = JobspecBuilder::new(["true"]).shell_option("requeue", opt.clone());
        assert_eq!(b.build().unwrap().validate().unwrap().requeue, want, "-o requeue={opt}");
    }
    let mut bad = v.clone();
    bad["attributes"]["system"]["requeue"] = json!("maybe");
    let e = Jobspec::from_value(&bad).unwrap().validate().unwrap_err().to_string();
    assert!(e.contains("attributes.system.requeue: must be a boolean"), "{e}");
    let b = JobspecBuilder::new(["true"]).shell_option("requeue", json!("maybe"));
    let e = b.build().unwrap().validate().unwrap_err().to_string();
    assert!(e.contains("attributes.system.shell.options.requeue"), "{e}");
}

/// `-o on-node-loss=kill|notify`: kill by default; any other value is refused, naming the option.
#[test]
fn on_node_loss_is_kill_or_notify() {
    let with = |v: Value| JobspecBuilder::new(["true"]).shell_option(ON_NODE_LOSS_KEY, v).build().unwrap().validate();
    assert_eq!(JobspecBuilder::new(["true"]).build().unwrap().validate().unwrap().on_node_loss, OnNodeLoss::Kill);
    assert_eq!(with(json!("notify")).unwrap().on_node_loss, OnNodeLoss::Notify);
    assert_eq!(with(json!("kill")).unwrap().on_node_loss, OnNodeLoss::Kill);
    for bad in [json!("no-kill"), json!(true), json!(1)] {
        let e = with(bad.clone()).unwrap_err().to_string();
        assert!(e.contains("attributes.system.shell.options.on-node-loss") && e.contains("notify"), "{bad}: {e}");
    }
}

/// `-N MIN-MAX` is an RFC 14 range on the node count; MIN > MAX and operators other than `+` are refused,
/// naming the field.
#[test]
fn node_ranges() {
    let b = JobspecBuilder::new(["hostname"]).nnodes_range(2, 3);
    let js = b.build().expect("builds");
    let v: Value = serde_json::from_str(&js.to_json()).unwrap();
    assert_eq!(v.pointer("/resources/0/count"), Some(&json!({"min": 2, "max": 3, "operator": "+", "operand": 1})));
    let req = js.validate().unwrap();
    assert_eq!((req.nnodes, req.nnodes_max, req.ntasks, req.tasks_per_slot), (Some(2), Some(3), 2, true));
    let e = JobspecBuilder::new(["x"]).nnodes_range(3, 2).build().unwrap_err().to_string();
    assert!(e.contains("the minimum (3) is more than the maximum (2)"), "{e}");
    let with = |count: Value| {
        let mut v = v.clone();
        v["resources"][0]["count"] = count;
        Jobspec::from_value(&v).and_then(|j| j.validate()).map_err(|e| e.to_string())
    };
    assert_eq!(with(json!({"min": 3, "max": 2})).unwrap_err(), "resources[0].count.max: must be >= min");
    assert!(with(json!({"min": 2, "max": 8, "operator": "*", "operand": 2})).unwrap_err().contains("operator"));
    assert_eq!(with(json!({"min": 2, "max": 2})).unwrap().nnodes_max, None, "a range of one count is fixed");
    assert_eq!(with(json!({"min": 2})).unwrap().nnodes_max, None, "V1: min alone is used");
    let few = JobspecBuilder::new(["x"]).nnodes_range(2, 4).ntasks(3).build().unwrap().validate().unwrap();
    assert_eq!(few.nnodes_max, Some(3), "no more nodes than tasks");
    assert_eq!((few.slots_on(2), few.slots_on(3)), (2, 1));
}

/// `-N 2-3 -n 6` (Slurm's `--nodes=2-3 --ntasks=6`): the jobspec asks for the slots of the most nodes, and
/// the request needs 3 slots per node on 2 nodes, 2 on 3; a fixed count or one task per node does not vary.
#[test]
fn a_node_range_with_a_task_total_sizes_its_slots_by_the_nodes_it_gets() {
    let js = JobspecBuilder::new(["x"]).nnodes_range(2, 3).ntasks(6).build().unwrap();
    let v: Value = serde_json::from_str(&js.to_json()).unwrap();
    assert_eq!(v.pointer("/resources/0/with/0/count"), Some(&json!(2)), "slots for 3 nodes");
    let req = js.validate().unwrap();
    assert!(req.slots_vary());
    assert_eq!((req.nnodes, req.nnodes_max, req.ntasks), (Some(2), Some(3), 6));
    assert_eq!((req.slots_on(2), req.slots_on(3)), (3, 2));
    // An uneven spread needs the larger share on every node (as a fixed -N 2 -n 5 asks for 3 slots each).
    let odd = JobspecBuilder::new(["x"]).nnodes_range(2, 4).ntasks(7).build().unwrap().validate().unwrap();
    assert_eq!((odd.slots_on(2), odd.slots_on(3), odd.slots_on(4)), (4, 3, 2));
    let fixed = JobspecBuilder::new(["x"]).nnodes(2).ntasks(6).build().unwrap().validate().unwrap();
    assert!(!fixed.slots_vary());
    assert_eq!((fixed.slots_on(2), fixed.slots_on(3)), (3, 3));
    let per_node = JobspecBuilder::new(["x"]).nnodes_range(2, 3).build().unwrap().validate().unwrap();
    assert!(!per_node.slots_vary());
    assert_eq!(per_node.slots_on(3), 1);
    // A jobspec written with the slots of the minimum (as vigil did before) keeps them at every count.
    let mut old = v.clone();
    old["resources"][0]["with"][0]["count"] = json!(3);
    let req = Jobspec::from_value(&old).unwrap().validate().unwrap();
    assert_eq!((req.slots_on(2), req.slots_on(3)), (3, 3));
}

/// `--taskmap`: the shell option in Flux's `{scheme, value}` form; an impossible map is refused naming the
/// option; a hostfile places the job on its hosts.
#[test]
fn taskmap_option() {
    use crate::taskmap::{Scheme, Taskmap};
    let b = JobspecBuilder::new(["x"]).nnodes(2).ntasks(4).taskmap(Scheme::Cyclic(1));
    let js = b.build().unwrap();
    let v: Value = serde_json::from_str(&js.to_json()).unwrap();
    assert_eq!(v.pointer("/attributes/system/shell/options/taskmap"), Some(&json!({"scheme": "cyclic", "value": "1"})));
    assert_eq!(js.validate().unwrap().taskmap, Scheme::Cyclic(1));
    let manual = Scheme::Manual(Taskmap::decode(&json!([[0, 2, 1, 2]])).unwrap());
    let ok = JobspecBuilder::new(["x"]).nnodes(2).ntasks(4).taskmap(manual.clone()).build().unwrap();
    assert!(ok.validate().is_ok());
    let bad = JobspecBuilder::new(["x"]).nnodes(2).ntasks(3).taskmap(manual.clone()).build().unwrap();
    let e = bad.validate().unwrap_err().to_string();
    assert_eq!(e, "attributes.system.shell.options.taskmap: got 4 tasks, expected 3");
    let range = JobspecBuilder::new(["x"]).nnodes_range(2, 3).ntasks(4).taskmap(manual).build().unwrap();
    assert!(range.validate().unwrap_err().to_string().contains("needs a fixed node count"));
    let hf = Scheme::Hostfile { path: "f".into(), hosts: vec!["b".into(), "a".into()] };
    let req = JobspecBuilder::new(["x"]).nnodes(2).ntasks(2).taskmap(hf).build().unwrap().validate().unwrap();
    let c = req.constraint.expect("the hostfile's hosts");
    assert!(c.matches(0, "a") && c.matches(1, "b") && !c.matches(2, "c"));
    let mut v = v.clone();
    v["attributes"]["system"]["shell"]["options"]["taskmap"] = json!({"scheme": "spiral"});
    let e = Jobspec::from_value(&v).unwrap().validate().unwrap_err().to_string();
    assert!(e.starts_with("attributes.system.shell.options.taskmap: unknown scheme 'spiral'"), "{e}");
}

#[test]
fn node_slot_core_gpu() {
    let js = parse_ok(NODE_GPU_YAML);
    let req = js.validate().expect("valid V1");
    assert_eq!(req.nnodes, Some(2));
    assert_eq!(req.slots_per_node, Some(3));
    assert_eq!(req.nslots, 6);
    assert_eq!(req.cores_per_slot, 4);
    assert_eq!(req.gpus_per_slot, 1);
    assert_eq!(req.ntasks, 5);
    assert_eq!(req.command, ["flux", "start", "app --x"]);
    assert_eq!(req.duration, Some(3600.5));
    assert_eq!(req.cwd.as_deref(), Some("/home/flux"));
    assert_eq!(req.environment.get("LANG").map(String::as_str), Some("C"));
    assert_eq!(req.shell_options.get("verbose"), Some(&json!(1)));
    assert!(req.exclusive);
    assert_eq!(req.warnings, vec!["attributes.system.mystery: unknown key, ignored".to_string()]);
    assert_eq!(js.attributes.user.get("study"), Some(&json!(42)));
    // Round trip via JSON and YAML keeps everything.
    assert_eq!(Jobspec::parse(&js.to_json()), Ok(js.clone()));
    let yaml = js.to_yaml().expect("yaml");
    assert_eq!(Jobspec::parse(&yaml), Ok(js.clone()));
    // serde Deserialize path.
    let via_serde: Result<Jobspec, _> = serde_json::from_str(&js.to_json());
    assert_eq!(via_serde.ok(), Some(js));
}

/// Apply `edit` to the JSON form of NODE_GPU_YAML and return the error text
/// from parse+validate.
fn error_after(edit: impl Fn(&mut Value)) -> String {
    let mut v = serde_json::to_value(parse_ok(NODE_GPU_YAML)).expect("to_value");
    edit(&mut v);
    match Jobspec::parse(&v.to_string()).and_then(|js| js.validate()) {
        Ok(_) => "no error".to_string(),
        Err(e) => e.to_string(),
    }
}

fn remove(v: &mut Value, key: &str) {
    if let Some(o) = v.as_object_mut() {
        o.remove(key);
    }
}

#[test]
fn rejections_name_the_field() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let slot = "/resources/0/with/0";
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|v| v["version"] = json!(2)), "version: must be 1, got 2"),
        (Box::new(|v| v["version"] = json!("1")), "version: must be 1, got \"1\""),
        (Box::new(|v| remove(v, "version")), "version: required"),
        (Box::new(|v| v["bogus"] = json!(1)), "bogus: unknown key"),
        (Box::new(|v| remove(v, "resources")), "resources: required list"),
        (Box::new(|v| v["resources"] = json!([])), "resources: must contain exactly one resource"),
        (
            Box::new(|v| v["resources"][0]["type"] = json!("socket")),
            "resources[0].type: must be node or slot, got socket",
        ),
        (Box::new(|v| v["resources"][0]["type"] = json!(3)), "resources[0].type: required non-empty string"),
        (Box::new(|v| v["resources"][0]["count"] = json!(0)), "resources[0].count: must be an integer >= 1"),
        (Box::new(|v| v["resources"][0]["count"] = json!(-1)), "resources[0].count: must be an integer >= 1"),
        (Box::new(|v| v["resources"][0]["count"] = json!(1.5)), "resources[0].count: must be an integer >= 1"),
        (
            Box::new(|v| v["resources"][0]["count"] = json!(5_000_000_000u64)),
            "resources[0].count: must be at most 4294967295",
        ),
        (Box::new(|v| remove(&mut v["resources"][0], "count")), "resources[0].count: required"),
        (Box::new(|v| v["resources"][0]["exclusive"] = json!("yes")), "resources[0].exclusive: must be a boolean"),
        (Box::new(|v| v["resources"][0]["label"] = json!("x")), "resources[0].label: only allowed on slot"),
        (Box::new(|v| v["resources"][0]["unit"] = json!(5)), "resources[0].unit: must be a string"),
        (Box::new(|v| v["resources"][0]["id"] = json!(5)), "resources[0].id: must be a string"),
        (
            Box::new(|v| v["resources"][0]["id"] = json!("0-3")),
            "resources[0].id: not allowed in a version 1 jobspec (RFC 25)",
        ),
        (Box::new(|v| v["resources"][0]["with"] = json!({})), "resources[0].with: must be a list"),
        (
            Box::new(|v| v["resources"][0]["with"] = json!([])),
            "resources[0].with: must contain at least one resource (RFC 14)",
        ),
        (
            Box::new(|v| v["resources"][0]["count"] = json!("4,9,16")),
            "resources[0].count: a count string is not allowed in a version 1 jobspec (RFC 25)",
        ),
        (
            Box::new(|v| v["resources"][0]["count"] = json!("2-8:2:*")),
            "resources[0].count: a count string is not allowed in a version 1 jobspec (RFC 25)",
        ),
        (Box::new(|v| v["resources"][0]["count"] = json!("many")), "resources[0].count: must be an integer"),
        (
            Box::new(|v| v["resources"][0]["count"] = json!({"min": 2, "operator": "+"})),
            "resources[0].count.operand: required with operator (RFC 14)",
        ),
        (
            Box::new(|v| v["resources"][0]["count"] = json!({"min": 2, "operand": 1})),
            "resources[0].count.operator: required with operand (RFC 14)",
        ),
        (
            Box::new(|v| v["resources"][0]["count"] = json!({"min": 2, "operator": "*", "operand": 1})),
            "resources[0].count.operand: must be >= 2 with operator *",
        ),
        (
            Box::new(|v| v["resources"][0]["count"] = json!({"min": 1, "operator": "^", "operand": 2})),
            "resources[0].count.min: must be >= 2 with operator ^",
        ),
        (
            Box::new(|v| v["resources"][0]["count"] = json!({"min": 1, "max": 0})),
            "resources[0].count.max: must be an integer >= 1",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["type"] = json!("core")
                }
            }),
            "resources[0].with[0].type: must be slot, got core",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["count"] = json!(0)
                }
            }),
            "resources[0].with[0].count: must be an integer >= 1",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["count"] = json!({"min": 0})
                }
            }),
            "resources[0].with[0].count.min: must be an integer >= 1",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["count"] = json!({"max": 2})
                }
            }),
            "resources[0].with[0].count.min: required",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["count"] = json!({"min": 3, "max": 2})
                }
            }),
            "resources[0].with[0].count.max: must be >= min",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["count"] = json!({"min": 3, "step": 2})
                }
            }),
            "resources[0].with[0].count.step: unknown key",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["count"] = json!({"min": 3, "operator": "%"})
                }
            }),
            "resources[0].with[0].count.operator: must be one of",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    remove(s, "label")
                }
            }),
            "resources[0].with[0].label: required non-empty string",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["label"] = json!(7)
                }
            }),
            "resources[0].with[0].label: must be a string",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["exclusive"] = json!(false)
                }
            }),
            "resources[0].with[0].exclusive: a slot's resources are always its own",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"] = json!([{"type": "gpu", "count": 1}])
                }
            }),
            "resources[0].with[0].with: slot must contain a core",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][1]["type"] = json!("core")
                }
            }),
            "resources[0].with[0].with[1]: duplicate core in slot",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][1]["type"] = json!("memory")
                }
            }),
            "resources[0].with[0].with[1].type: must be core or gpu, got memory",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][0]["count"] = json!(0)
                }
            }),
            "resources[0].with[0].with[0].count: must be an integer >= 1",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][1]["count"] = json!("one")
                }
            }),
            "resources[0].with[0].with[1].count: must be an integer",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][1]["count"] = json!(-1)
                }
            }),
            "resources[0].with[0].with[1].count: must be an integer",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][1]["id"] = json!("0")
                }
            }),
            "resources[0].with[0].with[1].id: not allowed in a version 1 jobspec",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][0]["with"] = json!([{"type": "pu", "count": 1}])
                }
            }),
            "resources[0].with[0].with[0].with: core may not contain other resources",
        ),
        (
            Box::new(move |v| {
                if let Some(s) = v.pointer_mut(slot) {
                    s["with"][0]["label"] = json!("c")
                }
            }),
            "resources[0].with[0].with[0].label: only allowed on slot",
        ),
        (
            Box::new(
                |v| v["resources"] = json!([{"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}, {"type": "slot", "count": 1, "label": "b", "with": [{"type": "core", "count": 1}]}]),
            ),
            "resources: must contain exactly one resource (node or slot), got 2",
        ),
        (Box::new(|v| remove(v, "tasks")), "tasks: required list"),
        (Box::new(|v| v["tasks"] = json!([])), "tasks: must contain exactly one task, got 0"),
        (Box::new(|v| v["tasks"][0]["command"] = json!([])), "tasks[0].command: must be a non-empty array of strings"),
        (
            Box::new(|v| v["tasks"][0]["command"] = json!("hostname")),
            "tasks[0].command: must be a non-empty array of strings",
        ),
        (
            Box::new(|v| v["tasks"][0]["command"] = json!(["a", 1])),
            "tasks[0].command: must be a non-empty array of strings",
        ),
        (
            Box::new(|v| v["tasks"][0]["slot"] = json!("other")),
            "tasks[0].slot: must equal the slot label \"task\", got \"other\"",
        ),
        (Box::new(|v| remove(&mut v["tasks"][0], "slot")), "tasks[0].slot: required string"),
        (Box::new(|v| v["tasks"][0]["count"] = json!({"per_slot": 2})), "tasks[0].count.per_slot: must be 1"),
        (Box::new(|v| v["tasks"][0]["count"] = json!({"total": 0})), "tasks[0].count.total: must be an integer >= 1"),
        (
            Box::new(|v| v["tasks"][0]["count"] = json!({"total": 1, "per_slot": 1})),
            "tasks[0].count: must have exactly one of per_slot, total or per_resource",
        ),
        (
            Box::new(|v| v["tasks"][0]["count"] = json!({"per_resource": {"type": "node", "count": 1}})),
            "tasks[0].count.per_resource: not allowed in a version 1 jobspec (RFC 25)",
        ),
        (
            Box::new(|v| v["tasks"][0]["count"] = json!({"per_resource": {"type": "node", "count": 0}})),
            "tasks[0].count.per_resource.count: must be an integer >= 1",
        ),
        (
            Box::new(|v| v["tasks"][0]["count"] = json!({"per_resource": {"count": 1}})),
            "tasks[0].count.per_resource.type: required non-empty string",
        ),
        (Box::new(|v| v["tasks"][0]["distribution"] = json!(1)), "tasks[0].distribution: must be a string"),
        (Box::new(|v| v["tasks"][0]["count"] = json!({"each": 1})), "tasks[0].count.each: unknown key"),
        (Box::new(|v| v["tasks"][0]["count"] = json!(1)), "tasks[0].count: must be a mapping"),
        (Box::new(|v| v["tasks"][0]["where"] = json!(1)), "tasks[0].where: unknown key"),
        (Box::new(|v| v["tasks"][0] = json!("x")), "tasks[0]: must be a mapping"),
        (Box::new(|v| v["attributes"]["other"] = json!({})), "attributes.other: unknown key"),
        (Box::new(|v| v["attributes"]["user"] = json!([])), "attributes.user: must be a mapping"),
        (Box::new(|v| v["attributes"]["system"] = json!(1)), "attributes.system: must be a mapping"),
        (Box::new(|v| remove(&mut v["attributes"]["system"], "duration")), "attributes.system.duration: required"),
        (Box::new(|v| remove(v, "attributes")), "attributes.system.duration: required"),
        (
            Box::new(|v| v["attributes"]["system"]["duration"] = json!(-1)),
            "attributes.system.duration: must be a number of seconds >= 0",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["duration"] = json!("1h")),
            "attributes.system.duration: must be a number of seconds >= 0",
        ),
        (Box::new(|v| v["attributes"]["system"]["cwd"] = json!(1)), "attributes.system.cwd: must be a string"),
        (
            Box::new(|v| v["attributes"]["system"]["environment"]["X"] = json!(1)),
            "attributes.system.environment.X: must be a string",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["environment"] = json!([])),
            "attributes.system.environment: must be a mapping",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["shell"]["options"] = json!(1)),
            "attributes.system.shell.options: must be a mapping",
        ),
        // The other attributes.system keys RFC 14 names, by their RFC 14 types.
        (
            Box::new(|v| v["attributes"]["system"]["constraints"] = json!(null)),
            "attributes.system.constraints: must be a mapping of constraint operators (RFC 31)",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["constraints"] = json!(["rank:0"])),
            "attributes.system.constraints: must be a mapping of constraint operators (RFC 31)",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["constraints"] = json!({"ranks": ["3,2"]})),
            "attributes.system.constraints.ranks[0]: idset \"3,2\": \"2\" is out of order",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["dependencies"] = json!({"scheme": "afterok"})),
            "attributes.system.dependencies: must be a list of dependencies (RFC 26: {scheme, value})",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["dependencies"] = json!(["afterok:f1"])),
            "attributes.system.dependencies[0]: must be a mapping {scheme, value} (RFC 26)",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["dependencies"] = json!([{"scheme": "afterok"}])),
            "attributes.system.dependencies[0].value: required string (RFC 26)",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["dependencies"] = json!([{"scheme": 1, "value": "f1"}])),
            "attributes.system.dependencies[0].scheme: must be a string",
        ),
        (
            Box::new(|v| {
                v["attributes"]["system"]["dependencies"] =
                    json!([{"scheme": "afterok", "value": "f1"}, {"scheme": "afterany", "value": 2}])
            }),
            "attributes.system.dependencies[1].value: must be a string",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["dependencies"] = json!([{"scheme": "afterfoo", "value": "f1"}])),
            "attributes.system.dependencies[0].scheme: unknown dependency scheme \"afterfoo\" (known: after, afterany, \
             afterok, afternotok, afterexcept, begin-time, singleton)",
        ),
        (Box::new(|v| v["attributes"]["system"]["queue"] = json!(1)), "attributes.system.queue: must be a string"),
        (Box::new(|v| v["attributes"]["system"]["bank"] = json!([])), "attributes.system.bank: must be a string"),
        (
            Box::new(|v| v["attributes"]["system"]["project"] = json!(null)),
            "attributes.system.project: must be a string",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["preemptible-after"] = json!(-1)),
            "attributes.system.preemptible-after: must be a number of seconds >= 0",
        ),
        (
            Box::new(|v| v["attributes"]["system"]["job"] = json!({"name": 3})),
            "attributes.system.job.name: must be a string",
        ),
        (Box::new(|v| v["attributes"]["system"]["job"] = json!("x")), "attributes.system.job: must be a mapping"),
        (Box::new(|v| v["attributes"]["system"]["files"] = json!([])), "attributes.system.files: must be a mapping"),
    ];
    for (edit, want) in cases {
        let got = error_after(edit);
        assert!(got.starts_with(want), "want {want:?}\n got {got:?}");
    }
}

#[test]
fn syntax_and_root_errors() {
    assert!(matches!(Jobspec::parse("{"), Err(JobspecError::Syntax(_))));
    assert!(matches!(Jobspec::parse("a: [1"), Err(JobspecError::Syntax(_))));
    assert_eq!(Jobspec::parse("").map_err(|e| e.to_string()), Err("(root): jobspec must be a mapping".to_string()));
    assert_eq!(
        Jobspec::parse("- 1\n- 2").map_err(|e| e.to_string()),
        Err("(root): jobspec must be a mapping".to_string())
    );
    assert!(Jobspec::parse("  {\"version\": 1, \"resources\": [], \"tasks\": []}").is_ok());
}

/// The field a parse+validate error names (`Invalid.path`), after `edit` to NODE_GPU_YAML.
fn path_after(edit: impl Fn(&mut Value)) -> Result<String, JobspecError> {
    let mut v = serde_json::to_value(parse_ok(NODE_GPU_YAML)).expect("to_value");
    edit(&mut v);
    match Jobspec::parse(&v.to_string()).and_then(|js| js.validate()) {
        Err(JobspecError::Invalid { path, message }) => {
            assert!(!message.is_empty());
            Ok(path)
        }
        Err(e) => Err(e),
        Ok(r) => panic!("accepted: {r:?}"),
    }
}

/// Counts whose totals overflow 32 bits, or tasks far beyond the cores asked for, are refused naming the count
/// that makes them so (never wrapped, saturated or handed on to be allocated per task).
#[test]
fn huge_counts_and_overflowing_products_are_refused_naming_the_field() {
    let slot = "/resources/0/with/0";
    let max = u64::from(u32::MAX);
    let set = |ptr: String, n: Value| move |v: &mut Value| *v.pointer_mut(&ptr).expect("field") = n.clone();
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        // A single count past 32 bits.
        (Box::new(set("/tasks/0/count/total".into(), json!(max + 1))), "tasks[0].count.total"),
        (Box::new(set(format!("{slot}/count"), json!(max + 1))), "resources[0].with[0].count"),
        // nodes x slots: 65536 x 65536 = 2^32.
        (
            Box::new(|v: &mut Value| {
                v["resources"][0]["count"] = json!(65536);
                v.pointer_mut(slot).expect("slot")["count"] = json!(65536);
            }),
            "resources[0].with[0].count",
        ),
        // slots x cores (the core count is with[0]) and slots x GPUs (with[1]): 2^31 slots of 2 or 4.
        (
            Box::new(|v: &mut Value| {
                v["resources"][0]["count"] = json!(1);
                v.pointer_mut(slot).expect("slot")["count"] = json!(1u64 << 31);
            }),
            "resources[0].with[0].with[0].count",
        ),
        (
            Box::new(|v: &mut Value| {
                v["resources"][0]["count"] = json!(1);
                v.pointer_mut(slot).expect("slot")["count"] = json!(1u64 << 31);
                v.pointer_mut(slot).expect("slot")["with"][0]["count"] = json!(1);
                v.pointer_mut(slot).expect("slot")["with"][1]["count"] = json!(4);
            }),
            "resources[0].with[0].with[1].count",
        ),
        // 2^32 - 1 tasks: fits in 32 bits, but not on the 24 cores asked for.
        (Box::new(set("/tasks/0/count/total".into(), json!(max))), "tasks[0].count.total"),
    ];
    for (edit, want) in cases {
        assert_eq!(path_after(edit), Ok(want.to_string()), "{want}");
    }
    // Oversubscription up to the bound is a request like any other.
    let req = {
        let mut v = serde_json::to_value(parse_ok(NODE_GPU_YAML)).expect("to_value");
        let ncores = 2 * 3 * 4;
        v["tasks"][0]["count"]["total"] = json!(ncores * MAX_TASKS_PER_CORE);
        Jobspec::from_value(&v).and_then(|js| js.validate()).expect("at the bound")
    };
    assert_eq!(req.ntasks, 24 * MAX_TASKS_PER_CORE);
}

/// Arbitrary JSON, a few levels deep, with the numbers that break counts (0, negatives, floats, 2^32, u64::MAX).
fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(0u64), Just(1), Just(1 << 32), Just(u64::MAX), any::<u64>()].prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![Just("slot".to_string()), Just("node".to_string()), Just("core".to_string()), "\\PC{0,8}"]
            .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("type".to_string()),
            Just("count".to_string()),
            Just("with".to_string()),
            Just("label".to_string()),
            Just("min".to_string()),
            "[a-z]{1,6}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(key, inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON pointers to every value inside `v` (the root included).
fn json_paths(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, x)| json_paths(x, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| json_paths(x, format!("{at}/{i}"), out)),
        _ => {}
    }
    out.push(at);
}

proptest! {
    #[test]
    fn parse_never_panics(s in "\\PC*") {
        if let Ok(js) = Jobspec::parse(&s) {
            let _ = js.validate();
        }
    }

    #[test]
    fn parse_never_panics_yamlish(s in "[a-z0-9:{}\\[\\]\\-,'\" \\n&*!|>#.]{0,64}") {
        if let Ok(js) = Jobspec::parse(&s) {
            let _ = js.validate();
        }
    }

    #[test]
    fn parse_never_panics_on_mutated_example(i in 0usize..NODE_GPU_YAML.len(), c in "[a-z0-9:{}\\[\\]\\- \\n]{1,3}") {
        let mut s = NODE_GPU_YAML.to_string();
        if s.is_char_boundary(i) {
            s.insert_str(i, &c);
        }
        if let Ok(js) = Jobspec::parse(&s) {
            let _ = js.validate();
        }
    }

    /// Any JSON value a client sends as `jobspec` is refused or accepted, never a panic.
    #[test]
    fn from_value_never_panics(v in arbitrary_json()) {
        if let Ok(js) = Jobspec::from_value(&v) {
            let _ = js.validate();
        }
    }

    /// A valid jobspec with one of its fields (any depth) replaced by an arbitrary value.
    #[test]
    fn from_value_never_panics_on_a_mutated_example(pick in any::<proptest::sample::Index>(), v in arbitrary_json()) {
        let mut doc: Value = serde_yaml::from_str(NODE_GPU_YAML).expect("example parses");
        let mut paths = Vec::new();
        json_paths(&doc, String::new(), &mut paths);
        let path = pick.get(&paths).clone();
        if let Some(slot) = doc.pointer_mut(&path) {
            *slot = v;
        }
        if let Ok(js) = Jobspec::from_value(&doc) {
            let _ = js.validate();
        }
    }

    #[test]
    fn builder_output_validates_and_round_trips(
        nnodes in proptest::option::of(1u32..8),
        extra in proptest::option::of(0u32..20),
        cores in 1u32..5,
        gpus in 0u32..3,
        // Millisecond-resolution durations: serde_json's default float
        // parser is only exact up to ~16 significant digits.
        dur in proptest::option::of((0u64..1_000_000_000).prop_map(|ms| ms as f64 / 1000.0)),
        args in proptest::collection::vec("\\PC{0,8}", 1..4),
        envs in proptest::collection::btree_map("[A-Z_]{1,6}", "\\PC{0,8}", 0..3),
    ) {
        let mut b = JobspecBuilder::new(args.clone()).cores_per_task(cores).gpus_per_task(gpus);
        if let Some(n) = nnodes { b = b.nnodes(n); }
        // ntasks >= nnodes when both given
        let ntasks = extra.map(|e| nnodes.unwrap_or(1) + e);
        if let Some(n) = ntasks { b = b.ntasks(n); }
        if let Some(d) = dur { b = b.duration(d); }
        b.environment = envs.clone();
        let js = match b.build() {
            Ok(js) => js,
            Err(e) => return Err(TestCaseError::fail(format!("build failed: {e}"))),
        };
        let req = js.validate();
        prop_assert!(req.is_ok(), "{:?}", req);
        if let Ok(req) = req {
            prop_assert_eq!(req.ntasks, ntasks.or(nnodes).unwrap_or(1));
            prop_assert!(req.nslots >= req.ntasks);
            prop_assert_eq!(req.cores_per_slot, cores);
            prop_assert_eq!(req.gpus_per_slot, gpus);
            prop_assert_eq!(&req.command, &args);
            prop_assert_eq!(&req.environment, &envs);
            prop_assert!(req.warnings.is_empty());
        }
        prop_assert_eq!(Jobspec::parse(&js.to_json()), Ok(js.clone()));
        prop_assert_eq!(js.to_yaml().and_then(|y| Jobspec::parse(&y)), Ok(js.clone()));
    }
}
