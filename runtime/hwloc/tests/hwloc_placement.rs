//! Placement and loading tests on synthetic / XML topologies.

use hwlocality::object::types::ObjectType;
use hwlocality::topology::export::xml::XMLExportFlags;
use std::collections::BTreeSet;
use vigil_hwloc::*;

const ELCAP: &str = "pack:4 numa:1 core:24 pu:2";
const SMALL: &str = "pack:2 numa:2 core:4 pu:1";

fn synth(desc: &str) -> NodeTopology {
    NodeTopology::load(&TopologySource::Synthetic(desc.to_string())).expect("synthetic loads")
}

fn req(cores: Vec<u32>, ntasks: u32, cpt: u32) -> PlacementRequest {
    PlacementRequest {
        cores,
        gpus: vec![],
        ntasks,
        cores_per_task: cpt,
        gpus_per_task: 0,
        cpu_affinity: CpuAffinity::PerTask,
        gpu_affinity: GpuAffinity::PerTask,
    }
}

/// Package logical index of a logical core.
fn package_of(t: &NodeTopology, core: u32) -> usize {
    t.topology()
        .objects_with_type(ObjectType::Core)
        .nth(core as usize)
        .unwrap()
        .first_ancestor_with_type(ObjectType::Package)
        .unwrap()
        .logical_index()
}

#[test]
fn elcap_resources() {
    let t = synth(ELCAP);
    assert!(!t.is_live());
    let r = t.resources(None);
    assert_eq!(r.cores, 96);
    assert_eq!(r.pus, 192);
    assert_eq!(r.numa, 4);
    assert_eq!(r.packages, 4);
    assert_eq!(r.gpus, 0);
    assert!(r.gpu_names.is_empty());
    assert_eq!(r.source, format!("synthetic:{ELCAP}"));
    let r4 = t.resources(Some(4));
    assert_eq!(r4.gpus, 4);
    assert_eq!(r4.cores, 96);
    // serde round trip
    let js = serde_json::to_string(&r4).unwrap();
    assert_eq!(serde_json::from_str::<NodeResources>(&js).unwrap(), r4);
}

#[test]
fn per_task_exact_fit_8x12() {
    let t = synth(ELCAP);
    let p = t.place(&req((0..96).collect(), 8, 12)).unwrap();
    assert_eq!(p.len(), 8);
    let mut seen = BTreeSet::new();
    for (i, tp) in p.iter().enumerate() {
        let i = i as u32;
        let want: Vec<u32> = (12 * i..12 * i + 12).collect();
        assert_eq!(tp.cores, want, "task {i} cores");
        // synthetic: core k has PUs 2k, 2k+1
        let want_cpus: Vec<u32> = (24 * i..24 * i + 24).collect();
        assert_eq!(tp.cpus.as_ref().unwrap(), &want_cpus, "task {i} cpus");
        assert_eq!(tp.numa, vec![i / 2], "task {i} numa");
        for c in &tp.cores {
            assert!(seen.insert(*c), "core {c} shared");
        }
        assert_eq!(tp.gpus, Some(vec![]));
    }
    assert_eq!(seen.len(), 96);
    let js = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Vec<TaskPlacement>>(&js).unwrap(), p);
}

#[test]
fn per_task_spread_4x1_one_per_package() {
    let t = synth(ELCAP);
    let p = t.place(&req((0..96).collect(), 4, 1)).unwrap();
    assert_eq!(p.len(), 4);
    let mut pkgs = BTreeSet::new();
    for (i, tp) in p.iter().enumerate() {
        // whole share: one full package (24 cores, 48 PUs), like hwloc-distrib
        assert_eq!(tp.cores.len(), 24, "task {i}");
        let tp_pkgs: BTreeSet<usize> = tp.cores.iter().map(|&c| package_of(&t, c)).collect();
        assert_eq!(tp_pkgs.len(), 1, "task {i} spans packages");
        assert_eq!(*tp_pkgs.iter().next().unwrap(), i);
        pkgs.insert(i);
        assert_eq!(tp.numa, vec![i as u32]);
        assert_eq!(tp.cpus.as_ref().unwrap().len(), 48);
    }
    assert_eq!(pkgs.len(), 4);
}

