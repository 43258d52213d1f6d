//! Prints which exit-detector backend `Detector::new()` picks here and why,
//! then watches `sh -c 'exit 3'` / `sleep 30` (killed) and prints the events.
use std::{process::Command, time::Duration};

use vigil_ebpf::Detector;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut det = Detector::new().expect("detector");
    println!("backend: {}", det.description());
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    det.watch(sleeper.id()).unwrap();
    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(sleeper.id() as i32, libc::SIGKILL) };
    let ev = tokio::time::timeout(Duration::from_secs(5), det.next_event()).await;
    println!("event: {ev:?}");
    sleeper.wait().unwrap();
}
