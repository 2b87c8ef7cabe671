//! Reads and writes at an offset (`pread`, `pwrite`) of the files cudapool shares (pages,
//! ledgers, snapshot requests): never through a mapping, so a file cut by someone else costs
//! an error, never a signal; a short transfer is an error, an interrupted one is retried.

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Reads `buf.len()` bytes at `offset` with `pread`, or fails (a short read included: the file
/// was cut while read). Never maps, so a file cut by its owner costs an error, never a signal.
pub fn read_exact_at(fd: libc::c_int, buf: &mut [u8], offset: u64) -> Result<(), String> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: pread into the unfilled rest of `buf`, whose length bounds the read.
        let n = unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(format!("ended after {done} bytes (cut while read)")),
            _ if errno().raw_os_error() == Some(libc::EINTR) => {}
            _ => return Err(format!("read: {}", errno())),
        }
    }
    Ok(())
}

/// Writes all of `bytes` at `offset` with `pwrite`, or fails (a full filesystem included).
/// Never through a mapping, so a file cut by someone else costs an error, never a signal.
pub fn write_all_at(fd: libc::c_int, bytes: &[u8], offset: u64) -> Result<(), String> {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: pwrite from the unwritten rest of `bytes`, whose length bounds the write.
        let n = unsafe {
            libc::pwrite(
                fd,
                bytes[done..].as_ptr().cast(),
                bytes.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(format!("took {done} of {} bytes", bytes.len())),
            _ if errno().raw_os_error() == Some(libc::EINTR) => {}
            _ => return Err(format!("write: {}", errno())),
        }
    }
    Ok(())
}