#[test]
fn per_task_uneven_spread_is_linear_over_cores() {
    // 3 tasks over 96 cores: linear over Core roots -> 32 each (hwloc-distrib
    // from the machine root would give 24/24/48).
    let t = synth(ELCAP);
    let p = t.place(&req((0..96).collect(), 3, 1)).unwrap();
    let lens: Vec<usize> = p.iter().map(|x| x.cores.len()).collect();
    assert_eq!(lens, vec![32, 32, 32]);
    assert_eq!(p[1].cores[0], 32);
    assert_eq!(p[1].numa, vec![1, 2]);
}

#[test]
fn per_task_non_contiguous_allocation() {
    let t = synth(ELCAP);
    let p = t.place(&req(vec![31, 5, 1, 30], 2, 2)).unwrap();
    assert_eq!(p[0].cores, vec![1, 5]);
    assert_eq!(p[0].cpus, Some(vec![2, 3, 10, 11]));
    assert_eq!(p[1].cores, vec![30, 31]);
    assert_eq!(p[1].numa, vec![1]);
}

#[test]
fn affinity_on_gives_union() {
    let t = synth(SMALL);
    let mut r = req(vec![2, 3, 4, 9], 3, 1);
    r.cpu_affinity = CpuAffinity::On;
    let p = t.place(&r).unwrap();
    assert_eq!(p.len(), 3);
    for tp in &p {
        assert_eq!(tp.cpus, Some(vec![2, 3, 4, 9]));
        assert_eq!(tp.cores, vec![2, 3, 4, 9]);
        assert_eq!(tp.numa, vec![0, 1, 2]);
    }
}

#[test]
fn affinity_off_gives_none() {
    let t = synth(SMALL);
    let mut r = req(vec![4, 5], 2, 1);
    r.cpu_affinity = CpuAffinity::Off;
    r.gpu_affinity = GpuAffinity::Off;
    r.gpus = vec![0, 1];
    let p = t.place(&r).unwrap();
    assert_eq!(p.len(), 2);
    for tp in &p {
        assert_eq!(tp.cpus, None);
        assert_eq!(tp.gpus, None);
        assert_eq!(tp.cores, vec![4, 5]);
        assert_eq!(tp.numa, vec![1]);
    }
    // Off with no cores allocated is fine
    r.cores.clear();
    let p = t.place(&r).unwrap();
    assert_eq!(p[0].cores, Vec::<u32>::new());
    assert_eq!(p[0].numa, Vec::<u32>::new());
}

#[test]
fn gpu_per_task_split() {
    let t = synth(SMALL);
    let mut r = req((0..16).collect(), 4, 4);
    r.gpus = vec![0, 1, 2, 3];
    r.gpus_per_task = 1;
    let g: Vec<_> = t.place(&r).unwrap().into_iter().map(|x| x.gpus).collect();
    assert_eq!(g, vec![Some(vec![0]), Some(vec![1]), Some(vec![2]), Some(vec![3])]);

    r.gpus_per_task = 2;
    let g: Vec<_> = t.place(&r).unwrap().into_iter().map(|x| x.gpus).collect();
    assert_eq!(g, vec![Some(vec![0, 1]), Some(vec![2, 3]), Some(vec![]), Some(vec![])]);

    // g == 0: even split, first tasks get the remainder
    r.gpus_per_task = 0;
    r.gpus = vec![6, 7];
    let g: Vec<_> = t.place(&r).unwrap().into_iter().map(|x| x.gpus).collect();
    assert_eq!(g, vec![Some(vec![6]), Some(vec![7]), Some(vec![]), Some(vec![])]);
    r.gpus = (0..10).collect();
    let g: Vec<_> = t.place(&r).unwrap().into_iter().map(|x| x.gpus.unwrap()).collect();
    assert_eq!(g, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7], vec![8, 9]]);

    r.gpu_affinity = GpuAffinity::On;
    r.gpus = vec![1, 3];
    for tp in t.place(&r).unwrap() {
        assert_eq!(tp.gpus, Some(vec![1, 3]));
    }
}

