//! Compiles `src/driver/nvtx_mem.c` against NVIDIA's header-only NVTX v3 (vendored in
//! `third_party/nvtx3`): the NVTX memory API through which compute-sanitizer sees pooled blocks
//! (`src/nvtx.rs`). Its symbols stay inside the library: a Rust cdylib exports only its own.

fn main() {
    println!("cargo:rerun-if-changed=src/driver/nvtx_mem.c");
    println!("cargo:rerun-if-changed=third_party/nvtx3");
    cc::Build::new()
        .file("src/driver/nvtx_mem.c")
        .include("third_party")
        .flag_if_supported("-fvisibility=hidden")
        .warnings(true)
        .compile("cudapool_nvtx");
}
