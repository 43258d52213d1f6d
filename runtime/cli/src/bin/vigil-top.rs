//! `vigil-top`: the full-screen live view `vigil top` runs (a program of its own, so that the terminal crates stay
//! out of the `vigil` binary every broker runs; see `vigil::cli::top`).

fn main() {
    std::process::exit(vigil::cli::top::main());
}
