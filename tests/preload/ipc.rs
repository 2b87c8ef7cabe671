//! Preload tests: legacy IPC of pooled blocks, inside a shared segment and in an expandable
//! segment, within one process and across two.

use super::*;

/// Legacy IPC of a block inside a shared segment: the importer gets the block's address (the
/// exporter tags the driver's handle with the block's offset, the importer's cudapool takes it
/// out before the driver sees it), every open and close reaches the driver once per segment.
#[test]
fn an_ipc_import_maps_the_block_not_its_segment() {
    for mode in ["dlsym", "gpa"] {
        for pool in ["none", "split", "binned", "simple"] {
            let r = ranges(mode, "ipc", true, &[("CUDAPOOL_POOL", pool)]);
            let what = format!("{mode} {pool}:\n{}\n{}", r.stdout, r.stderr);
            let l = r.line("ipc");
            for k in ["same_handle", "b_at_block", "a_at_block", "b2_at_block"] {
                assert_eq!(l[k], "1", "{k}: {what}");
            }
            assert_eq!(l["value"], "0x5c", "{what}");
            // Untagged handles go to the driver at each open (b's twice, a's once); under
            // `split` b's tagged handle reaches it once for both.
            let driver_opens = if pool == "split" { "2" } else { "3" };
            assert_eq!(l["opens"], driver_opens, "{what}");
            // Three opens, three closes; a fourth close is the driver's error.
            let c = r.line("closed");
            assert_eq!((&*c["rc"], &*c["opens"]), ("0,0,0,1", "0"), "{what}");
        }
    }
}

/// A tagged handle whose offset was forged is refused (`CUDA_ERROR_INVALID_VALUE`): an offset far
/// past the segment, and one chosen to land on another buffer of the importer (which would
/// have aliased it). Fails at 0a32a2a: both opened with success, and the second one's writes
/// reached the other buffer.
#[test]
fn a_forged_ipc_offset_is_refused() {
    // Both kinds of segments (issue 60, item 8: expandable was not tried): the forged handle is
    // a small block's, and a target in mapped memory must not open through it either.
    for (mode, segments) in [
        ("dlsym", "classic"),
        ("gpa", "classic"),
        ("dlsym", "expandable"),
        ("gpa", "expandable"),
    ] {
        let r = ranges(
            mode,
            "ipc-forged",
            true,
            &[("CUDAPOOL_POOL", "split"), ("CUDAPOOL_SEGMENTS", segments)],
        );
        let what = format!("{mode} {segments}:\n{}\n{}", r.stdout, r.stderr);
        let l = r.line("forged");
        assert_eq!(l["far_rc"], "1", "{what}");
        assert_eq!(l["alias_rc"], "1", "{what}");
        assert_eq!(l["alias_is_c"], "0", "{what}");
        assert_eq!(l["c_byte"], "0xaa", "{what}");
        assert!(r.stderr.contains("forged or damaged handle"), "{what}");
    }
}

/// A large block exports under either kind of segment. Under expandable segments, when the
/// driver will not export the chunks (here made to fail), the export is refused
/// (`CUDA_ERROR_NOT_SUPPORTED`, the driver's error passed on) and the next large block, from
/// a classic segment, exports and imports.
#[test]
fn ipc_of_large_blocks_exports_and_a_refused_one_turns_segments_classic() {
    for mode in ["dlsym", "gpa"] {
        // b_at_block: an open in the exporting process itself gives the block's own address
        // for a driver handle; a mapped block's chunks are mapped again, elsewhere.
        for (segments, faults, a_rc, b_at_block) in [
            ("expandable", "", "0", "0"),
            (
                "expandable",
                "cuMemExportToShareableHandle@1+=801",
                "801",
                "1",
            ),
            ("classic", "", "0", "1"),
        ] {
            let mut env = vec![
                ("CUDAPOOL_POOL", "split"),
                ("CUDAPOOL_SEGMENTS", segments),
                ("CUDAPOOL_REPORT", "stderr"),
            ];
            if !faults.is_empty() {
                env.push(("CUDAPOOL_FAULTS", faults));
            }
            let r = ranges(mode, "ipc-large", true, &env);
            let what = format!("{mode} {segments} {faults}:\n{}\n{}", r.stdout, r.stderr);
            let l = r.line("ipc_large");
            assert_eq!(l["a_rc"], a_rc, "{what}");
            assert_eq!(l["b_rc"], "0", "{what}");
            assert_eq!(l["b_at_block"], b_at_block, "{what}");
            assert_eq!(l["value"], "0x5c", "{what}");
            let refused = a_rc != "0";
            assert_eq!(
                r.stderr
                    .contains("could not share it; large blocks come from classic segments"),
                refused,
                "{what}"
            );
            // The status says which segments the pool was set to take.
            assert_eq!(
                r.stderr.contains("pool split with expandable segments,"),
                segments == "expandable",
                "{what}"
            );
        }
    }
}

/// Legacy IPC of a block of an expandable segment between two processes (the importer a
/// process of its own, under cudapool): the importer sees the exporter's bytes at the address
/// it gets, at the block's start and its end (three chunks), and the exporter sees the
/// importer's writes; opens of one handle share a mapping; an importer without cudapool gets
/// the driver's refusal; the exporter's descriptors go with the memory, after which the old
/// handle is refused, not mapped.
#[test]
fn ipc_of_an_expandable_block_crosses_processes() {
    for mode in ["dlsym", "gpa"] {
        let env = [
            ("CUDAPOOL_POOL", "split"),
            ("CUDAPOOL_SEGMENTS", "expandable"),
        ];
        let r = ranges(mode, "ipc-cross", true, &env);
        let what = format!("{mode}:\n{}\n{}", r.stdout, r.stderr);
        let e = r.line("export");
        assert_eq!(
            (&*e["rc"], &*e["again_rc"], &*e["same_handle"]),
            ("0", "0", "1"),
            "{what}"
        );
        // A table and one descriptor per chunk (5 MiB + 4 KiB: three or four 2 MiB chunks).
        let held: u32 = e["fds_held"].parse().unwrap();
        assert!((4..=5).contains(&held), "{what}");
        let imports: Vec<_> = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("import "))
            .collect();
        assert_eq!(imports.len(), 3, "{what}");
        assert_eq!(
            imports[0], "import open_rc=0 first=0x5c last=0x5c again_rc=0 same=1 closes=0,0,1",
            "{what}"
        );
        // Without cudapool the driver sees a handle it never made.
        assert_ne!(imports[1], "import open_rc=0", "{what}");
        assert!(imports[1].starts_with("import open_rc="), "{what}");
        // After the block was freed and its chunks unmapped, the old handle is refused.
        assert_eq!(imports[2], "import open_rc=1", "{what}");
        let p = r.line("parent");
        assert_eq!(
            (&*p["importer_exit"], &*p["bare_exit"], &*p["value"]),
            ("0", "0", "0x3d"),
            "{what}"
        );
        assert_eq!(r.line("after")["fds_left"], "0", "{what}");
        // The context reset: its arena's chunks and their exports go together.
        let reset = r.line("reset");
        assert_ne!(reset["fds_held"], "0", "{what}");
        assert_eq!(reset["fds_left"], "0", "{what}");
        assert!(r.stderr.contains("the exporter freed the block"), "{what}");
    }
}
