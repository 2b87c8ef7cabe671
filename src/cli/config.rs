//! `cudapool config --cflags --libs --includedir --libdir --pkgconfigdir --cmakedir`: what a C
//! or C++ build needs to use the C API (`include/cudapool.h`) and link `-lcudapool`, from a
//! source tree after its set-up or from a pip install, whichever this binary belongs to.
//!
//! The library is the one `cudapool run` would preload (`run::find_library`); the header is
//! beside it (`include/` in the wheel's package) or in the source tree's `include/`. A
//! pkg-config file and a CMake package (`find_package(cudapool)`, imported target
//! `cudapool::cudapool`) lie in the wheel's package (`pkgconfig/`, `cmake/`, written relative to
//! themselves by `setup.py`); for a source tree they are written beside the library the first
//! time they are asked for.

use clap::{ArgGroup, Args};
use std::path::{Path, PathBuf};

#[derive(Args)]
#[command(
    group(ArgGroup::new("what").required(true).multiple(true)),
    after_help = "Examples:\n  cc prog.c $(cudapool config --cflags --libs)\n  \
                  PKG_CONFIG_PATH=$(cudapool config --pkgconfigdir) pkg-config --cflags --libs cudapool\n  \
                  cmake -Dcudapool_DIR=$(cudapool config --cmakedir) ...   # find_package(cudapool); cudapool::cudapool"
)]
pub struct ConfigArgs {
    /// Compiler flags: -I the folder of cudapool.h
    #[arg(long, group = "what")]
    cflags: bool,
    /// Linker flags: -L, an rpath, and -lcudapool
    #[arg(long, group = "what")]
    libs: bool,
    /// The folder of cudapool.h
    #[arg(long, group = "what")]
    includedir: bool,
    /// The folder of libcudapool.so
    #[arg(long, group = "what")]
    libdir: bool,
    /// The folder of cudapool.pc (for PKG_CONFIG_PATH)
    #[arg(long, group = "what")]
    pkgconfigdir: bool,
    /// The folder of cudapool-config.cmake (for cudapool_DIR or CMAKE_PREFIX_PATH)
    #[arg(long, group = "what")]
    cmakedir: bool,
}

/// Where the header and the library are.
struct Layout {
    include: PathBuf,
    lib: PathBuf,
}

fn layout() -> Result<Layout, String> {
    let so = super::run::find_library()?;
    let lib = so
        .parent()
        .ok_or("the library has no folder")?
        .to_path_buf();
    // The wheel's package: include/ beside the library. A source tree: target/<profile>/ ->
    // the tree's include/.
    let candidates = [lib.join("include"), lib.join("../../include")];
    let include = candidates
        .iter()
        .find(|d| d.join("cudapool.h").is_file())
        .ok_or_else(|| {
            format!(
                "cudapool.h not found in {} (tried {})",
                lib.display(),
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let include = include
        .canonicalize()
        .map_err(|e| format!("{}: {e}", include.display()))?;
    Ok(Layout { include, lib })
}

/// `dir/name` holds `text` (written if absent: a source tree's build folder).
fn ensure(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let path = dir.join(name);
    if path.is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn pkgconfig_dir(l: &Layout) -> Result<PathBuf, String> {
    let dir = l.lib.join("pkgconfig");
    let text = format!(
        "# Written by `cudapool config` for this build of cudapool.\n\
         includedir={}\nlibdir={}\n\n\
         Name: cudapool\n\
         Description: The C API of cudapool, a caching pool and hard memory limit for CUDA programs\n\
         Version: {}\n\
         Cflags: -I${{includedir}}\n\
         Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lcudapool\n",
        l.include.display(),
        l.lib.display(),
        env!("CARGO_PKG_VERSION")
    );
    ensure(&dir, "cudapool.pc", &text)?;
    Ok(dir)
}

fn cmake_dir(l: &Layout) -> Result<PathBuf, String> {
    let dir = l.lib.join("cmake");
    let text = format!(
        "# Written by `cudapool config` for this build of cudapool: find_package(cudapool) gives\n\
         # the imported target cudapool::cudapool (the header's folder and the library).\n\
         if(NOT TARGET cudapool::cudapool)\n\
         \x20 add_library(cudapool::cudapool SHARED IMPORTED)\n\
         \x20 set_target_properties(cudapool::cudapool PROPERTIES\n\
         \x20   IMPORTED_LOCATION \"{lib}/libcudapool.so\"\n\
         \x20   IMPORTED_NO_SONAME TRUE\n\
         \x20   INTERFACE_INCLUDE_DIRECTORIES \"{inc}\")\n\
         endif()\n\
         set(cudapool_VERSION {ver})\n",
        lib = l.lib.display(),
        inc = l.include.display(),
        ver = env!("CARGO_PKG_VERSION")
    );
    ensure(&dir, "cudapool-config.cmake", &text)?;
    ensure(
        &dir,
        "cudapool-config-version.cmake",
        &format!(
            "set(PACKAGE_VERSION {ver})\n\
             if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)\n\
             \x20 set(PACKAGE_VERSION_COMPATIBLE FALSE)\n\
             else()\n\
             \x20 set(PACKAGE_VERSION_COMPATIBLE TRUE)\n\
             endif()\n",
            ver = env!("CARGO_PKG_VERSION")
        ),
    )?;
    Ok(dir)
}

/// Prints what was asked, on one line, in the order of the options' list.
pub fn config(a: &ConfigArgs) -> Result<(), String> {
    let l = layout()?;
    let mut words: Vec<String> = Vec::new();
    if a.cflags {
        words.push(format!("-I{}", l.include.display()));
    }
    if a.libs {
        let d = l.lib.display();
        words.push(format!("-L{d} -Wl,-rpath,{d} -lcudapool"));
    }
    if a.includedir {
        words.push(l.include.display().to_string());
    }
    if a.libdir {
        words.push(l.lib.display().to_string());
    }
    if a.pkgconfigdir {
        words.push(pkgconfig_dir(&l)?.display().to_string());
    }
    if a.cmakedir {
        words.push(cmake_dir(&l)?.display().to_string());
    }
    super::out::outln(&words.join(" "));
    Ok(())
}