#[test]
fn oversubscription_round_robin() {
    let t = synth(SMALL);
    let p = t.place(&req(vec![0, 1], 4, 1)).unwrap();
    let cores: Vec<_> = p.iter().map(|x| x.cores.clone()).collect();
    assert_eq!(cores, vec![vec![0], vec![1], vec![0], vec![1]]);
    let p = t.place(&req(vec![0, 1, 2, 3], 3, 2)).unwrap();
    let cores: Vec<_> = p.iter().map(|x| x.cores.clone()).collect();
    assert_eq!(cores, vec![vec![0, 1], vec![2, 3], vec![0, 1]]);
    // more cores per task than allocated: everyone gets everything
    let p = t.place(&req(vec![8, 9], 2, 5)).unwrap();
    assert!(p.iter().all(|x| x.cores == vec![8, 9] && x.cpus == Some(vec![8, 9])));
    // cores_per_task == 0 is treated as 1
    let p = t.place(&req(vec![0, 1, 2, 3], 2, 0)).unwrap();
    assert_eq!(p[0].cores, vec![0, 1]);
    assert_eq!(p[1].cores, vec![2, 3]);
}

#[test]
fn bad_requests_are_errors() {
    let t = synth(ELCAP);
    let e = t.place(&req(vec![0, 200], 1, 1)).unwrap_err();
    assert_eq!(e, TopoError::UnknownCore { index: 200, available: 96 });
    assert!(e.to_string().contains("200"), "{e}");
    // checked even with affinity off
    let mut r = req(vec![96], 1, 1);
    r.cpu_affinity = CpuAffinity::Off;
    assert!(matches!(t.place(&r), Err(TopoError::UnknownCore { index: 96, .. })));
    assert_eq!(t.place(&req(vec![3, 1, 3], 1, 1)).unwrap_err(), TopoError::DuplicateCore(3));
    assert_eq!(t.place(&req(vec![], 2, 1)).unwrap_err(), TopoError::NoCores { ntasks: 2 });
    assert!(matches!(t.place(&req(vec![0], u32::MAX, 1)), Err(TopoError::TooManyTasks { .. })));
    assert_eq!(t.place(&req(vec![], 0, 1)).unwrap(), vec![]);
}

