//! The `vigil` command: CLI and broker. See [`vigil::cli`].

fn main() {
    std::process::exit(vigil::cli::main());
}
