//! Events are sequenced by rank 0 and reach every broker: a subscriber on each rank of a 7-broker kary:2
//! instance sees every published event once, in the same order, with increasing sequence numbers.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn events_reach_every_broker_in_order() {
    let vigil = env!("CARGO_BIN_EXE_vigil");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().to_path_buf();
    // Inside the instance: one `vigil event sub` per rank (through that rank's own socket), then publish from
    // rank 6 (a leaf: the event goes up to rank 0 to be sequenced, then down to everyone).
    let script = format!(
        r#"set -e
rundir=$(dirname "${{VIGIL_URI#local://}}")
for r in 0 1 2 3 4 5 6; do
    VIGIL_URI=local://$rundir/local-$r vigil event sub -c 3 test.seq > {out}/sub-$r.txt &
done
for r in 0 1 2 3 4 5 6; do
    for i in $(seq 1 100); do grep -q subscribed {out}/sub-$r.txt 2>/dev/null && break; sleep 0.02; done
done
for i in 1 2 3; do VIGIL_URI=local://$rundir/local-6 vigil event pub test.seq "{{\"i\": $i}}"; done
wait
"#,
        out = out.display()
    );
    let mut child = Command::new(vigil)
        .args(["start", "--test-size=7", "-S", "tbon.topo=kary:2", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("vigil start");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("instance did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let mut orders = Vec::new();
    for r in 0..7 {
        let text = std::fs::read_to_string(out.join(format!("sub-{r}.txt"))).expect("subscriber output");
        let events: Vec<serde_json::Value> =
            text.lines().filter(|l| l.contains("\"topic\"")).map(|l| serde_json::from_str(l).expect("json")).collect();
        assert_eq!(events.len(), 3, "rank {r}: {text}");
        let is: Vec<i64> = events.iter().map(|e| e["payload"]["i"].as_i64().unwrap_or(-1)).collect();
        assert_eq!(is, vec![1, 2, 3], "rank {r} sees the events in publication order");
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap_or(0)).collect();
        assert!(seqs.windows(2).all(|w| w[1] > w[0]), "rank {r}: sequence numbers increase: {seqs:?}");
        orders.push(seqs);
    }
    assert!(orders.windows(2).all(|w| w[0] == w[1]), "every broker sees the same sequence numbers: {orders:?}");
}