#[test]
fn bad_sources_are_errors() {
    for d in ["", "pack:0", "bogus:3", "core:2\0pu:2", "pack:-1 pu:2"] {
        let e = NodeTopology::load(&TopologySource::Synthetic(d.into())).unwrap_err();
        assert!(matches!(e, TopoError::Load { .. }), "{d:?}: {e}");
    }
    let e = NodeTopology::load(&TopologySource::XmlFile("/nonexistent/x.xml".into())).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/x.xml"), "{e}");
    let dir = std::env::temp_dir().join(format!("nodetopo-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("garbage.xml");
    std::fs::write(&f, "<topology><object type=").unwrap();
    assert!(NodeTopology::load(&TopologySource::XmlFile(f.clone())).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

fn tmpfile(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nodetopo-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn xml_roundtrip() {
    let s = synth(ELCAP);
    let path = tmpfile("elcap.xml");
    s.topology().export_xml_file(Some(&path), XMLExportFlags::empty()).unwrap();
    let x = NodeTopology::load(&TopologySource::XmlFile(path.clone())).unwrap();
    assert!(!x.is_live());
    let (rs, rx) = (s.resources(None), x.resources(None));
    assert_eq!(rx.source, format!("xml:{}", path.display()));
    assert_eq!((rx.cores, rx.pus, rx.numa, rx.packages), (rs.cores, rs.pus, rs.numa, rs.packages));
    let r = req((0..96).collect(), 8, 12);
    assert_eq!(x.place(&r).unwrap(), s.place(&r).unwrap());
    std::fs::remove_file(&path).ok();
}

/// Inject PCI GPUs seen by several backends into an exported XML and check
/// they are counted once per board.
#[test]
fn xml_gpu_discovery() {
    let s = synth(SMALL);
    let xml = s.topology().export_xml(XMLExportFlags::empty()).unwrap().as_str().to_string();
    let mut io =
        String::from(r#"<object type="Bridge" gp_index="9000" bridge_type="0-1" depth="0" bridge_pci="0000:[00-02]">"#);
    for i in 0..2u32 {
        let g = 9100 + i * 10;
        io.push_str(&format!(
            r#"<object type="PCIDev" gp_index="{g}" pci_busid="0000:0{b}:00.0" pci_type="0302 [10de:20b0] [10de:134f] a1" pci_link_speed="0.000000">
<object type="OSDev" gp_index="{g1}" name="cuda{i}" subtype="CUDA" osdev_type="5"/>
<object type="OSDev" gp_index="{g2}" name="nvml{i}" subtype="NVML" osdev_type="1"/>
<object type="OSDev" gp_index="{g3}" name="card{i}" osdev_type="1"/>
</object>"#,
            b = i + 1,
            g1 = g + 1,
            g2 = g + 2,
            g3 = g + 3
        ));
    }
    io.push_str("</object>\n");
    let at = xml.rfind("</object>").unwrap();
    let patched = format!("{}{}{}", &xml[..at], io, &xml[at..]);
    let path = tmpfile("gpus.xml");
    std::fs::write(&path, patched).unwrap();
    let x = NodeTopology::load(&TopologySource::XmlFile(path.clone())).unwrap();
    let r = x.resources(None);
    assert_eq!(r.gpus, 2, "{r:?}");
    assert_eq!(r.gpu_names, vec!["cuda0".to_string(), "cuda1".to_string()]);
    assert_eq!(r.cores, 16);
    assert_eq!(x.resources(Some(8)).gpus, 8);
    std::fs::remove_file(&path).ok();
}

/// Parse an hwloc bitmap string ("0xffffffff,,0x0") into set bit indices.
fn parse_hwloc_bitmap(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for (w, word) in s.trim().split(',').rev().enumerate() {
        let word = word.trim_start_matches("0x");
        let v = if word.is_empty() { 0 } else { u32::from_str_radix(word, 16).unwrap() };
        for b in 0..32 {
            if v & (1 << b) != 0 {
                out.push(w as u32 * 32 + b);
            }
        }
    }
    out
}

/// Compare with the C `hwloc-distrib --to core` when it is installed.
#[test]
fn matches_hwloc_distrib_if_installed() {
    let t = synth(ELCAP);
    for n in [1u32, 2, 4, 8, 12, 16, 24, 48, 96] {
        let out = match std::process::Command::new("hwloc-distrib")
            .args(["--input", ELCAP, "--to", "core", &n.to_string()])
            .output()
        {
            Ok(o) if o.status.success() => o,
            _ => {
                eprintln!("hwloc-distrib not available; skipping comparison");
                return;
            }
        };
        let theirs: Vec<Vec<u32>> = String::from_utf8_lossy(&out.stdout).lines().map(parse_hwloc_bitmap).collect();
        let ours: Vec<Vec<u32>> =
            t.place(&req((0..96).collect(), n, 1)).unwrap().into_iter().map(|p| p.cpus.unwrap()).collect();
        assert_eq!(ours, theirs, "ntasks={n}");
    }
}

#[test]
fn xml_directory_is_load_error() {
    let e = NodeTopology::load(&TopologySource::XmlFile(std::env::temp_dir())).unwrap_err();
    assert!(matches!(e, TopoError::Load { .. }), "{e}");
}

/// Cores with unequal PU counts: hwloc's PU-weighted distribution would give
/// 1 + 3 cores; the exact-fit guarantee makes placement fall back to a
/// count-based split.
#[test]
fn unequal_smt_exact_fit_falls_back_to_count_split() {
    use hwlocality::cpu::cpuset::CpuSet;
    use hwlocality::topology::editor::RestrictFlags;
    let s = synth("core:4 pu:2");
    let mut topo = s.topology().clone();
    let mut keep = CpuSet::new();
    for pu in [0usize, 1, 2, 3, 4, 6] {
        keep.set(pu);
    }
    topo.edit(|ed| ed.restrict(&keep, RestrictFlags::empty()).unwrap());
    let path = tmpfile("unequal.xml");
    topo.export_xml_file(Some(&path), XMLExportFlags::empty()).unwrap();
    let x = NodeTopology::load(&TopologySource::XmlFile(path.clone())).unwrap();
    assert_eq!((x.resources(None).cores, x.resources(None).pus), (4, 6));
    let p = x.place(&req(vec![0, 1, 2, 3], 2, 2)).unwrap();
    assert_eq!(p[0].cores, vec![0, 1]);
    assert_eq!(p[0].cpus, Some(vec![0, 1, 2, 3]));
    assert_eq!(p[1].cores, vec![2, 3]);
    assert_eq!(p[1].cpus, Some(vec![4, 6]));
    std::fs::remove_file(&path).ok();
}

#[test]
fn node_topology_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<NodeTopology>();
}
