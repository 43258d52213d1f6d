//! Prints the running kernel's feature set in the text form the detectors' choice rule reads (the recordings of
//! `tests/kernels/`), then the choice for each detector. Run as root: the map and program probes need it.
//!
//!     cargo run --example kernel_features > tests/kernels/NAME.txt
fn main() {
    let f = vigil_ebpf::KernelFeatures::probe();
    print!("{}", f.to_text());
    let p = vigil_ebpf::plan(&f);
    eprintln!("process-exit {}\ntcp {}\nresponder {}", p.process_exit, p.tcp, p.responder);
}
