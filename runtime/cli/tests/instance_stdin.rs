//! `vigil run` forwards its standard input, byte for byte, to every task; jobs submitted without `run` read EOF.

use std::io::Write;
use std::process::{Command, Stdio};

fn in_instance(script: &str, input: &[u8]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["start", "--test-size=2", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vigil start");
    let mut si = child.stdin.take().expect("stdin");
    si.write_all(input).expect("write input");
    drop(si);
    child.wait_with_output().expect("wait")
}

#[test]
fn stdin_reaches_every_task_byte_for_byte() {
    let input: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = format!("vigil run -N2 -n2 sh -c 'cat > {}/in.$VIGIL_TASK_RANK'", dir.path().display());
    let out = in_instance(&script, &input);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for r in 0..2 {
        let got = std::fs::read(dir.path().join(format!("in.{r}"))).expect("task wrote its input");
        assert_eq!(got, input, "task {r} received the input byte for byte");
    }
}

#[test]
fn submitted_jobs_read_end_of_file() {
    // `cat` with no input must end at once, not wait for input nobody will send.
    let out = in_instance("id=$(vigil submit cat) && vigil job wait $id && echo waited", b"ignored");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("waited"));
}

#[test]
fn run_ends_with_its_job_while_its_input_stays_open() {
    // A terminal, or a pipe nobody closes: `vigil run` reads it for the tasks, and must still end as soon as
    // its job does, not at the user's next key.
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["start", "--test-size=1", "sh", "-c", "vigil run -N1 true; echo run-exited-$?"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("vigil start");
    let input = child.stdin.take().expect("stdin"); // kept open, never written
    let mut out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        let _ = tx.send(s);
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(60));
    drop(input);
    let _ = child.kill();
    let _ = child.wait();
    let got = got.expect("the instance ended within 60 s while its standard input stayed open");
    assert!(got.contains("run-exited-0"), "{got}");
}
