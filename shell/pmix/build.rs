//! Detects OpenPMIx and generates its binding, or selects the stub.
//!
//! With OpenPMIx found by pkg-config (at least [`MIN_VERSION`]) and libclang loadable by bindgen, this generates
//! the binding of the server API from the installed headers, links `libpmix` dynamically (with its directory as the
//! run path: Debian keeps it in a private `pmix2/lib`) and sets `cfg(vigil_pmix)`. Otherwise the binary is built as
//! a stub that says why PMIx is not available (the reason is passed as `VIGIL_PMIX_UNAVAILABLE`), and the job shell
//! then serves PMI-1 and PMI-2 only. `VIGIL_PMIX=off` in the build environment selects the stub on purpose.

use std::env;
use std::path::PathBuf;

/// Oldest OpenPMIx the helper is written against (Debian 12 ships 4.2.2; `PMIx_Info_list_*` came with 4.0).
const MIN_VERSION: &str = "4.0";

fn main() {
    println!("cargo:rustc-check-cfg=cfg(vigil_pmix)");
    println!("cargo:rerun-if-env-changed=VIGIL_PMIX");
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    match build() {
        Ok(version) => {
            println!("cargo:rustc-cfg=vigil_pmix");
            println!("cargo:rustc-env=VIGIL_PMIX_BUILT_AGAINST={version}");
        }
        Err(reason) => {
            println!("cargo:warning=vigil-pmix: building the stub: {reason}");
            println!("cargo:rustc-env=VIGIL_PMIX_UNAVAILABLE={reason}");
        }
    }
}

/// Generate the binding and emit the link flags; the reason for the stub otherwise.
fn build() -> Result<String, String> {
    if env::var("VIGIL_PMIX").is_ok_and(|v| v == "off") {
        return Err("disabled at build time (VIGIL_PMIX=off)".into());
    }
    let lib =
        pkg_config::Config::new().atleast_version(MIN_VERSION).cargo_metadata(false).probe("pmix").map_err(|e| {
            for line in e.to_string().lines().filter(|l| !l.trim().is_empty()) {
                println!("cargo:warning=vigil-pmix: pkg-config: {line}");
            }
            format!("pkg-config found no OpenPMIx >= {MIN_VERSION} at build time (install libpmix-dev)")
        })?;
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang_args: Vec<String> = lib.include_paths.iter().map(|p| format!("-I{}", p.display())).collect();
    // bindgen panics when it cannot load libclang: that is a reason for the stub, not a build failure.
    let generated = std::panic::catch_unwind(|| {
        bindgen::Builder::default()
            .header("csrc/wrapper.h")
            .clang_args(&clang_args)
            .allowlist_function("PMIx_server_.*|PMIx_Info_list_.*|PMIx_Error_string|PMIx_Get_version|PMIx_generate_.*|PMIx_Data_array_destruct|PMIx_Notify_event")
            .allowlist_type("pmix_.*")
            .allowlist_var("PMIX_.*")
            .derive_default(true)
            .size_t_is_usize(true)
            .layout_tests(false)
            .generate()
    })
    .map_err(|_| "bindgen could not run (is libclang installed? install libclang-dev)".to_string())?
    .map_err(|()| "bindgen could not parse the OpenPMIx headers".to_string())?;
    generated.write_to_file(out.join("bindings.rs")).map_err(|e| format!("writing the bindings: {e}"))?;
    for dir in &lib.link_paths {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{}", dir.display());
    }
    for l in &lib.libs {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    Ok(lib.version)
}
