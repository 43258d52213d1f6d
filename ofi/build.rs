//! Detects libfabric and builds the binding, or selects the stub.
//!
//! With libfabric found by pkg-config (at least [`MIN_VERSION`]) and libclang loadable by bindgen, this generates
//! the bindings from the installed headers, compiles the C shim (`csrc/shim.c`) for the static inline calls and
//! sets `cfg(vigil_ofi)`. Otherwise the crate builds its stub, whose `open` reports why libfabric is not
//! available (the reason is passed as `VIGIL_OFI_UNAVAILABLE`). `VIGIL_OFI=off` in the build environment selects
//! the stub on purpose (to test the fallback on a machine that has libfabric).

use std::env;
use std::path::PathBuf;

/// Oldest libfabric the layer is written against (Debian 12 ships 1.17; the calls used exist since 1.5).
const MIN_VERSION: &str = "1.10";

fn main() {
    println!("cargo:rustc-check-cfg=cfg(vigil_ofi)");
    println!("cargo:rerun-if-env-changed=VIGIL_OFI");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=csrc/shim.h");
    match build() {
        Ok(version) => {
            println!("cargo:rustc-cfg=vigil_ofi");
            println!("cargo:rustc-env=VIGIL_OFI_BUILT_AGAINST={version}");
        }
        Err(reason) => {
            println!("cargo:warning=vigil-ofi: building without libfabric: {reason}");
            println!("cargo:rustc-env=VIGIL_OFI_UNAVAILABLE={reason}");
        }
    }
}

/// Build the real binding; the reason for the stub otherwise.
fn build() -> Result<String, String> {
    if env::var("VIGIL_OFI").is_ok_and(|v| v == "off") {
        return Err("disabled at build time (VIGIL_OFI=off)".into());
    }
    // Headers only: the library is loaded at run time (csrc/shim.c, vigil_fi_load), not linked.
    let lib = pkg_config::Config::new().atleast_version(MIN_VERSION).cargo_metadata(false).probe("libfabric").map_err(
        |e| {
            // The details (pkg-config's own output) are for the build log; the reason stays one sentence.
            for line in e.to_string().lines().filter(|l| !l.trim().is_empty()) {
                println!("cargo:warning=vigil-ofi: pkg-config: {line}");
            }
            format!("pkg-config found no libfabric >= {MIN_VERSION} at build time (install libfabric-dev)")
        },
    )?;
    let includes: Vec<PathBuf> = lib.include_paths.clone();

    // bindgen panics when it cannot load libclang: that is a reason for the stub, not a build failure.
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang_args: Vec<String> = includes.iter().map(|p| format!("-I{}", p.display())).collect();
    let generated = std::panic::catch_unwind(|| {
        bindgen::Builder::default()
            .header("csrc/shim.h")
            .clang_args(&clang_args)
            .allowlist_function("fi_getinfo|fi_freeinfo|fi_fabric|fi_strerror|fi_version|vigil_fi_.*")
            .allowlist_type("fi_.*|fid.*")
            .allowlist_var("FI_.*")
            .derive_default(true)
            .size_t_is_usize(true)
            .layout_tests(false)
            .generate()
    })
    .map_err(|_| "bindgen could not run (is libclang installed? install libclang-dev)".to_string())?
    .map_err(|()| "bindgen could not parse the libfabric headers".to_string())?;
    generated.write_to_file(out.join("bindings.rs")).map_err(|e| format!("writing the bindings: {e}"))?;

    let mut cc = cc::Build::new();
    cc.file("csrc/shim.c").warnings(true);
    for p in &includes {
        cc.include(p);
    }
    // The shim's archive is bundled into this crate's rlib; it loads libfabric with dlopen (libc has it).
    cc.try_compile("vigil_ofi_shim").map_err(|e| format!("compiling the C shim: {e}"))?;
    Ok(lib.version)
}
